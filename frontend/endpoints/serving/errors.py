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
from frontend.endpoints.openai_schemas.answer_fields import ErrorInfo, ErrorResponse

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


def field_path(loc, body, error_type: str = "") -> list[str | int]:
    """A pydantic error's location as a path into the body the client sent: the names of union members and
    tags that pydantic puts in a location are in no body, so they are left out. A missing field is named."""
    path, value = [], body
    loc = list(loc)
    if loc and loc[0] == "body":
        loc = loc[1:]
    for i, part in enumerate(loc):
        if isinstance(value, dict) and isinstance(part, str) and part in value:
            path.append(part)
            value = value[part]
        elif isinstance(value, list) and type(part) is int and 0 <= part < len(value):
            path.append(part)
            value = value[part]
        elif isinstance(value, dict) and i == len(loc) - 1 and error_type == "missing":
            path.append(part)
    return path


def format_path(path: list[str | int]) -> str:
    """messages[1].content[0].text"""
    text = ""
    for part in path:
        text += f"[{part}]" if type(part) is int else (f".{part}" if text else str(part))
    return text


OWN_MESSAGES = ("shape", "unsupported")  # error types whose message the request models wrote for clients


def _validation_error(exc: RequestValidationError) -> APIError:
    errors = exc.errors()
    json_error = next((e for e in errors if e.get("type") == "json_invalid"), None)
    if json_error is not None:
        why = (json_error.get("ctx") or {}).get("error", "")
        return APIError(400, f"the request body is not valid JSON{': ' + why if why else ''}", code="invalid_json")
    body = getattr(exc, "body", None)
    paths = [field_path(e.get("loc", ()), body, e.get("type", "")) for e in errors]
    if not errors or not paths[0]:
        first = errors[0] if errors else {"type": "missing", "msg": "invalid request"}
        message = "the request body must be a JSON object with the documented fields"
        if first.get("type") not in ("missing", "model_attributes_type", "dict_type"):
            message += f": {first.get('msg')}"
        return APIError(400, message)
    first, path = errors[0], paths[0]
    kind = first.get("type")
    if kind in ("union_tag_invalid", "union_tag_not_found"):  # name the tag field (role, type) itself
        tag = str((first.get("ctx") or {}).get("discriminator", "")).strip("'")
        path = path + [tag] if tag else path
    # a union (e.g. content: text or parts) reports one error per alternative; the deepest is usually the one
    # about what the client meant
    same = [(e, p) for e, p in zip(errors, paths) if p[:len(path)] == path]
    union_message = None
    if len(same) > 1 and kind not in ("missing", "extra_forbidden"):
        deepest, deep_path = max(same, key=lambda item: len(item[1]))
        if deepest.get("type") in OWN_MESSAGES:  # a refusal of the form the client chose: that is the answer
            first, path, kind = deepest, deep_path, deepest.get("type")
        else:
            union_message = (f"{format_path(path)} has the wrong type or value (no accepted form matches; e.g. "
                             f"{format_path(deep_path)}: {deepest.get('msg')})")
    param = format_path(path)
    if union_message is not None:
        message = union_message
    elif kind == "union_tag_invalid":
        ctx = first.get("ctx") or {}
        message = f"{param} must be one of {ctx.get('expected_tags')}, got {ctx.get('tag')!r}"
    elif kind == "union_tag_not_found":
        message = f"{param}: Field required"
    elif kind == "extra_forbidden":
        where = "parameter this endpoint accepts" if len(path) == 1 else "field this endpoint accepts there"
        message = f"{param} is not a {where}"
    elif kind in OWN_MESSAGES and (len(path) == 1 or first["msg"].startswith(param)):
        message = first["msg"]  # the request models' own checks name the field and element themselves
    else:
        got = f" (got {first['input']!r})" if _short(first.get("input")) and kind not in ("missing", *OWN_MESSAGES) \
            else ""
        message = f"{param}: {first.get('msg')}{got}"
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
