"""Request and response bodies of the HTTP API, as pydantic models (so /openapi.json is the truth).

Field names and shapes follow OpenAI's API; the extra sampling fields (top_k, min_p, ...) are
vLLM's. Ranges are declared here so the schema shows them; SamplingParams.validate() checks the
same limits again (and the cross-field ones) before a request reaches the engine.
Unknown fields are refused (400 naming the field) rather than silently ignored.
"""

import time
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_serializer

from common.sampling_params import RequestOutputKind, SamplingParams


INT32_MAX = 2**31 - 1
TokenId = Annotated[int, Field(ge=0, le=INT32_MAX)]


def _utf8(text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid UTF-8 text (it holds a lone surrogate)") from None
    return text


Text = Annotated[str, AfterValidator(_utf8)]  # what the tokenizer and the wire can take


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ---- errors -------------------------------------------------------------------------------------

class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorInfo


# ---- sampling fields shared by completions and chat ---------------------------------------------

class StreamOptions(StrictModel):
    include_usage: bool = Field(False, description="send a last chunk with the token usage")


class SamplingFields(StrictModel):
    model: Text | None = Field(None, description="the served model name (see /v1/models); omitted: that model")
    n: int = Field(1, ge=1, description="completions per prompt")
    temperature: float | None = Field(None, ge=0, description="0 is greedy; default 1")
    top_p: float | None = Field(None, gt=0, le=1, description="nucleus sampling; default 1")
    top_k: int | None = Field(None, ge=-1, le=INT32_MAX, description="vLLM extension: keep the k most likely tokens; -1 or 0: off")
    min_p: float | None = Field(None, ge=0, le=1, description="vLLM extension: drop tokens below min_p x the top one")
    seed: int | None = Field(None, ge=0, lt=2**63, description="per-request seed; same seed, same output")
    stop: Text | list[Text] | None = Field(None, description="stop strings (not included in the text)")
    stop_token_ids: list[TokenId] | None = Field(None, description="vLLM extension: token ids that end the completion")
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    repetition_penalty: float | None = Field(None, gt=0, description="vLLM extension; 1 is off")
    ignore_eos: bool = Field(False, description="vLLM extension: keep going past EOS until max_tokens")
    min_tokens: int = Field(0, ge=0, le=INT32_MAX, description="vLLM extension: no EOS or stop before this many tokens")
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: Text | None = Field(None, description="accepted and ignored")

    def _sampling_params(self, max_tokens: int | None, logprobs: int | None) -> SamplingParams:
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return SamplingParams(
            n=self.n,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=0 if self.top_k in (None, -1) else self.top_k,
            min_p=0.0 if self.min_p is None else self.min_p,
            seed=self.seed,
            max_tokens=max_tokens,
            min_tokens=self.min_tokens,
            stop=stop,
            stop_token_ids=list(self.stop_token_ids or []),
            ignore_eos=self.ignore_eos,
            include_stop_str_in_output=self.include_stop_str_in_output,
            repetition_penalty=1.0 if self.repetition_penalty is None else self.repetition_penalty,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            logprobs=logprobs,
            skip_special_tokens=self.skip_special_tokens,
            output_kind=RequestOutputKind.DELTA,  # streamed as is, or joined for a whole response
        )

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class UsageInfo(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


# ---- /v1/completions ----------------------------------------------------------------------------

class CompletionRequest(SamplingFields):
    prompt: Text | list[int] | list[Text] | list[list[int]] = Field(
        description="a string, a list of strings, a list of token ids, or a list of lists of token ids")
    max_tokens: int | None = Field(16, ge=1, description="tokens to generate; null: up to max_model_len")
    logprobs: int | None = Field(None, ge=0, le=20, description="log probabilities of the sampled and top-N tokens")
    echo: bool = Field(False, description="prepend the prompt to the text (its tokens get null logprobs)")

    def to_sampling_params(self) -> SamplingParams:
        return self._sampling_params(self.max_tokens, self.logprobs)


class CompletionLogprobs(BaseModel):
    tokens: list[str] = []
    token_logprobs: list[float | None] = []
    top_logprobs: list[dict[str, float] | None] = []
    text_offset: list[int] = []


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = Field(None, description="the stop string or token id that ended it")


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None


class CompletionStreamResponse(CompletionResponse):
    """One Server-Sent Event of a streamed completion (the same object as OpenAI's)."""


# ---- /v1/chat/completions -----------------------------------------------------------------------

class TextContentPart(StrictModel):
    type: Literal["text"]
    text: Text


class ChatMessage(StrictModel):
    role: Literal["system", "developer", "user", "assistant"]
    content: Text | list[TextContentPart] | None = None
    name: Text | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "\n".join(part.text for part in self.content)
        return self.content or ""


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1, description="deprecated by OpenAI for max_completion_tokens")
    max_completion_tokens: int | None = Field(None, ge=1, description="tokens to generate; null: up to max_model_len")
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20, description="needs logprobs: true")
    add_generation_prompt: bool = Field(True, description="end the prompt with the assistant turn's header")

    def to_sampling_params(self) -> SamplingParams:
        max_tokens = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        return self._sampling_params(max_tokens, (self.top_logprobs or 0) if self.logprobs else None)


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


class DeltaMessage(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None

    @model_serializer(mode="wrap")
    def _drop_unset(self, handler):
        # OpenAI's deltas carry only what they hold: {"role": ...} first, then {"content": ...}
        return {k: v for k, v in handler(self).items() if v is not None}


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


# ---- /v1/models, /tokenize, /detokenize, /version, /health --------------------------------------

class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "nvllm"
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class TokenizeCompletionRequest(StrictModel):
    model: Text | None = None
    prompt: Text
    add_special_tokens: bool = True


class TokenizeChatRequest(StrictModel):
    model: Text | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    add_generation_prompt: bool = True


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]


class DetokenizeRequest(StrictModel):
    model: Text | None = None
    tokens: list[int]


class DetokenizeResponse(BaseModel):
    prompt: str


class VersionResponse(BaseModel):
    version: str


class HealthResponse(BaseModel):
    status: Literal["ok"] = "ok"
