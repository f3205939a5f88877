"""The frontend's span of each request ("llm_request"), with vLLM's gen_ai.* attributes.

With tracing on (--otlp-traces-endpoint), every request the frontend serves gets one span, from when it is
tracked until its record leaves the RequestTracker (finished, aborted, or lost with its core). Its parent is the
caller's trace when the HTTP request carried a W3C `traceparent` (frontend/http/trace_context.py puts it in
CALLER_TRACE_HEADERS for the request's task), else whatever span is current in the caller's OpenTelemetry context
(an offline LLM called inside the caller's own span), else none. The span's context goes to the core in each
core request's trace_headers, so the core's span ("llm_core") is its child.
"""

import contextvars
import time

from common.tracing import Tracing

SERVICE_NAME = "nvllm-frontend"

# the traceparent/tracestate the HTTP request being served carried (None: none, or tracing off)
CALLER_TRACE_HEADERS: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar(
    "nvllm_caller_trace_headers", default=None)


class RequestSpan:
    """One request's open span; `end(record)` fills in what the request turned out to be and closes it."""
    __slots__ = ("span", "model_name", "start")

    def __init__(self, span, model_name: str, start: float):
        self.span, self.model_name, self.start = span, model_name, start

    def end(self, record) -> None:
        now = time.time()
        params = record.params
        seqs = list(record.sequences.values())
        reasons = [str(s.finish_reason) if s.finish_reason is not None else "abort" for s in seqs]
        completion_tokens = (sum(len(b.token_ids) for b in record.beams) if record.beams is not None
                             else sum(len(s.token_ids) for s in seqs))
        attributes = {
            "gen_ai.request.id": record.request_id,
            "gen_ai.response.model": self.model_name,
            "gen_ai.usage.prompt_tokens": len(record.prompt_token_ids),
            "gen_ai.usage.completion_tokens": completion_tokens,
            "gen_ai.usage.num_sequences": len(seqs) if record.beams is None else len(record.beams),
            "gen_ai.usage.cached_tokens": record.num_cached_tokens,
            "gen_ai.request.n": params.n,
            "gen_ai.request.max_tokens": params.max_tokens,
            "gen_ai.request.temperature": params.temperature,
            "gen_ai.request.top_p": params.top_p,
            "gen_ai.response.finish_reasons": reasons,
            "gen_ai.latency.e2e": now - self.start,
        }
        if params.top_k is not None and params.top_k > 0:
            attributes["gen_ai.request.top_k"] = params.top_k
        if params.seed is not None:
            attributes["gen_ai.request.seed"] = params.seed
        if record.time_in_queue is not None:
            attributes["gen_ai.latency.time_in_queue"] = record.time_in_queue
        first = record.first_token_time or (record.last_token_time if record.beams is not None else None)
        if first is not None:
            attributes["gen_ai.latency.time_to_first_token"] = first - self.start
        # a None (max_tokens null, an embedding request's unused settings) is no attribute value: left out
        self.span.set_attributes({k: v for k, v in attributes.items() if v is not None})
        failures = [s.failure.message for s in seqs if s.failure is not None]
        if failures:
            from opentelemetry.trace import Status, StatusCode
            self.span.set_status(Status(StatusCode.ERROR, failures[0][:500]))
        self.span.end(end_time=int(now * 1e9))


class RequestTracing:
    """The frontend's tracer: opens each request's span and hands its context to the request's core requests."""

    def __init__(self, tracing: Tracing):
        self.tracing = tracing

    def start(self, request, record, model_name: str) -> None:
        """Opens the span of a ProcessedRequest being tracked as `record`, and puts its context in each of its core
        requests (the core's span becomes its child)."""
        from opentelemetry.trace import SpanKind
        caller = self.tracing.extract(CALLER_TRACE_HEADERS.get())
        start = min(record.arrival_time, request.core_requests[0].arrival_time)  # from its tokenizing on
        span = self.tracing.tracer.start_span("llm_request", context=caller, kind=SpanKind.SERVER,
                                              start_time=int(start * 1e9),
                                              attributes={"gen_ai.request.id": request.request_id,
                                                          "gen_ai.response.model": model_name})
        record.span = RequestSpan(span, model_name, start)
        headers = self.tracing.inject(span)
        for core_request in request.core_requests:
            core_request.trace_headers = headers

    def shutdown(self) -> None:
        self.tracing.shutdown()


def request_tracing_for(endpoint: str | None) -> RequestTracing | None:
    """The frontend's tracing when given an OTLP endpoint; None (no tracing work, no import) otherwise."""
    return RequestTracing(Tracing(endpoint, SERVICE_NAME)) if endpoint else None
