"""A request's engine requests run: their delta outputs merged, joined per choice for a whole answer or sent
on as Server-Sent Events, and an engine's errors turned into the API's.

The engine is always asked for DELTA outputs: streaming sends them on, non-streaming joins them,
and the metrics see every step either way.
"""

import logging
from dataclasses import dataclass, field
from typing import AsyncIterator

from common.errors import InvalidParameter
from frontend.async_engine.async_llm import AsyncLLM
from frontend.core_link.core_client import EngineDeadError
from frontend.endpoints.serving.admission import Ticket
from frontend.endpoints.serving.errors import APIError, bad_request, engine_unavailable
from frontend.endpoints.serving.state import ServerState
from frontend.endpoints.serving.streams import SSE_DONE, merge
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
