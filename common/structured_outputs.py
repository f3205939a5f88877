"""A request's output constraint: what it is on the wire, and the one grammar text both services make of it.

A request carries at most one constraint: a JSON schema, any JSON object, a regex, a choice among
strings, or a grammar (llguidance's Lark dialect, or GBNF as llama.cpp writes it). llguidance turns
each into one grammar text; the frontend checks it (a 400 quoting the library's reason) and the engine
core compiles the same text against the model's vocabulary (engine_core/structured_outputs/).

llguidance needs no torch, so the frontend may import this module; it is imported on first use only,
so a service that never sees a constraint never loads it.
"""

import json
from collections import OrderedDict
from threading import Lock

import msgspec

from common.errors import InvalidParameter

KINDS = ("json", "json_object", "regex", "choice", "grammar")
ANY_JSON_OBJECT = '{"type": "object"}'


class StructuredOutputsParams(msgspec.Struct, array_like=True, omit_defaults=True, kw_only=True):
    json: str | dict | None = None  # a JSON schema (a dict, or its JSON text)
    json_object: bool = False  # any JSON object
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None  # Lark (llguidance's dialect) or GBNF
    # the constraint applies only after the output holds these tokens (the end of a reasoning section);
    # empty: from the first generated token
    starts_after_token_ids: list[int] = []

    def __post_init__(self):
        if isinstance(self.json, dict):  # one text per schema: the cache key and what goes on the wire
            self.json = json.dumps(self.json, ensure_ascii=False)

    def kinds(self) -> list[str]:
        return [k for k in KINDS if getattr(self, k) not in (None, False)]

    def key(self) -> tuple[str, str]:
        """(kind, text): what a compiled grammar is cached by."""
        kind = self.kinds()[0]
        if kind == "json_object":
            return "json", ANY_JSON_OBJECT
        if kind == "choice":
            return "choice", json.dumps(self.choice, ensure_ascii=False)
        return kind, getattr(self, kind)


def grammar_text(kind: str, text: str) -> str:
    """llguidance's grammar for a constraint; raises ValueError for text it cannot read at all."""
    import llguidance
    fmt = {"json": "json_schema", "grammar": "grammar", "regex": "regex", "choice": "choice"}[kind]
    return llguidance.grammar_from(fmt, text)


_checked: "OrderedDict[tuple[str, str], str]" = OrderedDict()  # key -> "" (fine) or llguidance's reason
_checked_lock = Lock()
_CHECKED_ENTRIES = 512


def constraint_error(kind: str, text: str) -> str:
    """"" when llguidance can compile the constraint, else its reason. Remembered: a client that sends the
    same schema with every request pays for one check."""
    key = (kind, text)
    with _checked_lock:
        if key in _checked:
            _checked.move_to_end(key)
            return _checked[key]
    try:
        import llguidance
        reason = llguidance.LLMatcher.validate_grammar(grammar_text(kind, text))
    except (ValueError, TypeError) as e:
        reason = str(e)
    with _checked_lock:
        _checked[key] = reason
        if len(_checked) > _CHECKED_ENTRIES:
            _checked.popitem(last=False)
    return reason


def check_structured_outputs(params: StructuredOutputsParams | None, max_chars: int, compile: bool,
                             field: str | None = None) -> None:
    """Raises InvalidParameter naming the field (`field`: what the caller's API calls the constraint, such
    as response_format.json_schema.schema; else structured_outputs.<kind>): more than one constraint, one
    too long, or (compile: the frontend's check, off the engine's busy loop) one llguidance cannot
    compile, quoting its reason."""
    if params is None:
        return
    kinds = params.kinds()
    if len(kinds) != 1:
        raise InvalidParameter("structured_outputs", f"structured_outputs must set exactly one of {', '.join(KINDS)}; "
                                                     f"got {', '.join(kinds) if kinds else 'none'}")
    kind, text = params.key()
    where = field or f"structured_outputs.{kinds[0]}"
    if kind == "choice" and (not params.choice or not all(params.choice)):
        raise InvalidParameter(where, f"{where} must be a non-empty list of non-empty strings")
    if len(text) > max_chars:
        raise InvalidParameter(where, f"{where} is {len(text)} characters long; at most {max_chars} are allowed "
                                      f"(--max-constraint-chars)")
    reason = constraint_error(kind, text) if compile else ""
    if reason:
        raise InvalidParameter(where, f"{where} cannot be compiled: {reason.strip()[:2000]}")
