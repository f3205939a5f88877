"""POST /v1/completions: its request body and its answer, whole or as stream events."""

import time
from typing import Literal

import msgspec
from pydantic import BaseModel, Field

from common.beam_search_params import BeamSearchParams
from common.errors import InvalidParameter
from common.sampling_params import SamplingParams
from frontend.endpoints.openai_schemas.answer_fields import PromptLogprob, UsageInfo
from frontend.endpoints.openai_schemas.openai_fields import OpenAICompletionFields
from frontend.endpoints.openai_schemas.prompt_fields import MAX_PROMPTS, MAX_TOKEN_IDS, PromptInput
from frontend.endpoints.openai_schemas.sampling_fields import SamplingFields


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
