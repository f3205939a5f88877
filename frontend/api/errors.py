"""Every failure leaves the server as OpenAI's error body: {"error": {message, type, param, code}}.

400: a bad value or type, malformed JSON (pydantic's errors and the engine's InvalidParameter, which
     carries the field it is about); 401: API key; 404: unknown model or route;
413: the body is over --max-request-body-bytes; 503: the engine core is not ready or dead, or
the server is overloaded (with Retry-After); 500: a bug (logged with its traceback).
"""

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from common.errors import InvalidParameter
from frontend.api.protocol import ErrorInfo, ErrorResponse

logger = logging.getLogger("nvllm")

class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type: str | None = None, headers: dict[str, str] | None = None):
        message = _printable(message)
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = _printable(param) if param is not None else None
        self.code = code
        self.type = type or error_type(status)
        self.headers = dict(headers or {})

    def body(self) -> ErrorResponse:
        return ErrorResponse(error=ErrorInfo(message=self.message, type=self.type, param=self.param, code=self.code))

    def response(self) -> JSONResponse:
        headers = dict(self.headers)
        if self.status == 401:
            headers["WWW-Authenticate"] = "Bearer"
        return JSONResponse(self.body().model_dump(), status_code=self.status, headers=headers)


def _printable(text: str) -> str:
    """Text that encodes as UTF-8 (a client's lone surrogate, echoed back, must not break the reply)."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def error_type(status: int) -> str:
    if status >= 500:
        return "server_error"
    if status == 401:
        return "authentication_error"
    return "invalid_request_error"


def bad_request(error: InvalidParameter, rename: dict[str, str] | None = None) -> APIError:
    """A 400 naming the field the error carries (`rename`: what this endpoint calls a field, such as
    `messages` for the prompt of a chat)."""
    param = error.param
    return APIError(400, str(error), param=(rename or {}).get(param, param))


def model_not_found(name: str, served: str) -> APIError:
    return APIError(404, f"The model `{name}` does not exist; this server serves `{served}`.",
                    param="model", code="model_not_found")


def engine_unavailable(why: str) -> APIError:
    return APIError(503, f"the engine core is unavailable: {why}", code="engine_unavailable")


def _validation_error(exc: RequestValidationError) -> APIError:
    errors = exc.errors()
    json_error = next((e for e in errors if e.get("type") == "json_invalid"), None)
    if json_error is not None:
        why = (json_error.get("ctx") or {}).get("error", "")
        return APIError(400, f"the request body is not valid JSON{': ' + why if why else ''}", code="invalid_json")
    # the first error names the parameter; a union (e.g. prompt) reports one error per alternative
    first = errors[0] if errors else {"loc": ("body",), "msg": "invalid request"}
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    param = loc[0] if loc else None
    same = [e for e in errors if [str(p) for p in e.get("loc", ()) if p != "body"][:1] == loc[:1]]
    if param is None:
        message = "the request body must be a JSON object with the documented fields"
        if first.get("type") not in ("missing", "model_attributes_type", "dict_type"):
            message += f": {first.get('msg')}"
    elif len(same) > 1 and first.get("type") not in ("missing", "extra_forbidden"):
        # a union: the deepest error is usually the one about what the client meant
        deepest = max(same, key=lambda e: len(e.get("loc", ())))
        where = ".".join(str(p) for p in deepest.get("loc", ()) if p != "body")
        message = f"{param} has the wrong type or value (no accepted form matches; e.g. {where}: {deepest.get('msg')})"
    elif first.get("type") == "extra_forbidden":
        message = f"{param} is not a parameter this endpoint accepts"
    elif first.get("type") == "shape":  # protocol.py's own checks name the field and element themselves
        message = first["msg"] if len(loc) == 1 else f"{'.'.join(loc)}: {first['msg']}"
    else:
        got = f" (got {first['input']!r})" if _short(first.get("input")) and first.get("type") != "missing" else ""
        message = f"{'.'.join(loc)}: {first.get('msg')}{got}"
    if len(message) > 1000:
        message = message[:1000] + "..."
    return APIError(400, message, param=param)


def _short(value) -> bool:
    """Worth echoing in a message (the repr of a client's 100k-element list is not)."""
    if isinstance(value, (str, bytes)):
        return len(value) <= 200
    if isinstance(value, (list, dict)):
        return len(value) <= 20 and len(repr(value)) <= 200
    return True


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        return _validation_error(exc).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        return APIError(exc.status_code, message).response()

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception):
        logger.exception("unhandled error serving %s %s", request.method, request.url.path)
        return APIError(500, f"internal error: {type(exc).__name__}: {exc}").response()
