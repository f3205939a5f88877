"""Running one HTTP request's prompts through the engine: each prompt processed once up front (so a bad
request is a 400 before any stream starts) and that same ProcessedRequest streamed, merged delta outputs, and the
per-choice accumulation a non-streaming response needs.

The engine is always asked for DELTA outputs: streaming sends them on, non-streaming joins them,
and the metrics see every step either way.
"""

import logging
import uuid
from dataclasses import dataclass, field
from typing import AsyncIterator

from common.beam_search_params import BeamSearchParams
from common.errors import InvalidParameter
from common.lora import LoRARequest
from common.request_ids import part_id
from common.sampling_params import SamplingParams
from common.validation import request_token_cost
from frontend.endpoints.serving import offload
from frontend.endpoints.serving.admission import Ticket
from frontend.endpoints.serving.errors import APIError, bad_request, engine_unavailable
from frontend.endpoints.openai_schemas.shared_fields import PromptLogprob, UsageInfo
from frontend.endpoints.serving.state import MAX_SEQUENCES_PER_REQUEST, ServerState
from frontend.endpoints.serving.streams import SSE_DONE, merge
from frontend.async_engine.async_llm import AsyncLLM
from frontend.core_link.core_client import EngineDeadError
from frontend.request_path.outputs import CompletionOutput, Logprob, RequestOutput
from frontend.request_path.processor import ProcessedRequest

logger = logging.getLogger("nvllm")


@dataclass
class Choice:
    """One completion of a non-streaming response, joined from its deltas."""
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, Logprob]] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    error_param: str | None = None
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None  # its prompt's, where the request asked

    def add(self, delta: CompletionOutput) -> None:
        self.text += delta.text
        self.token_ids.extend(delta.token_ids)
        if delta.logprobs:
            self.logprobs.extend(delta.logprobs)
        if delta.finish_reason is not None:
            self.finish_reason, self.stop_reason = delta.finish_reason, delta.stop_reason
            self.error_param = delta.error_param


def new_request_id(prefix: str) -> str:
    """The id of one HTTP request; its prompts are its parts (common/request_ids.py)."""
    return f"{prefix}-{uuid.uuid4().hex}"


def sampling_params(body) -> tuple[SamplingParams, str | None]:
    """The body's SamplingParams and the field that set its output constraint (what its errors name), or a
    400 naming the field (two output constraints at once)."""
    try:
        return body.to_sampling_params(), body.constraint()[1]
    except InvalidParameter as e:
        raise bad_request(e) from None


def check_sequences(prompts: list, params: SamplingParams, param: str = "prompt") -> None:
    if len(prompts) * params.n > MAX_SEQUENCES_PER_REQUEST:
        raise APIError(400, f"{param} x n asks for {len(prompts) * params.n} sequences; at most "
                       f"{MAX_SEQUENCES_PER_REQUEST} fit in one request", param=param)


async def process_prompts(state: ServerState, engine: AsyncLLM, request_id: str, prompts: list[str | list[int]],
                          params: SamplingParams, param: str = "prompt", cache_salt: str | None = None,
                          prompt_token_ids: list[list[int]] | None = None,
                          constraint_field: str | None = None,
                          max_tokens_field: str = "max_tokens",
                          beam_search: BeamSearchParams | None = None,
                          lora_request: LoRARequest | None = None) -> list[ProcessedRequest]:
    """One ProcessedRequest per prompt (tokenized and checked once; the same objects are then streamed),
    or a 400 naming the field (`param` is what this endpoint calls the prompt, `max_tokens_field` its output
    length; `constraint_field` what set the output constraint). Characters are counted first; big prompts, and every constraint (llguidance
    compiles it to check it), are processed off the event loop."""
    check_sequences(prompts, params, param)
    for prompt in prompts:
        if isinstance(prompt, str):
            state.check_chars(len(prompt), param)

    def work() -> list[ProcessedRequest]:
        processed, cost = [], 0
        for i, prompt in enumerate(prompts):
            rid = request_id if len(prompts) == 1 else part_id(request_id, i)
            ids = prompt_token_ids[i] if prompt_token_ids is not None else None
            try:
                request = engine.process(rid, prompt, params, prompt_token_ids=ids, cache_salt=cache_salt,
                                         constraint_field=constraint_field,  # the one check, with the constraint
                                         beam_search=beam_search, lora_request=lora_request)
            except InvalidParameter as e:
                # a beam search's width is the body's n
                raise bad_request(e, rename={"prompt": param, "max_tokens": max_tokens_field, "beam_width": "n"}) from None
            processed.append(request)
            cost += request_token_cost(request.params, request.params.max_tokens)
        limit = engine.limits.max_request_tokens
        if cost > limit:
            raise APIError(400, f"{max_tokens_field}: the request's prompts ask for n x {max_tokens_field} x "
                           f"(1 + logprobs) = {cost} in all, more than one request may ({limit}, "
                           "--max-request-tokens)", param=max_tokens_field)
        return processed

    size = offload.ALWAYS if params.structured_outputs is not None else sum(len(p) for p in prompts)
    return await offload.run(work, size)


def generate(state: ServerState, engine: AsyncLLM, requests: list[ProcessedRequest], ticket: Ticket,
             constraint_field: str | None = None) -> AsyncIterator[tuple[int, RequestOutput]]:
    """(prompt index, delta RequestOutput) for every prompt's engine request, as they come; the
    ticket lets each sequence go from the admission count at its first token. An error the core pins on
    the constraint names it as the client set it (`constraint_field`)."""
    streams = [state.metrics.track(ticket.track(engine.stream(r), r.params.n), r.params.n) for r in requests]
    merged = merge(streams)
    return merged if constraint_field is None else _renamed_errors(merged, constraint_field)


async def _renamed_errors(stream: AsyncIterator[tuple[int, RequestOutput]],
                          constraint_field: str) -> AsyncIterator[tuple[int, RequestOutput]]:
    async for i, out in stream:
        for c in out.outputs:
            if c.error_param is not None and c.error_param.startswith("structured_outputs"):
                if isinstance(c.stop_reason, str) and c.stop_reason.startswith(c.error_param):
                    c.stop_reason = constraint_field + c.stop_reason[len(c.error_param):]
                c.error_param = constraint_field
        yield i, out


async def collect(stream: AsyncIterator[tuple[int, RequestOutput]], num_prompts: int, n: int) -> list[Choice]:
    """Joins the deltas of every choice (index = prompt index x n + completion index)."""
    choices = [Choice(i) for i in range(num_prompts * n)]
    async for i, out in stream:
        for c in out.outputs:
            choice = choices[i * n + c.index]
            choice.add(c)
            if out.prompt_logprobs is not None:
                choice.prompt_logprobs = out.prompt_logprobs
    return choices


async def sse_events(events: AsyncIterator[str], request_id: str) -> AsyncIterator[str]:
    """A streamed response's events, then [DONE]; a failure mid-stream ends it with an error event (a bug
    is logged with its traceback and the request id: the client has had its 200 already)."""
    try:
        async for event in events:
            yield event
    except Exception as e:
        error = engine_error(e)
        if error.status == 500:
            logger.exception("internal error streaming request %s", request_id)
        yield f"data: {error.body().model_dump_json()}\n\n"
    yield SSE_DONE


def check_finished(state: ServerState, choices: list[Choice]) -> None:
    """A completion the engine ended with an error fails the whole response: a 400 where the error is about a
    field of the request (a constraint the vocabulary cannot follow), else a 500."""
    for choice in choices:
        if choice.finish_reason == "error" and choice.error_param is not None:
            raise APIError(400, str(choice.stop_reason), param=choice.error_param)
        if choice.finish_reason == "error":
            engine = state.engine
            if engine is not None and engine.dead is not None:
                raise engine_unavailable(str(engine.dead))
            raise APIError(500, f"the engine failed this request: {choice.stop_reason}")


def raise_request_error(output: CompletionOutput) -> None:
    """In a stream: a completion that ended with an error about a field of the request ends the stream with a
    400-type error event naming the field (an engine failure stays a finish_reason "error" chunk)."""
    if output.finish_reason == "error" and output.error_param is not None:
        raise InvalidParameter(output.error_param, str(output.stop_reason))


def engine_error(e: Exception) -> APIError:
    if isinstance(e, EngineDeadError):
        return engine_unavailable(str(e))
    if isinstance(e, InvalidParameter):
        return bad_request(e)
    return APIError(500, f"internal error: {type(e).__name__}: {e}")


def usage(requests: list[ProcessedRequest], completion_tokens: int) -> UsageInfo:
    prompt_tokens = sum(len(r.prompt_token_ids) for r in requests)
    return UsageInfo(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                     total_tokens=prompt_tokens + completion_tokens)


def decoded(engine: AsyncLLM, token_id: int, lp: Logprob | None) -> str:
    if lp is not None and lp.decoded_token is not None:
        return lp.decoded_token
    return engine.tokenizer.decode([token_id])


def top_entries(entry: dict[int, Logprob], sampled: int, num_top: int) -> list[tuple[int, Logprob]]:
    """The top `num_top` of one position's logprobs, most likely first."""
    ranked = [(tid, lp) for tid, lp in entry.items() if lp.rank is not None and lp.rank <= num_top]
    ranked.sort(key=lambda item: item[1].rank)
    return ranked


def vllm_prompt_logprobs(requested: int | None, scored) -> list[dict[int, PromptLogprob] | None] | None:
    """vLLM's `prompt_logprobs` in a response: only where the request named the field."""
    if requested is None or scored is None:
        return None
    return [None if entry is None else
            {tid: PromptLogprob(logprob=lp.logprob, rank=lp.rank, decoded_token=lp.decoded_token)
             for tid, lp in entry.items()} for entry in scored]
