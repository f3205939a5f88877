"""OpenTelemetry tracing, shared by both services: a tracer that exports spans to an OTLP collector.

Tracing is off unless a service is given `--otlp-traces-endpoint` (EngineArgs.otlp_traces_endpoint); only then is
the OpenTelemetry SDK imported, so a server without it pays nothing, not even the import. The standard variables
work as the SDK defines them: OTEL_EXPORTER_OTLP_TRACES_PROTOCOL (or OTEL_EXPORTER_OTLP_PROTOCOL) picks `grpc` (the
default, as in vLLM) or `http/protobuf`; OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES name the service;
OTEL_EXPORTER_OTLP_TRACES_HEADERS / _TIMEOUT / _COMPRESSION / _CERTIFICATE / _INSECURE and OTEL_BSP_* (the batch
processor's queue and delays) are read by the SDK itself.

Spans leave through a BatchSpanProcessor: export happens on its own thread, and a full queue drops spans rather
than wait. A collector that cannot be reached costs one log line (`QuietExporter`), not a slower request.
"""

import logging
import os
from urllib.parse import urlsplit

logger = logging.getLogger("nvllm")

TRACE_HEADERS = ("traceparent", "tracestate")  # the W3C trace context, as HTTP headers and on the wire
PROTOCOLS = ("grpc", "http/protobuf")


def traces_protocol() -> str:
    """The OTLP protocol the standard variables ask for (grpc unless said otherwise); ValueError names the variable
    and what it may be."""
    for name in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        value = os.environ.get(name, "").strip()
        if value:
            if value not in PROTOCOLS:
                raise ValueError(f"{name} must be one of {', '.join(PROTOCOLS)}, got {value!r}")
            return value
    return "grpc"


def check_endpoint(endpoint: str) -> str:
    """An endpoint must be a URL with a host (http://collector:4317; grpc://collector:4317 for gRPC, as vLLM's
    examples write it); ValueError says what is wrong."""
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https", "grpc") or not parts.hostname:
        raise ValueError(f"otlp_traces_endpoint must be a URL like http://localhost:4317, got {endpoint!r}")
    return endpoint


def _http_traces_url(endpoint: str) -> str:
    """OTLP/HTTP posts to /v1/traces: an endpoint given without a path gets it (one with a path is used as is)."""
    parts = urlsplit(endpoint)
    return endpoint.rstrip("/") + "/v1/traces" if parts.path in ("", "/") else endpoint


def _exporter(endpoint: str, protocol: str):
    if protocol == "http/protobuf":
        if urlsplit(endpoint).scheme == "grpc":
            raise ValueError(f"otlp_traces_endpoint {endpoint!r} is a gRPC address, but "
                             "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL is http/protobuf: give an http:// or https:// URL")
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        return OTLPSpanExporter(endpoint=_http_traces_url(endpoint))
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    # plaintext for http:// and grpc://, TLS for https://, unless the standard variables say otherwise
    told = any(os.environ.get(v) for v in ("OTEL_EXPORTER_OTLP_TRACES_INSECURE", "OTEL_EXPORTER_OTLP_INSECURE"))
    insecure = None if told else urlsplit(endpoint).scheme in ("http", "grpc")
    return OTLPSpanExporter(endpoint=endpoint, insecure=insecure)


def _resource(default_service_name: str):
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    resource = Resource.create()  # OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES, if set
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: default_service_name}))
    return resource


class Tracing:
    """One service's tracer and its provider (never the process-wide global one: the offline LLM with an in-process
    core holds the frontend's and the core's in one process, each under its own service name)."""

    def __init__(self, endpoint: str, service_name: str, exporter=None):
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
        self.endpoint = endpoint
        self.protocol = traces_protocol()
        if exporter is None:
            exporter = QuietExporter(_exporter(check_endpoint(endpoint), self.protocol), endpoint)
        self.exporter = exporter
        self.provider = TracerProvider(resource=_resource(service_name))
        self.provider.add_span_processor(BatchSpanProcessor(exporter))
        self.tracer = self.provider.get_tracer("nvllm")
        self.propagator = TraceContextTextMapPropagator()
        # the exporters log every failed batch (and each retry); QuietExporter says it once instead
        logging.getLogger("opentelemetry.exporter").setLevel(logging.CRITICAL)

    def extract(self, headers: dict[str, str] | None):
        """The OpenTelemetry context a W3C traceparent/tracestate pair continues (None: no parent given)."""
        return self.propagator.extract(headers) if headers else None

    def inject(self, span) -> dict[str, str]:
        """The W3C headers that make a span the parent of spans elsewhere (the core's, over the wire)."""
        from opentelemetry.trace import set_span_in_context
        carrier: dict[str, str] = {}
        self.propagator.inject(carrier, context=set_span_in_context(span))
        return carrier

    def shutdown(self) -> None:
        """Sends what is queued (briefly: a dead collector must not hold up a shutdown) and stops the export thread."""
        try:
            # a collector known to be dead gets no wait; a live one two seconds to take what is queued
            dead = getattr(self.exporter, "failing", False)
            if dead or not self.provider.force_flush(timeout_millis=2000):
                # the export thread may sit in the exporter's retries for seconds: stopping the exporter first
                # ends them (the batch processor joins that thread before it stops the exporter itself)
                self.exporter.shutdown()
            self.provider.shutdown()
        except Exception as e:  # a collector's trouble is never the server's
            logger.debug("tracing shutdown: %s", e)


class QuietExporter:
    """Wraps an OTLP exporter: a failed export is logged once (and once again when the collector answers again),
    never raised into the export thread."""

    def __init__(self, inner, endpoint: str):
        self.inner, self.endpoint, self.failing, self.stopped = inner, endpoint, False, False

    def export(self, spans):
        from opentelemetry.sdk.trace.export import SpanExportResult
        try:
            result = self.inner.export(spans)
        except Exception as e:
            result, why = SpanExportResult.FAILURE, f"{type(e).__name__}: {e}"
        else:
            why = "the export failed"
        if result == SpanExportResult.SUCCESS:
            if self.failing:
                logger.info("OTLP traces reach %s again", self.endpoint)
            self.failing = False
        elif not self.failing:
            self.failing = True
            logger.warning("OTLP traces cannot be sent to %s (%s); spans are dropped until it answers", self.endpoint,
                           why)
        return result

    def shutdown(self) -> None:
        if not self.stopped:
            self.stopped = True
            self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


def tracing_for(endpoint: str | None, service_name: str) -> Tracing | None:
    """A Tracing for the endpoint, or None when tracing is off (no endpoint): then nothing is imported."""
    return Tracing(endpoint, service_name) if endpoint else None
