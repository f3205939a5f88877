"""Running one HTTP request's prompts through the engine: validation up front (so a bad request is
a 400 before any stream starts), one engine request per prompt, merged delta outputs, and the
per-choice accumulation a non-streaming response needs.

The engine is always asked for DELTA outputs: streaming sends them on, non-streaming joins them,
and the metrics see every step either way.
"""

import uuid
from dataclasses import dataclass, field
from typing import AsyncIterator

import msgspec

from common.sampling_params import SamplingParams
from common.validation import request_token_cost
from frontend.api import offload
from frontend.api.admission import Ticket
from frontend.api.errors import APIError, bad_request, engine_unavailable
from frontend.api.protocol import UsageInfo
from frontend.api.state import MAX_SEQUENCES_PER_REQUEST, ServerState
from frontend.api.streams import merge
from frontend.core_client import EngineDeadError
from frontend.outputs import CompletionOutput, Logprob, RequestOutput


_encoder = msgspec.msgpack.Encoder()


@dataclass
class Prompt:
    text: str | None  # None for a prompt given as token ids
    token_ids: list[int]


@dataclass
class Choice:
    """One completion of a non-streaming response, joined from its deltas."""
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, Logprob]] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None

    def add(self, delta: CompletionOutput) -> None:
        self.text += delta.text
        self.token_ids.extend(delta.token_ids)
        if delta.logprobs:
            self.logprobs.extend(delta.logprobs)
        if delta.finish_reason is not None:
            self.finish_reason, self.stop_reason = delta.finish_reason, delta.stop_reason


def new_request_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def check_sequences(prompts: list, params: SamplingParams, param: str = "prompt") -> None:
    if len(prompts) * params.n > MAX_SEQUENCES_PER_REQUEST:
        raise APIError(400, f"{param} x n asks for {len(prompts) * params.n} sequences; at most "
                       f"{MAX_SEQUENCES_PER_REQUEST} fit in one request", param=param)


async def validate_prompts(state: ServerState, engine, request_id: str, prompts: list[str | list[int]],
                           params: SamplingParams, param: str = "prompt", cache_salt: str | None = None) -> list[Prompt]:
    """Tokenizes and checks every prompt with the parameters; a problem is a 400 naming the field.
    Characters are counted first; big prompts are tokenized off the event loop."""
    check_sequences(prompts, params, param)
    for prompt in prompts:
        if isinstance(prompt, str):
            state.check_chars(len(prompt), param)

    def work() -> list[Prompt]:
        checked, cost = [], 0
        for i, prompt in enumerate(prompts):
            try:
                text, request = engine.processor.process(f"{request_id}-{i}", prompt, params, cache_salt=cache_salt)
            except ValueError as e:
                raise bad_request(e, param if str(e).startswith("prompt") else None) from None
            try:  # what cannot go on the wire must fail here, as a 400, not once a stream has begun
                _encoder.encode(request)
            except (OverflowError, UnicodeError, msgspec.EncodeError) as e:
                raise APIError(400, f"a parameter is out of range or not valid UTF-8: {e}") from None
            checked.append(Prompt(text, request.prompt_token_ids))
            cost += request_token_cost(request.sampling_params, request.sampling_params.max_tokens)
        limit = engine.processor.limits.max_request_tokens
        if cost > limit:
            raise APIError(400, f"max_tokens: the request's prompts ask for n x max_tokens x (1 + logprobs) = "
                           f"{cost} in all, more than one request may ({limit}, --max-request-tokens)",
                           param="max_tokens")
        return checked

    return await offload.run(work, sum(len(p) for p in prompts))


def generate(state: ServerState, engine, request_id: str, prompts: list[Prompt], params: SamplingParams,
             ticket: Ticket, cache_salt: str | None = None) -> AsyncIterator[tuple[int, RequestOutput]]:
    """(prompt index, delta RequestOutput) for every prompt's engine request, as they come; the
    ticket lets each sequence go from the admission count at its first token."""
    streams = [state.metrics.track(ticket.track(engine.generate(p.text, params, f"{request_id}-{i}",
                                                                prompt_token_ids=p.token_ids, cache_salt=cache_salt),
                                               params.n),
                                   params.n)
               for i, p in enumerate(prompts)]
    return merge(streams)


async def collect(stream: AsyncIterator[tuple[int, RequestOutput]], num_prompts: int, n: int) -> list[Choice]:
    """Joins the deltas of every choice (index = prompt index x n + completion index)."""
    choices = [Choice(i) for i in range(num_prompts * n)]
    async for i, out in stream:
        for c in out.outputs:
            choices[i * n + c.index].add(c)
    return choices


def check_finished(state: ServerState, choices: list[Choice]) -> None:
    """A completion the engine ended with an error fails the whole response."""
    for choice in choices:
        if choice.finish_reason == "error":
            engine = state.engine
            if engine is not None and engine.dead is not None:
                raise engine_unavailable(str(engine.dead))
            raise APIError(500, f"the engine failed this request: {choice.stop_reason}")


def engine_error(e: Exception) -> APIError:
    if isinstance(e, EngineDeadError):
        return engine_unavailable(str(e))
    if isinstance(e, ValueError):
        return bad_request(e)
    return APIError(500, f"internal error: {type(e).__name__}: {e}")


def usage(prompts: list[Prompt], completion_tokens: int) -> UsageInfo:
    prompt_tokens = sum(len(p.token_ids) for p in prompts)
    return UsageInfo(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                     total_tokens=prompt_tokens + completion_tokens)


def decoded(engine, token_id: int, lp: Logprob | None) -> str:
    if lp is not None and lp.decoded_token is not None:
        return lp.decoded_token
    return engine.tokenizer.decode([token_id])


def top_entries(entry: dict[int, Logprob], sampled: int, num_top: int) -> list[tuple[int, Logprob]]:
    """The top `num_top` of one position's logprobs, most likely first."""
    ranked = [(tid, lp) for tid, lp in entry.items() if lp.rank is not None and lp.rank <= num_top]
    ranked.sort(key=lambda item: item[1].rank)
    return ranked
