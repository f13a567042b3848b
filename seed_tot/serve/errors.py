"""OpenAI's error object for every refusal: `{"error": {"message", "type", "param", "code"}}`.

Input is refused with 400 (bad value), 404 (unknown model or route), 413 (prompt past the context),
or 429 (queue full, with Retry-After), each naming the field; FastAPI's default validation answer
(422 with pydantic's list) is replaced by this shape, so an OpenAI client reads its message."""
from __future__ import annotations

import json
import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger(__name__)


class APIError(Exception):
    """A refusal with its HTTP status, the OpenAI error type, the field it names and a code."""

    def __init__(self, status: int, message: str, param: str | None = None, type_: str = "invalid_request_error",
                 code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.type, self.code = status, message, param, type_, code
        self.headers = headers

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param, code="invalid_value")


def _field(loc) -> str | None:
    """pydantic's location ("body", "messages", 0, "role") as a field path ("messages[0].role")."""
    path = ""
    for part in loc[1:] if loc and loc[0] == "body" else loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part in ("str", "list[str]", "list[int]", "list[list[int]]", "function-after"):
            continue  # the union branch pydantic tried: not a field
        else:
            path += f".{part}" if path else str(part)
    return path or None


def _validation_message(err: RequestValidationError) -> APIError:
    errors = err.errors()
    first = errors[0] if errors else {"loc": (), "msg": "invalid request", "type": ""}
    if first.get("type") == "json_invalid":
        return APIError(400, f"the body is not valid JSON: {first.get('ctx', {}).get('error', first['msg'])}",
                        None, code="invalid_json")
    field = _field(first.get("loc", ()))
    if first.get("type") == "missing":
        return APIError(400, f"missing required field {field!r}", field, code="missing_field")
    given = first.get("input")
    try:
        shown = json.dumps(given)[:200]
    except (TypeError, ValueError):
        shown = repr(given)[:200]
    where = f"{field}: " if field else ""
    return APIError(400, f"{where}{first['msg']} (got {shown})", field, code="invalid_value")


def install_handlers(app: FastAPI) -> None:
    """Every refusal in OpenAI's shape; an unexpected fault is a 500 that says so, without a traceback."""

    @app.exception_handler(APIError)
    async def api_error(request: Request, err: APIError):
        return err.response()

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, err: RequestValidationError):
        return _validation_message(err).response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, err: StarletteHTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(err.status_code)
        return APIError(err.status_code, f"{request.method} {request.url.path}: {err.detail}", None,
                        code=code).response()

    @app.exception_handler(Exception)
    async def internal_error(request: Request, err: Exception):
        log.exception("request %s %s failed", request.method, request.url.path)
        return APIError(500, f"internal error: {type(err).__name__}: {err}", None, type_="server_error",
                        code="internal_error").response()
