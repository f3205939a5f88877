"""POST /v1/chat/completions: its request body and its answer, whole or as stream events."""

import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from common.errors import InvalidParameter
from common.sampling_params import SamplingParams
from frontend.endpoints.openai_schemas.answer_fields import PromptLogprob, UsageInfo
from frontend.endpoints.openai_schemas.body_types import at_most
from frontend.endpoints.openai_schemas.messages import ChatMessage
from frontend.endpoints.openai_schemas.openai_fields import OpenAIChatFields
from frontend.endpoints.openai_schemas.prompt_fields import MAX_MESSAGES
from frontend.endpoints.openai_schemas.sampling_fields import SamplingFields
from frontend.endpoints.openai_schemas.tool_schemas import (MAX_TOOLS, DeltaFunctionCall, DeltaToolCall, FunctionCall,
                                                            NamedToolChoice, OmitNone, ToolCall, ToolChoice,
                                                            ToolDefinition)


class ChatCompletionRequest(OpenAIChatFields, SamplingFields):
    messages: Annotated[list[ChatMessage], at_most(MAX_MESSAGES, "messages")] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1, description="deprecated by OpenAI for max_completion_tokens")
    max_completion_tokens: int | None = Field(None, ge=1, description="tokens to generate; null: up to max_model_len")
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20, description="needs logprobs: true")
    add_generation_prompt: bool = Field(True, description="end the prompt with the assistant turn's header")
    tools: Annotated[list[ToolDefinition] | None, at_most(MAX_TOOLS, "tools")] = None
    tool_choice: ToolChoice | None = Field(None, description="none, auto (the default with tools), required, or "
                                                             "a named function")
    parallel_tool_calls: bool = Field(True, description="required: allow several calls in one answer")
    chat_template_kwargs: dict[str, Any] | None = Field(
        None, description="vLLM extension: extra variables for the chat template (enable_thinking, ...)")

    def to_sampling_params(self) -> SamplingParams:
        max_tokens = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        return self._sampling_params(max_tokens, (self.top_logprobs or 0) if self.logprobs else None)

    @property
    def max_tokens_field(self) -> str:
        """The field that set the output length, as errors name it."""
        return "max_tokens" if self.max_completion_tokens is None and self.max_tokens is not None \
            else "max_completion_tokens"

    @property
    def legacy_functions(self) -> bool:
        """Tools given in OpenAI's deprecated form: answers name the call in `function_call` too."""
        return self.functions is not None

    def tool_definitions(self) -> list[ToolDefinition]:
        """`tools`, or OpenAI's deprecated `functions` as function tools."""
        if self.functions is None:
            return list(self.tools or [])
        if self.tools is not None:
            raise InvalidParameter("functions", "functions is OpenAI's deprecated form of tools; send one of them")
        return [ToolDefinition(function=f) for f in self.functions]

    def tool_choice_option(self) -> ToolChoice | None:
        """`tool_choice`, or OpenAI's deprecated `function_call` as it."""
        if self.function_call is None:
            return self.tool_choice
        if self.tool_choice is not None:
            raise InvalidParameter("function_call", "function_call is OpenAI's deprecated form of tool_choice; send "
                                                    "one of them")
        if isinstance(self.function_call, str):
            return self.function_call
        return NamedToolChoice(function=self.function_call)


class ChatTopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(ChatTopLogprob):
    top_logprobs: list[ChatTopLogprob] = []


class ChatChoiceLogprobs(BaseModel):
    content: list[ChatTokenLogprob] | None = None


class ChatResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] = []
    function_call: FunctionCall | None = Field(None, description="the call, when the request sent `functions`")


class ChatChoice(BaseModel):
    index: int
    message: ChatResponseMessage
    logprobs: ChatChoiceLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo | None = None
    service_tier: str = Field("default", description="how it was served: always as OpenAI's default tier")
    # vLLM's field, with `prompt_logprobs` in the request: per prompt token (null for the first), token id -> logprob
    prompt_logprobs: list[dict[int, PromptLogprob] | None] | None = None


class DeltaMessage(OmitNone):
    """{"role": ...} first, then {"content": ...}, {"reasoning_content": ...} or {"tool_calls": [...]}."""
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None
    function_call: DeltaFunctionCall | None = None  # when the request sent `functions`


class ChatStreamChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatChoiceLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionStreamResponse(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatStreamChoice]
    usage: UsageInfo | None = None
    service_tier: str = Field("default", description="how it was served: always as OpenAI's default tier")
