"""Request and response bodies of the HTTP API, as pydantic models (so /openapi.json is the truth).

Field names and shapes follow OpenAI's API; the extra sampling fields (top_k, min_p, ...) are
vLLM's. Ranges are declared here so the schema shows them; SamplingParams.validate() checks the
same limits again (and the cross-field ones) before a request reaches the engine.
Unknown fields are refused (400 naming the field) rather than silently ignored.
"""

import time
from typing import Annotated, Any, Literal

import msgspec
from pydantic import BaseModel, Discriminator, Field, PlainValidator, Tag

from common.beam_search_params import BeamSearchParams
from common.errors import InvalidParameter
from common.sampling_params import MAX_SCALE, RequestOutputKind, SamplingParams
from frontend.endpoints.openai_schemas.constraint_fields import ConstraintFields
from frontend.endpoints.openai_schemas.messages import ChatMessage
from frontend.endpoints.openai_schemas.openai_fields import OpenAIChatFields, OpenAICompletionFields
from frontend.endpoints.openai_schemas.tool_schemas import (MAX_TOOLS, DeltaFunctionCall, DeltaToolCall, FunctionCall,
                                                            NamedToolChoice, OmitNone, ToolCall, ToolChoice,
                                                            ToolDefinition)
from frontend.endpoints.openai_schemas.body_types import StrictModel, Text, at_most, shape_error


INT32_MAX = 2**31 - 1
TokenId = Annotated[int, Field(ge=0, le=INT32_MAX)]


# Caps on element counts, checked before any element is looked at; a body is at most
# --max-request-body-bytes anyway, these keep the work per request small and bounded.
MAX_PROMPTS = 1024  # strings or token-id lists in one `prompt` (and prompts x n, see state.py)
MAX_TOKEN_IDS = 1 << 20  # token ids in one request's `prompt`, or in /detokenize's `tokens`
# hard ceilings on list sizes, checked before pydantic looks at the items; the engine's own limits
# (--max-stop-strings, --max-stop-token-ids) apply after, and may only be set below these
MAX_STOP = 4096  # stop strings
MAX_STOP_TOKEN_IDS = 65536
MAX_MESSAGES = 4096


def _describe(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:40] + "..."


def _check_token_ids(ids: list, where: str) -> list[int]:
    """Every element an int in [0, 2**31): checked with C-speed builtins, then one error naming the
    first bad element (never one error per element, which cost seconds for a long list)."""
    if set(map(type, ids)) <= {int} and (not ids or (min(ids) >= 0 and max(ids) <= INT32_MAX)):
        return ids
    i, bad = next((i, t) for i, t in enumerate(ids) if type(t) is not int or not 0 <= t <= INT32_MAX)
    raise shape_error(f"{where}[{i}] must be a token id (an integer in [0, 2**31)), got {_describe(bad)}")


def _check_text(text: str, where: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise shape_error(f"{where} must be valid UTF-8 text (it holds a lone surrogate)") from None
    return text


def _prompt(value, name: str = "prompt"):
    """A string, a list of strings, a list of token ids, or a list of lists of token ids; the
    first element decides which list it is. `name`: what the endpoint calls the field (its errors say it)."""
    if isinstance(value, str):
        return _check_text(value, name)
    if not isinstance(value, list):
        raise shape_error(f"{name} must be a string, a list of strings, a list of token ids or a list of "
                           f"lists of token ids, got {_describe(value)}")
    if not value:
        return value
    first = value[0]
    if type(first) is int:
        if len(value) > MAX_TOKEN_IDS:
            raise shape_error(f"{name} has {len(value)} token ids, more than {MAX_TOKEN_IDS}")
        return _check_token_ids(value, name)
    if not isinstance(first, (str, list)):
        raise shape_error(f"{name}[0] must be a string, a token id or a list of token ids, got {_describe(first)}")
    if len(value) > MAX_PROMPTS:
        raise shape_error(f"{name} is a list of {len(value)} prompts, more than {MAX_PROMPTS}")
    if isinstance(first, str):
        for i, p in enumerate(value):
            if not isinstance(p, str):
                raise shape_error(f"{name}[{i}] must be a string like {name}[0], got {_describe(p)}")
            _check_text(p, f"{name}[{i}]")
        return value
    total = 0
    for i, p in enumerate(value):
        if not isinstance(p, list):
            raise shape_error(f"{name}[{i}] must be a list of token ids like {name}[0], got {_describe(p)}")
        total += len(p)
        if total > MAX_TOKEN_IDS:
            raise shape_error(f"{name} holds more than {MAX_TOKEN_IDS} token ids")
        _check_token_ids(p, f"{name}[{i}]")
    return value


TokenIdList = list[TokenId]
PromptInput = Annotated[str | list[int] | list[str] | list[list[int]],  # the schema shows the four forms
                        PlainValidator(_prompt,
                                       json_schema_input_type=Text | TokenIdList | list[Text] | list[TokenIdList])]


def _detokenize_tokens(value):
    if not isinstance(value, list):
        raise shape_error(f"tokens must be a list of token ids, got {_describe(value)}")
    if len(value) > MAX_TOKEN_IDS:
        raise shape_error(f"tokens has {len(value)} token ids, more than {MAX_TOKEN_IDS}")
    return _check_token_ids(value, "tokens")


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


class SamplingFields(ConstraintFields, StrictModel):
    model: Text | None = Field(None, description="the served model name (see /v1/models); omitted: that model")
    n: int = Field(1, ge=1, description="completions per prompt")
    temperature: float | None = Field(None, ge=0, le=MAX_SCALE, description="0 is greedy; default 1")
    top_p: float | None = Field(None, gt=0, le=1, description="nucleus sampling; default 1")
    top_k: int | None = Field(None, ge=-1, le=INT32_MAX, description="vLLM extension: keep the k most likely tokens; -1 or 0: off")
    min_p: float | None = Field(None, ge=0, le=1, description="vLLM extension: drop tokens below min_p x the top one")
    seed: int | None = Field(None, ge=0, lt=2**63, description="per-request seed; same seed, same output")
    stop: Annotated[Text | list[Text] | None, at_most(MAX_STOP, "stop")] = Field(
        None, description="stop strings (not included in the text)")
    stop_token_ids: Annotated[list[TokenId] | None, at_most(MAX_STOP_TOKEN_IDS, "stop_token_ids")] = Field(
        None, description="vLLM extension: token ids that end the completion")
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    repetition_penalty: float | None = Field(None, ge=1 / MAX_SCALE, le=MAX_SCALE, description="vLLM extension; 1 is off")
    ignore_eos: bool = Field(False, description="vLLM extension: keep going past EOS until max_tokens")
    min_tokens: int = Field(0, ge=0, le=INT32_MAX, description="vLLM extension: no EOS or stop before this many tokens")
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: Text | None = Field(None, description="accepted and ignored")
    prompt_logprobs: int | None = Field(None, ge=0, le=20, description=(
        "vLLM extension: each prompt token's logprob given the tokens before it, with the top N (completions: in "
        "each choice's prompt_logprobs; chat: in the response's)"))
    cache_salt: Text | None = Field(None, max_length=1024, description=(
        "vLLM extension: only requests with the same salt share prefix-cache blocks, so one tenant "
        "cannot learn from cache hits what another's prompts hold"))

    def _sampling_params(self, max_tokens: int | None, logprobs: int | None) -> SamplingParams:
        """Raises InvalidParameter when the request sets more than one output constraint, or stream_options
        without streaming (as OpenAI does)."""
        if self.stream_options is not None and not self.stream:
            raise InvalidParameter("stream_options", "stream_options is only allowed with stream: true")
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        constraint, _ = self.constraint()
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
            prompt_logprobs=self.prompt_logprobs,
            skip_special_tokens=self.skip_special_tokens,
            output_kind=RequestOutputKind.DELTA,  # streamed as is, or joined for a whole response
            structured_outputs=constraint,
            allowed_token_ids=self.allowed_token_ids,
            logit_bias=self.logit_bias,
        )

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class UsageInfo(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


# ---- /v1/completions ----------------------------------------------------------------------------

class CompletionRequest(OpenAICompletionFields, SamplingFields):
    prompt: PromptInput = Field(description="a string, a list of strings, a list of token ids, or a list of lists "
                                            f"of token ids (at most {MAX_PROMPTS} prompts, {MAX_TOKEN_IDS} token ids)")
    max_tokens: int | None = Field(16, ge=0, description="tokens to generate; null: up to max_model_len; 0 (with "
                                                          "echo): score the prompt only")
    logprobs: int | None = Field(None, ge=0, le=20, description="log probabilities of the sampled and top-N tokens "
                                                                "(of the prompt's too, with echo)")
    echo: bool = Field(False, description="prepend the prompt to the text; with logprobs, its tokens' logprobs too")
    use_beam_search: bool = Field(False, description=(
        "vLLM extension: beam search with n beams; the n choices are the n best beams, best score first. "
        "Sampling settings (temperature, top_p, top_k, min_p, seed, penalties, stop, logprobs, logit_bias, "
        "allowed_token_ids, min_tokens) are ignored; not with stream or an output constraint"))
    length_penalty: float = Field(1.0, ge=-1e6, le=1e6, allow_inf_nan=False, description=(
        "vLLM extension, with use_beam_search: a beam's score is its cumulative logprob / its length ** "
        "length_penalty"))

    @property
    def scores_only(self) -> bool:
        """max_tokens 0 with echo: the prompt is scored and nothing is generated (what evaluation harnesses send)."""
        return self.echo and self.max_tokens == 0

    def beam_search_params(self) -> BeamSearchParams | None:
        """The beam search the body asks for (None: it samples), or InvalidParameter naming the field."""
        if not self.use_beam_search:
            return None
        if self.stream:
            raise InvalidParameter("stream", "stream is not supported with use_beam_search: the beams are ranked "
                                             "only when the search ends")
        if not self.max_tokens:
            raise InvalidParameter("max_tokens", "max_tokens must be set, and at least 1, with use_beam_search")
        _, constraint_field = self.constraint()
        if constraint_field is not None:  # the beams would not follow it
            raise InvalidParameter(constraint_field, f"{constraint_field}: output constraints are not supported with "
                                                     "use_beam_search")
        return BeamSearchParams(beam_width=self.n, max_tokens=self.max_tokens, length_penalty=self.length_penalty,
                                ignore_eos=self.ignore_eos)

    def to_sampling_params(self) -> SamplingParams:
        if self.best_of is not None and self.best_of != self.n:
            raise InvalidParameter("best_of", f"best_of {self.best_of} is not supported: completions are not ranked, "
                                              f"so best_of must equal n ({self.n}) or be left out")
        if self.max_tokens == 0 and not self.echo:
            raise InvalidParameter("max_tokens", "max_tokens 0 needs echo: true (it returns the scored prompt only)")
        # the engine computes one token that a scoring-only request never shows: the prompt's last logits come free
        params = self._sampling_params(1 if self.scores_only else self.max_tokens, self.logprobs)
        if self.echo and self.logprobs is not None:  # the echoed prompt's logprobs
            params = msgspec.structs.replace(params, prompt_logprobs=max(self.logprobs, self.prompt_logprobs or 0))
        return params


class CompletionLogprobs(BaseModel):
    tokens: list[str] = []
    token_logprobs: list[float | None] = []
    top_logprobs: list[dict[str, float] | None] = []
    text_offset: list[int] = []


class PromptLogprob(BaseModel):
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    # vLLM's field, with `prompt_logprobs` in the request: per prompt token (null for the first), token id -> logprob
    prompt_logprobs: list[dict[int, PromptLogprob] | None] | None = None
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


# ---- /v1/models, /tokenize, /detokenize, /version, /health --------------------------------------

class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "nvllm"
    max_model_len: int
    root: str | None = Field(None, description="a LoRA adapter's folder; the base model's name for the base model")
    parent: str | None = Field(None, description="a LoRA adapter's base model (null for the base model)")


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class LoadLoRAAdapterRequest(StrictModel):
    lora_name: str = Field(min_length=1, max_length=256)
    lora_path: str = Field(min_length=1, max_length=4096)
    load_inplace: bool = Field(False, description="replace an adapter already loaded under this name (vLLM's)")


class UnloadLoRAAdapterRequest(StrictModel):
    lora_name: str = Field(min_length=1, max_length=256)
    lora_int_id: int | None = None  # vLLM's field; the name is what identifies the adapter here


class TokenizeCompletionRequest(StrictModel):
    model: Text | None = None
    prompt: Text
    add_special_tokens: bool = True


class TokenizeChatRequest(StrictModel):
    model: Text | None = None
    messages: Annotated[list[ChatMessage], at_most(MAX_MESSAGES, "messages")] = Field(min_length=1)
    add_generation_prompt: bool = True


def _tokenize_form(body) -> str:
    return "chat-form" if isinstance(body, dict) and "messages" in body else "prompt-form"


# a body with `messages` is a chat, any other a prompt: errors then come from that form alone
TokenizeRequest = Annotated[Annotated[TokenizeCompletionRequest, Tag("prompt-form")]
                            | Annotated[TokenizeChatRequest, Tag("chat-form")], Discriminator(_tokenize_form)]


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]


class DetokenizeRequest(StrictModel):
    model: Text | None = None
    tokens: Annotated[list[int], PlainValidator(_detokenize_tokens, json_schema_input_type=TokenIdList)] = Field(
        description=f"at most {MAX_TOKEN_IDS} token ids")


class DetokenizeResponse(BaseModel):
    prompt: str


class VersionResponse(BaseModel):
    version: str


class HealthResponse(BaseModel):
    status: Literal["ok"] = "ok"
