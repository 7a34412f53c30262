"""Every refusal and failure in OpenAI's error body (``{"error": {"message", "type",
"param", "code"}}``): :class:`ApiError`; the :class:`Limits` checked before a body is
parsed (its size, the API key); and the handlers that turn FastAPI's and Starlette's own
errors into that body, with OpenAI's 400 for a body that does not validate."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from .parts import MAX_BODY_BYTES, UNSUPPORTED


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorBody(BaseModel):
    """OpenAI's error body: what every refused or failed request gets."""

    error: ErrorDetail


def _documented(*statuses: int, streams: bool = False) -> dict:
    """The OpenAPI ``responses`` of an endpoint: its errors, with OpenAI's body, and a
    success that is JSON or, when the request asks to stream, server-sent events."""
    meaning = {400: "A bad request (which field, and why, is in the message)",
               401: "No API key, or the wrong one", 404: "No such model",
               500: "The engine failed while computing the request",
               503: "The engine has stopped (see /health)"}
    responses = {status: {"model": ErrorBody, "description": meaning[status]}
                 for status in statuses}
    if streams:
        responses[200] = {"description": "The completion, or with stream: true its events",
                          "content": {"application/json": {}, "text/event-stream": {}}}
    return responses


class ApiError(Exception):
    """An error answered with OpenAI's error body."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.code = (status, message, kind,
                                                                        param, code)

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param,
                          "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(status_code=self.status, content=self.body())


class Limits:
    """ASGI middleware for what must be refused before a body is parsed: a body larger
    than :data:`MAX_BODY_BYTES` (400, read no further) and, with an API key, a ``/v1``
    request without it (401). Both answer with OpenAI's error body."""

    def __init__(self, app, api_key: str | None):
        self.app, self.api_key = app, api_key

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        if self.api_key is not None and scope["path"].startswith("/v1") and \
                headers.get(b"authorization", b"") != f"Bearer {self.api_key}".encode():
            error = ApiError(401, "this server wants an API key: send the header "
                             "'Authorization: Bearer <key>' (the openai client: api_key=...)",
                             code="invalid_api_key")
            return await error.response()(scope, receive, send)
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
            return await _too_large().response()(scope, receive, send)
        body, more = b"", scope["method"] in ("POST", "PUT", "PATCH")
        while more:  # read the body here, so one sent without its length is counted too
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away before its body was in
            body += message.get("body", b"")
            if len(body) > MAX_BODY_BYTES:
                return await _too_large().response()(scope, receive, send)
            more = message.get("more_body", False)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # later: only a disconnect can come

        await self.app(scope, replay, send)


def _too_large() -> ApiError:
    return ApiError(400, f"the request body is larger than {MAX_BODY_BYTES} bytes; send a "
                    "shorter prompt", code="request_too_large")


def _explained(problem: dict) -> str:
    """What is wrong with a field, for the error body: pydantic's message, or for a field
    the request model does not have, whether it is one of OpenAI's that this server
    cannot honour (and why) or one it does not know."""
    if problem["type"] != "extra_forbidden":
        return problem["msg"]
    if (reason := UNSUPPORTED.get(problem["loc"][-1])) is not None:
        return f"not supported by this server ({reason}); remove it"
    return ("this server does not know this field; remove it (the fields it takes are in "
            "its API schema, at /docs)")


def answer_errors_as_openai(app: FastAPI, api_key: str | None) -> None:
    """Give ``app`` the :class:`Limits` (with ``api_key``, if any), OpenAI's error body
    for every error, and an API schema that documents a 400, not FastAPI's 422, for a
    body that does not validate."""
    app.add_middleware(Limits, api_key=api_key)

    def openapi() -> dict:
        """FastAPI's schema, without the 422 it documents for every body: this server
        answers a body that does not validate with a 400 (OpenAI's status)."""
        if app.openapi_schema is None:
            schema = FastAPI.openapi(app)
            for path in schema["paths"].values():
                for operation in path.values():
                    operation["responses"].pop("422", None)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi

    @app.exception_handler(ApiError)
    async def api_error(request: Request, error: ApiError):
        return error.response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException):
        """Starlette's own refusals (a body that is not text, an unknown path, a wrong
        method) in OpenAI's body too."""
        return ApiError(error.status_code, str(error.detail)).response()

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, error: RequestValidationError):
        problem = error.errors()[0]
        if problem["type"] == "json_invalid":
            return ApiError(400, f"the body is not valid JSON ({problem['ctx']['error']})"
                            ).response()
        param = (problem.get("ctx") or {}).get("param") or \
            ".".join(str(part) for part in problem["loc"][1:]) or None
        return ApiError(400, f"{param or 'body'}: {_explained(problem)}", param=param).response()
