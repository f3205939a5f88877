"""Tool calling's request and response bodies, as OpenAI's chat API shapes them.

Request: `tools` (functions with JSON-schema parameters), `tool_choice`, `parallel_tool_calls`, and in
the history assistant messages with `tool_calls` and `tool` messages with the results. Response: a
message's `tool_calls` (arguments as JSON text), and in a stream `delta.tool_calls`, each call's first
piece carrying its id and name and later pieces the arguments' text.
"""

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_serializer

MAX_TOOLS = 256


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class FunctionDefinition(_Strict):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = Field(None, description="a JSON schema of the arguments object")
    strict: bool | None = Field(None, description="accepted; required and named calls are always enforced")


class ToolDefinition(_Strict):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"] = "function"
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class FunctionCall(BaseModel):
    name: str
    arguments: str = Field(description="the arguments object as JSON text")


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class OmitNone(BaseModel):
    """Serialized without its None fields: OpenAI's deltas carry only what they hold."""

    @model_serializer(mode="wrap")
    def _drop_unset(self, handler):
        return {k: v for k, v in handler(self).items() if v is not None}


class DeltaFunctionCall(OmitNone):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(OmitNone):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunctionCall
