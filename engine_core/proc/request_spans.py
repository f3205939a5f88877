"""The engine core's span of each traced request ("llm_core"), a child of the frontend's span.

A request is traced when it arrives with trace headers (the frontend's span context) and the core was started with
--otlp-traces-endpoint. Its span starts when the core takes the request, gets an event when it is scheduled
(again after each preemption), when its prompt is prefilled (its first token) and when it is preempted, and ends
with its last output (finished, aborted or failed). The scheduler knows nothing of this: after each step the core
hands this class the step's scheduler output and outputs, and only while some traced request is live.
"""

import time

from common.wire_messages import EngineCoreOutput, EngineCoreRequest
from common.tracing import Tracing

SERVICE_NAME = "nvllm-engine-core"


class _Live:
    """A traced request's span and what the span needs to know between steps."""
    __slots__ = ("span", "received", "first_scheduled", "running", "prefilled", "num_preemptions",
                 "num_output_tokens")

    def __init__(self, span, received: float):
        self.span, self.received = span, received
        self.first_scheduled: float | None = None
        self.running = self.prefilled = False
        self.num_preemptions = self.num_output_tokens = 0


class RequestSpans:
    def __init__(self, tracing: Tracing):
        self.tracing = tracing
        self.live: dict[str, _Live] = {}  # request id -> its span, while the request is in the core

    def start(self, request: EngineCoreRequest) -> None:
        """Opens the request's span under the frontend's (its trace headers)."""
        from opentelemetry.trace import SpanKind
        span = self.tracing.tracer.start_span("llm_core", context=self.tracing.extract(request.trace_headers),
                                              kind=SpanKind.INTERNAL,
                                              attributes={"gen_ai.request.id": request.request_id,
                                                          "gen_ai.usage.prompt_tokens": len(request.prompt_token_ids)})
        self.live[request.request_id] = _Live(span, time.time())

    def after_step(self, sched_out, outputs: list[EngineCoreOutput]) -> None:
        """Events of one step: who was scheduled or preempted, who got a first token, who finished."""
        now_ns = time.time_ns()
        if sched_out is not None:
            for rid in sched_out.preempted_ids:
                live = self.live.get(rid)
                if live is not None:
                    live.running = False
                    live.num_preemptions += 1
                    live.span.add_event("preempted", timestamp=now_ns)
            for scheduled in sched_out.scheduled:
                live = self.live.get(scheduled.request.owner.request_id)
                if live is not None and not live.running:
                    live.running = True
                    live.first_scheduled = live.first_scheduled or now_ns / 1e9
                    live.span.add_event("scheduled", {"gen_ai.request.num_computed_tokens":
                                                      scheduled.num_computed_tokens_before}, timestamp=now_ns)
        for out in outputs:
            live = self.live.get(out.request_id)
            if live is None:
                continue
            live.num_output_tokens += len(out.new_token_ids)
            if not live.prefilled and (out.new_token_ids or out.beams):
                live.prefilled = True
                live.span.add_event("prefilled", timestamp=now_ns)
                # the frontend's span reports it (gen_ai.latency.time_in_queue): the first scheduling is in the
                # same step as, or before, the first token
                first = live.first_scheduled or now_ns / 1e9
                out.time_in_queue = max(0.0, first - live.received)
            if out.finish_reason is not None:
                self._end(out, live, now_ns)

    def _end(self, out: EngineCoreOutput, live: _Live, now_ns: int) -> None:
        del self.live[out.request_id]
        span = live.span
        span.set_attributes({"gen_ai.usage.completion_tokens": live.num_output_tokens,
                             "gen_ai.usage.cached_tokens": out.num_cached_tokens,
                             "gen_ai.request.num_preemptions": live.num_preemptions,
                             "gen_ai.response.finish_reasons": [str(out.finish_reason)]})
        if out.failure is not None:
            from opentelemetry.trace import Status, StatusCode
            span.set_status(Status(StatusCode.ERROR, out.failure.message[:500]))
        span.end(end_time=now_ns)

    def shutdown(self) -> None:
        for live in self.live.values():  # the core stops under them: end them so they are sent
            live.span.set_attribute("gen_ai.response.finish_reasons", ["abort"])
            live.span.end()
        self.live.clear()
        self.tracing.shutdown()


def request_spans_for(endpoint: str | None) -> RequestSpans | None:
    """The core's spans when it was started with an OTLP endpoint; None (no tracing work at all) otherwise."""
    return RequestSpans(Tracing(endpoint, SERVICE_NAME)) if endpoint else None
