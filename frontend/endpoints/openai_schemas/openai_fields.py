"""OpenAI's own request fields that are not sampling settings, and what nvllm does with each, so a client
configured for OpenAI (LiteLLM, the Agents SDK, LangChain) works on its first call.

Honoured: `reasoning_effort` (a reasoning template's thinking switch, and the template variable of that
name), `metadata` (logged with the request id), `functions` / `function_call` (OpenAI's deprecated names for
tools and tool_choice). Accepted and ignored, since nothing here depends on them: `store` (nothing is
stored), `service_tier` (answers say "default"), `prediction` (a latency hint), `verbosity` (a hint open
models have no control for), `prompt_cache_key` / `prompt_cache_retention` / `prompt_cache_options` (the
prefix cache needs no key and keeps blocks until it needs the room), `safety_identifier`; on completions
`best_of` equal to n. Refused with a 400 naming the field, because the answer would differ and cannot be
given: audio output (`modalities` with "audio", `audio`), `web_search_options`, `moderation`, `suffix`,
`best_of` above n. Fields OpenAI does not document stay refused (body_types.StrictModel).
"""

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field

from frontend.endpoints.openai_schemas.body_types import StrictModel, Text, at_most, null_only, shape_error
from frontend.endpoints.openai_schemas.messages import MAX_CONTENT_PARTS, TextContentPart
from frontend.endpoints.openai_schemas.tool_schemas import MAX_TOOLS, FunctionDefinition, NamedFunction

MAX_METADATA_PAIRS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512  # OpenAI's limits
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
NO_THINKING_EFFORTS = ("none", "minimal")


def _metadata(value: dict[str, str]) -> dict[str, str]:
    if len(value) > MAX_METADATA_PAIRS:
        raise shape_error(f"metadata has {len(value)} pairs, more than {MAX_METADATA_PAIRS}")
    for key, text in value.items():
        if len(key) > MAX_METADATA_KEY:
            raise shape_error(f"metadata key {key[:20]!r}... is longer than {MAX_METADATA_KEY} characters")
        if len(text) > MAX_METADATA_VALUE:
            raise shape_error(f"metadata[{key!r}] is longer than {MAX_METADATA_VALUE} characters")
    return value


def _text_only(modalities: list[str]) -> list[str]:
    if "audio" in modalities:
        raise shape_error('modalities: audio output is not supported (nvllm serves text-only models); send ["text"]')
    return modalities


class Prediction(StrictModel):
    type: Literal["content"]
    content: Text | Annotated[list[TextContentPart], at_most(MAX_CONTENT_PARTS, "prediction.content")]


class OpenAIChatFields(StrictModel):
    store: bool | None = Field(None, description="accepted and ignored: nvllm stores nothing")
    metadata: Annotated[dict[Text, Text] | None, AfterValidator(lambda v: v if v is None else _metadata(v))] = Field(
        None, description=f"up to {MAX_METADATA_PAIRS} string pairs; logged with the request id")
    service_tier: Literal["auto", "default", "flex", "scale", "priority", "fast"] | None = Field(
        None, description='accepted; every request is served the same way, and answers say "default"')
    reasoning_effort: Literal[REASONING_EFFORTS] | None = Field(
        None, description="a reasoning template's thinking switch: none and minimal turn thinking off, the "
                          "others on; also given to the template as `reasoning_effort`")
    verbosity: Literal["low", "medium", "high"] | None = Field(None, description="accepted and ignored")
    prediction: Prediction | None = Field(None, description="accepted and ignored (a latency hint only)")
    modalities: Annotated[list[Literal["text", "audio"]] | None,
                          AfterValidator(lambda v: v if v is None else _text_only(v))] = Field(
        None, description='["text"] only')
    audio: Annotated[dict[str, Any] | None, null_only(
        "audio: audio output is not supported: nvllm serves text-only models (leave audio out)")] = None
    web_search_options: Annotated[dict[str, Any] | None, null_only(
        "web_search_options: web search is not supported: nvllm has no search tool (define a function tool "
        "instead)")] = None
    moderation: Annotated[dict[str, Any] | None, null_only(
        "moderation: not supported: nvllm runs no moderation model")] = None
    prompt_cache_key: Text | None = Field(None, description="accepted and ignored: prefix caching needs no key")
    prompt_cache_retention: Literal["in_memory", "24h"] | None = Field(None, description="accepted and ignored")
    prompt_cache_options: dict[str, Any] | None = Field(None, description="accepted and ignored")
    safety_identifier: Text | None = Field(None, max_length=128, description="accepted and ignored")
    functions: Annotated[list[FunctionDefinition] | None, at_most(MAX_TOOLS, "functions")] = Field(
        None, description="deprecated by OpenAI for tools; taken as function tools")
    function_call: Literal["none", "auto"] | NamedFunction | None = Field(
        None, description="deprecated by OpenAI for tool_choice; taken as it")


def _no_suffix(value: str | None) -> str | None:
    if value:
        raise shape_error("suffix is not supported: nvllm completes text after the prompt only (no insertion)")
    return value


class OpenAICompletionFields(StrictModel):
    best_of: int | None = Field(None, ge=1, description="accepted when equal to n (completions are not ranked)")
    suffix: Annotated[Text | None, AfterValidator(_no_suffix)] = Field(
        None, description="refused unless empty: nvllm does not fill in text between a prompt and a suffix")
