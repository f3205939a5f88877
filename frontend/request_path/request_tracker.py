"""The one record of each request the frontend serves, from the Processor to its last output.

A TrackedRequest holds everything about one request: its id, its samples (one core request each when
n > 1, with their detokenizers and output state), the core it runs on and the stream its outputs go to.
The RequestTracker is where those records live; the OutputProcessor, the EngineRouter, AsyncLLM and the
offline LLM all read and update the same record, so no part keeps a copy that could drift from the others.
A record leaves the tracker when its last sample finishes, or when it is aborted, lost with its core or
moved (a moved request is tracked afresh where it is placed next).
"""

import time
from dataclasses import dataclass, field

from common.errors import InvalidParameter
from common.sampling_params import SamplingParams
from common.wire_messages import ConstraintFailed, Failure, FinishReason
from frontend.request_path.detokenizer import IncrementalDetokenizer
from frontend.request_path.outputs import Logprob


@dataclass
class SequenceState:
    """One sample of a request: what the core generated for it and what was handed out so far."""
    index: int
    detokenizer: IncrementalDetokenizer | None  # None for an embedding request (it has no text)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, Logprob]] | None = None
    cumulative_logprob: float | None = None
    finish_reason: FinishReason | None = None  # None while it runs
    stop_token_id: int | None = None  # STOP: the stop token id the core saw
    stop_string: str | None = None  # STOP: the stop string this frontend found
    failure: Failure | None = None  # ERROR (ABORT: the core shut down): what failed
    sent_tokens: int = 0  # for delta outputs
    sent_logprobs: int = 0
    final_sent: bool = False

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def stop_reason(self) -> int | str | None:
        """What the public outputs call stop_reason (vLLM's shape): the stop string or stop token id, or the
        failure's message."""
        if self.failure is not None:
            return self.failure.message
        return self.stop_string if self.stop_string is not None else self.stop_token_id

    @property
    def error_param(self) -> str | None:
        return self.failure.field if isinstance(self.failure, ConstraintFailed) else None


@dataclass
class TrackedRequest:
    request_id: str
    prompt: str | None = None
    prompt_token_ids: list[int] = field(default_factory=list)
    params: SamplingParams | None = None
    sequences: dict[str, SequenceState] = field(default_factory=dict)  # core request id -> its sample
    stream: object = None  # where AsyncLLM's consumer reads the outputs (an asyncio.Queue); None offline
    core: object = None  # the core link it was sent to; None offline or while it is not placed
    num_cached_tokens: int = 0
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None  # once the core has sent them
    arrival_time: float = field(default_factory=time.time)
    first_token_time: float | None = None
    last_token_time: float | None = None
    beams: list | None = None  # a finished beam search: the core's BeamHypothesis list, best first
    # tracing on: its open RequestSpan (frontend/request_path/request_tracing.py), ended when it leaves
    span: object = None
    time_in_queue: float | None = None  # traced: seconds it waited in the core's queue (the core says)
    pooling: bool = False  # an embedding request: no tokens, one vector at the end
    embedding: bytes = b""  # its vector once the core sent it (float32 little-endian)

    @property
    def finished(self) -> bool:
        return all(s.finished for s in self.sequences.values())

    def unfinished_core_requests(self) -> list[str]:
        """The core request ids still running (what an abort must name)."""
        return [cid for cid, s in self.sequences.items() if not s.finished]


class RequestTracker:
    """The records of the requests in flight, by request id and by core request id."""

    def __init__(self):
        self._requests: dict[str, TrackedRequest] = {}
        self._by_core_request: dict[str, TrackedRequest] = {}

    def add(self, record: TrackedRequest) -> TrackedRequest:
        """Tracks a request; an id (its own or a sample's) that is in use already is an InvalidParameter."""
        ids = [record.request_id, *record.sequences]
        taken = [rid for rid in ids if rid in self._requests or rid in self._by_core_request]
        if taken:
            raise InvalidParameter("request_id", f"request_id {taken[0]!r} is already in use")
        self._requests[record.request_id] = record
        for cid in record.sequences:
            self._by_core_request[cid] = record
        return record

    def get(self, request_id: str | None) -> TrackedRequest | None:
        return self._requests.get(request_id)

    def owner_of(self, core_request_id: str) -> TrackedRequest | None:
        """The request a core request (one sample) belongs to."""
        return self._by_core_request.get(core_request_id)

    def remove(self, request_id: str) -> TrackedRequest | None:
        """Forgets a request (finished, aborted, lost or moving); returns its record, if it was tracked."""
        record = self._requests.pop(request_id, None)
        if record is not None:
            for cid in record.sequences:
                self._by_core_request.pop(cid, None)
            if record.span is not None:
                record.span, span = None, record.span
                span.end(record)
        return record

    def on_core(self, core) -> list[TrackedRequest]:
        return [r for r in self._requests.values() if r.core is core]

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._requests

    def __len__(self) -> int:
        return len(self._requests)

    def __iter__(self):
        return iter(list(self._requests.values()))
