"""A small OTLP/HTTP trace receiver, run as a process by the tracing tests: POST /v1/traces takes an
ExportTraceServiceRequest (protobuf) as a collector does; GET /spans answers every span received so far as JSON.
It prints the port it listens on, then serves until killed."""

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (ExportTraceServiceRequest,
                                                                      ExportTraceServiceResponse)

SPANS: list[dict] = []
LOCK = threading.Lock()


def _value(v):
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


def _attributes(kvs) -> dict:
    return {kv.key: _value(kv.value) for kv in kvs}


def _spans(request: ExportTraceServiceRequest) -> list[dict]:
    out = []
    for rs in request.resource_spans:
        service = _attributes(rs.resource.attributes).get("service.name")
        for ss in rs.scope_spans:
            for span in ss.spans:
                out.append({"service": service, "name": span.name, "trace_id": span.trace_id.hex(),
                            "span_id": span.span_id.hex(), "parent_span_id": span.parent_span_id.hex(),
                            "attributes": _attributes(span.attributes), "events": [e.name for e in span.events],
                            "path": None})
    return out


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        spans = _spans(request)
        for span in spans:
            span["path"] = self.path
        with LOCK:
            SPANS.extend(spans)
        self._answer(ExportTraceServiceResponse().SerializeToString(), "application/x-protobuf")

    def do_GET(self):
        with LOCK:
            self._answer(json.dumps(SPANS).encode(), "application/json")

    def _answer(self, body: bytes, content_type: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(server.server_address[1], flush=True)
    server.serve_forever()
