"""The sampling fields completions and chat share, and the SamplingParams they make.

Field names and shapes follow OpenAI's API; the extra sampling fields (top_k, min_p, ...) are vLLM's.
Unknown fields are refused (400 naming the field) rather than silently ignored.
"""

from typing import Annotated

from pydantic import Field

from common.errors import InvalidParameter
from common.sampling_params import MAX_SCALE, RequestOutputKind, SamplingParams
from frontend.endpoints.openai_schemas.body_types import StrictModel, Text, at_most
from frontend.endpoints.openai_schemas.constraint_fields import ConstraintFields
from frontend.endpoints.openai_schemas.prompt_fields import INT32_MAX, MAX_STOP, MAX_STOP_TOKEN_IDS, TokenId


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
