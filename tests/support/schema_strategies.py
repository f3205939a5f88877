"""Hypothesis strategies for the JSON bodies a pydantic model's JSON schema allows (a helper module, not a test
module): the subset of JSON schema pydantic writes ($ref, anyOf/oneOf, enum/const, bounded numbers, strings
with lengths and patterns, arrays, objects with required and optional properties, free-form dicts).

hypothesis-jsonschema would be the library for this, but its last release (0.23.1) calls a Hypothesis internal
that Hypothesis 6.1xx no longer has (`many.more`), so every draw fails. Sizes are kept small on purpose: the
fuzz is about shapes and combinations, and each body is sent to a real server.
"""

from hypothesis import strategies as st

MAX_ITEMS = 4
MAX_CHARS = 12

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-1000, 1000) | st.floats(allow_nan=False, allow_infinity=False, width=32)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6)


def from_model(model, overrides: dict | None = None, required: tuple = ()) -> st.SearchStrategy[dict]:
    """Bodies for `model` (a pydantic class); `overrides` replaces the schema of those of its top-level properties
    the model has, `required` makes optional top-level properties always present."""
    schema = model.model_json_schema()
    schema["properties"] = {name: (overrides or {}).get(name, sub) for name, sub in schema["properties"].items()}
    schema["required"] = sorted(set(schema.get("required", [])) | (set(required) & set(schema["properties"])))
    return _strategy(schema, schema.get("$defs", {}))


def _strategy(schema: dict, defs: dict) -> st.SearchStrategy:
    if "$ref" in schema:
        return st.deferred(lambda: _strategy(defs[schema["$ref"].rsplit("/", 1)[1]], defs))
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return st.one_of([_strategy(option, defs) for option in schema[key]])
    if "allOf" in schema and len(schema["allOf"]) == 1:
        return _strategy(schema["allOf"][0], defs)
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    kind = schema.get("type")
    if kind == "null":
        return st.none()
    if kind == "boolean":
        return st.booleans()
    if kind == "integer":
        low = schema.get("minimum", schema.get("exclusiveMinimum", -2**63 - 1) + 1)
        high = schema.get("maximum", schema.get("exclusiveMaximum", 2**63) - 1)
        return st.integers(low, high)
    if kind == "number":
        return st.floats(schema.get("minimum", schema.get("exclusiveMinimum")),
                         schema.get("maximum", schema.get("exclusiveMaximum")),
                         exclude_min="exclusiveMinimum" in schema, exclude_max="exclusiveMaximum" in schema,
                         allow_nan=False, allow_infinity=False)
    if kind == "string":
        if "pattern" in schema:
            text = st.from_regex(schema["pattern"], fullmatch=True)
            return text.filter(lambda s: schema.get("minLength", 0) <= len(s) <= schema.get("maxLength", MAX_CHARS))
        return st.text(min_size=schema.get("minLength", 0),
                       max_size=min(schema.get("maxLength", MAX_CHARS), max(MAX_CHARS, schema.get("minLength", 0))))
    if kind == "array":
        items = _strategy(schema.get("items", {}), defs)
        low = schema.get("minItems", 0)
        return st.lists(items, min_size=low, max_size=min(schema.get("maxItems", MAX_ITEMS), max(MAX_ITEMS, low)))
    if kind == "object" or "properties" in schema:
        return _object(schema, defs)
    return JSON_VALUES  # {}: any JSON value


def _object(schema: dict, defs: dict) -> st.SearchStrategy[dict]:
    properties = schema.get("properties", {})
    if not properties:
        extra = schema.get("additionalProperties", True)
        values = JSON_VALUES if extra is True else _strategy(extra, defs)
        return st.dictionaries(st.text(max_size=MAX_CHARS), values, max_size=MAX_ITEMS)
    required = set(schema.get("required", []))

    @st.composite
    def build(draw) -> dict:
        out = {}
        for name, sub in properties.items():
            if name in required or draw(st.integers(0, 5)) == 5:  # an optional field in one body of six
                out[name] = draw(_strategy(sub, defs))
        return out
    return build()
