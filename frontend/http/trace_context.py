"""The caller's W3C trace context: an HTTP request's traceparent/tracestate headers become the parent of the
request's span (frontend/request_path/request_tracing.py), which this middleware hands over through
CALLER_TRACE_HEADERS for the request's task. With tracing off it reads no header."""

from common.tracing import TRACE_HEADERS
from frontend.request_path.request_tracing import CALLER_TRACE_HEADERS

_NAMES = {name.encode(): name for name in TRACE_HEADERS}


class TraceContextMiddleware:
    def __init__(self, app, state):
        self.app, self.state = app, state

    async def __call__(self, scope, receive, send):
        engine = self.state.engine
        if scope["type"] != "http" or engine is None or engine.tracing is None:
            return await self.app(scope, receive, send)
        headers = {_NAMES[k]: v.decode("latin-1") for k, v in scope["headers"] if k in _NAMES}
        token = CALLER_TRACE_HEADERS.set(headers or None)
        try:
            await self.app(scope, receive, send)
        finally:
            CALLER_TRACE_HEADERS.reset(token)
