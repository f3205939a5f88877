"""The ASGI gate that applies the earliest of the HTTP server's limits (serving/limits.py).

`LimitsMiddleware` runs before FastAPI reads or parses anything: it checks the API key on the
protected routes from the headers alone, refuses a body whose Content-Length is over the limit,
and reads the body itself, counting, so a chunked body is cut off (413) as soon as it passes the
limit. It is plain ASGI (not BaseHTTPMiddleware) so streaming responses pass through untouched.
"""

import asyncio
import secrets

from frontend.endpoints.serving.errors import APIError
from frontend.endpoints.serving.limits import HTTPLimits

# an unauthenticated request with more than this left to send is answered and its connection
# closed, so the server does not go on reading (and discarding) a big body nobody may send
_DRAIN_AFTER_REFUSAL = 64 * 1024


def key_error(authorization: str | None, api_key: str | None) -> APIError | None:
    """The 401 for an Authorization header value, or None when it may pass."""
    if api_key is None:
        return None
    scheme, _, credentials = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not credentials.strip():
        return APIError(401, "missing API key: send it as 'Authorization: Bearer KEY'", code="invalid_api_key")
    if not secrets.compare_digest(credentials.strip().encode(), api_key.encode()):
        return APIError(401, "incorrect API key", code="invalid_api_key")
    return None


def body_too_large(limit: int) -> APIError:
    return APIError(413, f"the request body is larger than {limit} bytes (--max-request-body-bytes {limit})",
                    code="request_too_large")


def body_too_slow(seconds: float) -> APIError:
    return APIError(408, f"the request body did not arrive within {seconds:g} s (--request-body-timeout {seconds:g})",
                    code="request_timeout")


def protected(path: str, metrics_require_key: bool) -> bool:
    """Routes that need the API key (when the server has one)."""
    return (path.startswith("/v1/") or path in ("/tokenize", "/detokenize")
            or (metrics_require_key and path == "/metrics"))


class LimitsMiddleware:
    def __init__(self, app, limits: HTTPLimits, api_key: str | None):
        self.app = app
        self.limits = limits
        self.api_key = api_key

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {}
        for name, value in scope["headers"]:
            if name in (b"authorization", b"content-length", b"transfer-encoding"):
                headers[name] = value.decode("latin-1")
        declared = _content_length(headers.get(b"content-length"))
        unread_is_big = (declared is None and b"transfer-encoding" in headers) or (declared or 0) > _DRAIN_AFTER_REFUSAL
        if protected(scope["path"], self.limits.metrics_require_key):
            error = key_error(headers.get(b"authorization"), self.api_key)
            if error is not None:
                return await _refuse(error, scope, receive, send, close=unread_is_big)
        limit = self.limits.max_request_body_bytes
        if limit and declared is not None and declared > limit:
            return await _refuse(body_too_large(limit), scope, receive, send, close=True)
        # read the whole body here, counting, and hand it on in one piece; a client that trickles it
        # (a slow-body attack holds a connection and its buffer) is cut off at the deadline
        chunks, size = [], 0
        deadline = asyncio.get_running_loop().time() + (self.limits.request_body_timeout or float("inf"))
        while True:
            try:
                message = await asyncio.wait_for(receive(), deadline - asyncio.get_running_loop().time())
            except asyncio.TimeoutError:
                return await _refuse(body_too_slow(self.limits.request_body_timeout), scope, receive, send, close=True)
            if message["type"] != "http.request":  # the client went away
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if limit and size > limit:
                return await _refuse(body_too_large(limit), scope, receive, send, close=True)
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        delivered = False

        async def replay():
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # what is left: http.disconnect

        await self.app(scope, replay, send)


def _content_length(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        return None  # h11 refuses a malformed Content-Length before the app sees it


async def _refuse(error: APIError, scope, receive, send, close: bool) -> None:
    response = error.response()
    if close:  # the rest of the body stays unread: uvicorn closes the connection after the answer
        response.headers["Connection"] = "close"
    await response(scope, receive, send)
