"""The bodies of OpenAI's Responses API (`POST /v1/responses`), as pydantic models.

Request: `input` (a text, or items: messages with input_text parts, earlier output messages, function_call and
function_call_output items, reasoning items), `instructions`, `max_output_tokens`, `temperature`, `top_p`,
function `tools` with `tool_choice`, `text.format` (text, json_object, json_schema), `reasoning.effort`, `stream`.
nvllm keeps no responses: `store: true`, `previous_response_id`, `conversation`, `background: true` and
`item_reference` items are refused with a 400 that says so. A few of vLLM's sampling extensions are taken as
the chat API takes them (same names, same limits). The response's body is in objects.py.
"""

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Discriminator, Field, Tag
from pydantic_core import PydanticCustomError

from common.sampling_params import MAX_SCALE
from frontend.endpoints.chat.schemas import ChatCompletionRequest
from frontend.endpoints.openai_schemas.body_types import StrictModel, Text, at_most
from frontend.endpoints.openai_schemas.messages import MAX_CONTENT_PARTS, part_refuser
from frontend.endpoints.openai_schemas.openai_fields import REASONING_EFFORTS
from frontend.endpoints.openai_schemas.prompt_fields import MAX_MESSAGES
from frontend.endpoints.openai_schemas.tool_schemas import MAX_TOOLS, FunctionDefinition

STATELESS = "nvllm's /v1/responses is stateless: it stores no responses"


def _refused(why: str, allowed=(None, False)):
    """A before-validator refusing any value but `allowed` ones, saying why (errors.py shows the text as it is)."""
    def check(value):
        if not any(value is a or (a is not None and value == a) for a in allowed):
            raise PydanticCustomError("unsupported", why)
        return value
    return BeforeValidator(check)


UNSUPPORTED_PARTS = {
    "input_image": "image input is not supported: nvllm serves text-only models",
    "input_file": "file input is not supported: send the file's text as an input_text part",
    "input_audio": "audio input is not supported: nvllm serves text-only models",
}


# ---- input items ---------------------------------------------------------------------------------

class InputText(StrictModel):
    type: Literal["input_text"]
    text: Text


class OutputText(StrictModel):
    """Text of an earlier answer (a response's output sent back as input)."""
    type: Literal["output_text"]
    text: Text
    annotations: list[dict[str, Any]] | None = None
    logprobs: list[dict[str, Any]] | None = None


class Refusal(StrictModel):
    type: Literal["refusal"]
    refusal: Text


ContentPart = Annotated[Annotated[InputText | OutputText | Refusal, Field(discriminator="type")],
                        BeforeValidator(part_refuser(UNSUPPORTED_PARTS))]


class MessageItem(StrictModel):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: Text | Annotated[list[ContentPart], at_most(MAX_CONTENT_PARTS, "content")]
    id: Text | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None
    phase: Literal["commentary", "final_answer"] | None = None

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "\n".join(p.refusal if isinstance(p, Refusal) else p.text for p in self.content)


class FunctionCallItem(StrictModel):
    """A call the model made earlier (from an earlier response's output)."""
    type: Literal["function_call"]
    call_id: Text
    name: Text
    arguments: Text
    id: Text | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


class FunctionCallOutputItem(StrictModel):
    """The result of a call, given back to the model."""
    type: Literal["function_call_output"]
    call_id: Text
    output: Text | Annotated[list[InputText], at_most(MAX_CONTENT_PARTS, "output")]
    id: Text | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None

    def text(self) -> str:
        return self.output if isinstance(self.output, str) else "\n".join(p.text for p in self.output)


class SummaryText(StrictModel):
    type: Literal["summary_text"]
    text: Text


class ReasoningText(StrictModel):
    type: Literal["reasoning_text"]
    text: Text


class ReasoningInputItem(StrictModel):
    """Earlier reasoning, as a response gave it: accepted and left out of the prompt (chat templates drop
    earlier turns' reasoning too)."""
    type: Literal["reasoning"]
    id: Text | None = None
    summary: list[SummaryText] = []
    content: list[ReasoningText] | None = None
    encrypted_content: Annotated[Text | None, _refused(
        "encrypted_content: nvllm gives no encrypted reasoning, so it cannot take any back")] = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


class ItemReference(StrictModel):
    type: Literal["item_reference"]
    id: Annotated[Any, _refused(f"item_reference: {STATELESS}, so no item can be referred to by id; send the item "
                                "itself", allowed=())]


def _item_kind(value) -> str:
    return value.get("type", "message") if isinstance(value, dict) else "message"


InputItem = Annotated[Annotated[MessageItem, Tag("message")] | Annotated[FunctionCallItem, Tag("function_call")]
                      | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
                      | Annotated[ReasoningInputItem, Tag("reasoning")]
                      | Annotated[ItemReference, Tag("item_reference")], Discriminator(_item_kind)]


# ---- tools and formats ---------------------------------------------------------------------------

def _function_tools_only(value):
    if isinstance(value, list):
        for i, tool in enumerate(value):
            kind = tool.get("type") if isinstance(tool, dict) else None
            if kind != "function":
                raise PydanticCustomError("unsupported", f"tools[{i}].type {kind!r} is not supported: nvllm runs no "
                                                         "built-in tools; define a function tool")
    return value


class FunctionTool(FunctionDefinition):
    """Responses' function tool: the chat API's function definition, not nested under `function`."""
    type: Literal["function"]


class NamedFunctionChoice(StrictModel):
    type: Literal["function"]
    name: Text


class TextFormatPlain(StrictModel):
    type: Literal["text"]


class TextFormatJsonObject(StrictModel):
    type: Literal["json_object"]


class TextFormatJsonSchema(StrictModel):
    type: Literal["json_schema"]
    name: Text = Field("response", max_length=256)
    schema_: dict[str, Any] = Field(alias="schema", description="the JSON schema the output text follows")
    description: Text | None = None
    strict: bool | None = Field(None, description="accepted; the schema is always enforced")

    model_config = dict(StrictModel.model_config, populate_by_name=True)


class TextConfig(StrictModel):
    format: Annotated[TextFormatPlain | TextFormatJsonObject | TextFormatJsonSchema, Field(discriminator="type")] = \
        TextFormatPlain(type="text")
    verbosity: Literal["low", "medium", "high"] | None = Field(None, description="accepted and ignored")


class ReasoningConfig(StrictModel):
    effort: Literal[REASONING_EFFORTS] | None = Field(
        None, description="a reasoning template's thinking switch, as the chat API's reasoning_effort")
    summary: Literal["auto", "concise", "detailed"] | None = Field(
        None, description="accepted; reasoning comes back whole, as reasoning_text content")
    generate_summary: Literal["auto", "concise", "detailed"] | None = None


class ResponsesStreamOptions(StrictModel):
    include_obfuscation: bool | None = Field(None, description="accepted and ignored (nothing is obfuscated)")


def _as_chat(name: str):
    """A vLLM extension field declared exactly as the chat API declares it (same type and limits)."""
    info = ChatCompletionRequest.model_fields[name]
    return Annotated[info.annotation, info]


class ResponsesRequest(StrictModel):
    model: Text | None = Field(None, description="the served model name (see /v1/models); omitted: that model")
    input: Text | Annotated[list[InputItem], at_most(MAX_MESSAGES, "input")] = Field(
        description="a user message's text, or items: messages, function_call and function_call_output items")
    instructions: Text | None = Field(None, description="a system message put before the input")
    max_output_tokens: int | None = Field(None, ge=1, description="tokens to generate; null: up to max_model_len")
    temperature: float | None = Field(None, ge=0, le=MAX_SCALE, description="0 is greedy; default 1")
    top_p: float | None = Field(None, gt=0, le=1, description="nucleus sampling; default 1")
    tools: Annotated[list[FunctionTool] | None, at_most(MAX_TOOLS, "tools"),
                     BeforeValidator(_function_tools_only)] = None
    tool_choice: Literal["none", "auto", "required"] | NamedFunctionChoice | None = Field(
        None, description="none, auto (the default with tools), required, or {type: function, name}")
    parallel_tool_calls: bool | None = Field(None, description="required: allow several calls in one answer")
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    stream: bool = False
    stream_options: ResponsesStreamOptions | None = None
    metadata: dict[Text, Text] | None = Field(None, description="string pairs, logged with the request id")
    user: Text | None = Field(None, description="accepted and ignored")
    safety_identifier: Text | None = Field(None, max_length=128, description="accepted and ignored")
    prompt_cache_key: Text | None = Field(None, description="accepted and ignored: prefix caching needs no key")
    service_tier: Literal["auto", "default", "flex", "scale", "priority", "fast"] | None = None
    include: list[Text] | None = Field(None, description="accepted; nothing optional is held back")
    truncation: Annotated[Literal["disabled"] | None, _refused(
        "truncation auto is not supported: nvllm never drops input to make it fit (send disabled or leave it out)",
        allowed=(None, "disabled"))] = None
    store: Annotated[bool | None, _refused(
        f"store: {STATELESS} (send store: false or leave it out)")] = None
    previous_response_id: Annotated[Text | None, _refused(
        f"previous_response_id: {STATELESS}; send the earlier turns in input instead")] = None
    conversation: Annotated[Any, _refused(
        f"conversation: {STATELESS}; send the earlier turns in input instead")] = None
    background: Annotated[bool | None, _refused(
        f"background: {STATELESS}, so it cannot run a response in the background")] = None
    # vLLM's extensions, as the chat API takes them
    top_k: _as_chat("top_k")
    min_p: _as_chat("min_p")
    seed: _as_chat("seed")
    stop: _as_chat("stop")
    repetition_penalty: _as_chat("repetition_penalty")
    structured_outputs: _as_chat("structured_outputs")
    chat_template_kwargs: _as_chat("chat_template_kwargs")
    cache_salt: _as_chat("cache_salt")


VLLM_EXTENSIONS = ("top_k", "min_p", "seed", "stop", "repetition_penalty", "structured_outputs",
                   "chat_template_kwargs", "cache_salt")
