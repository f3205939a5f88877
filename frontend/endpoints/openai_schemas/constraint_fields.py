"""The request fields that constrain what a completion may say, as OpenAI and vLLM spell them.

All of them become one StructuredOutputsParams (common/structured_outputs.py), plus allowed_token_ids and
logit_bias: OpenAI's `response_format` (text, json_object, json_schema), vLLM's `structured_outputs`
(json, regex, choice, grammar) and its older `guided_json`, `guided_regex`, `guided_choice`,
`guided_grammar`. A request sets at most one of them; which one it set is the field its errors name.
"""

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from common.errors import InvalidParameter
from common.structured_outputs import StructuredOutputsParams

JsonSchema = dict[str, Any] | str
Bias = Annotated[float, Field(ge=-100, le=100)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, populate_by_name=True)


class JsonSchemaFormat(_Strict):
    name: str = Field("response", max_length=256, description="the schema's name (OpenAI requires one)")
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema", description="the JSON schema the output follows")
    strict: bool | None = Field(None, description="accepted; the schema is always enforced")


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputsField(_Strict):
    json_: JsonSchema | None = Field(None, alias="json", description="a JSON schema")
    json_object: bool | None = Field(None, description="any JSON object")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = Field(None, description="a Lark grammar (llguidance's dialect) or a GBNF one")


class ConstraintFields(_Strict):
    response_format: ResponseFormat | None = Field(None, description="OpenAI: text, json_object or json_schema")
    structured_outputs: StructuredOutputsField | None = Field(None, description="vLLM: json, regex, choice, grammar")
    guided_json: JsonSchema | None = Field(None, description="vLLM (older): a JSON schema")
    guided_regex: str | None = Field(None, description="vLLM (older)")
    guided_choice: list[str] | None = Field(None, description="vLLM (older)")
    guided_grammar: str | None = Field(None, description="vLLM (older)")
    logit_bias: dict[int, Bias] | None = Field(None, description="token id -> bias added to its logit, in [-100, 100]")
    allowed_token_ids: list[Annotated[int, Field(ge=0)]] | None = Field(
        None, description="vLLM: only these tokens may be sampled")

    def constraint(self) -> tuple[StructuredOutputsParams | None, str | None]:
        """The one constraint the request set and the field that set it (None, None: none)."""
        found = []
        rf = self.response_format
        if rf is not None and rf.type == "json_object":
            found.append((StructuredOutputsParams(json_object=True), "response_format"))
        elif rf is not None and rf.type == "json_schema":
            if rf.json_schema is None or rf.json_schema.schema_ is None:
                missing = "response_format.json_schema" + (".schema" if rf.json_schema is not None else "")
                raise InvalidParameter(missing, "response_format of type json_schema needs json_schema.schema")
            found.append((StructuredOutputsParams(json=rf.json_schema.schema_), "response_format.json_schema.schema"))
        so = self.structured_outputs
        if so is not None:
            found.append((StructuredOutputsParams(json=so.json_, json_object=bool(so.json_object), regex=so.regex,
                                                  choice=so.choice, grammar=so.grammar), None))
        for name, kind in (("guided_json", "json"), ("guided_regex", "regex"), ("guided_choice", "choice"),
                           ("guided_grammar", "grammar")):
            if getattr(self, name) is not None:
                found.append((StructuredOutputsParams(**{kind: getattr(self, name)}), name))
        if len(found) > 1:
            names = [f or "structured_outputs" for _, f in found]
            raise InvalidParameter(names[1], f"a request may set one output constraint; it set {', '.join(names)}")
        return found[0] if found else (None, None)
