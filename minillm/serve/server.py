"""An OpenAI-compatible HTTP server over the engine: ``minillm serve`` (chapter 15).

    minillm serve --port 8000
    curl localhost:8000/v1/chat/completions -H 'Content-Type: application/json' \\
        -d '{"model": "smollm2", "messages": [{"role": "user", "content": "Hi"}]}'

or with the official client: ``OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="-")``.

Endpoints: ``GET /`` (a chat page: plain HTML and a small script), ``GET /health``,
``GET /v1/models``, ``POST /v1/completions``, ``POST /v1/chat/completions`` (the
conversation goes through the checkpoint's chat template), ``GET /metrics`` (Prometheus
text). Requests stream when ``stream`` is true: server-sent events, one ``data: {json}``
chunk per piece of text, ending with ``data: [DONE]`` (Starlette's ``StreamingResponse``:
SSE is that simple, no extra package).

Every request becomes one engine request (:class:`~.async_engine.AsyncEngine`); its text
comes from an :class:`~.detokenizer.IncrementalDetokenizer` per sample, so a stop string
ends the reply before it (and frees the request's blocks at once) even when it spans
tokens, and an incomplete UTF-8 character is never sent. Bad requests get OpenAI's error
body (``{"error": {"message", "type", "param", "code"}}``) with status 400, or 404 for an
unknown model, and the server goes on. A client that disconnects mid-stream cancels its
request: the engine frees its KV blocks before its next step.

Faults: a request whose engine step failed gets a 500 with the error body (in a stream,
an ``{"error": ...}`` event, which the ``openai`` client raises), and the others go on.
If the engine stops (:class:`~.errors.EngineDeadError`), ``/health`` answers 503 with the
reason, every waiting request fails at once, and new ones get a 503; ``on_engine_stop``
lets ``minillm serve`` exit with an error status rather than serve nothing.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from functools import partial
from pathlib import Path
from typing import Literal, NamedTuple

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, StreamingResponse
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from pydantic import BaseModel, Field, field_validator, model_validator
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..parallel.launch import free_port
from ..sampling import MAX_LOGPROBS, SEED_RANGE, SamplingParams, TokenLogprob
from . import metrics
from .async_engine import AsyncEngine
from .async_engine import Request as EngineRequest
from .detokenizer import HoldBack, IncrementalDetokenizer, NextDelta, held_back, next_delta
from .errors import EngineDeadError
from .llm import LLM
from .sequence import FinishReason

# Limits a public server needs; each request past one gets a 400 that names it.
MAX_SAMPLES = 4  # n
MAX_BODY_BYTES = 1 << 20  # a request body (a prompt of a million characters is no chat)
MAX_STOPS = 4  # stop strings (OpenAI's limit)
MAX_STOP_CHARS = 256  # characters of one stop string
SEED_BOUNDS = dict(ge=SEED_RANGE[0], le=SEED_RANGE[1])  # a 64-bit integer, as OpenAI's


class Piece(NamedTuple):
    """New text of one sample, its finish reason when it ended, and the log-probabilities
    of the tokens consumed since its last piece (empty when not recorded)."""

    index: int
    text: str
    reason: str | None
    logprobs: list[TokenLogprob]

CHAT_PAGE = Path(__file__).with_name("chat.html")  # the page at /: streams a conversation


class StreamOptions(BaseModel):
    include_usage: bool = False


class GenerationRequest(BaseModel):
    """The fields shared by completions and chat completions (OpenAI's names and
    defaults; unknown fields are ignored, known ones are checked)."""

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: int | None = Field(default=None, **SEED_BOUNDS)
    stop: str | list[str] | None = None
    n: int = Field(default=1, ge=1, le=MAX_SAMPLES)
    stream: bool = False
    stream_options: StreamOptions | None = None

    @model_validator(mode="after")
    def _stream_options_need_stream(self):
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed when stream is true")
        return self

    @field_validator("stop")
    @classmethod
    def _stops_within_limits(cls, stop):
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        if len(stops) > MAX_STOPS:
            raise ValueError(f"at most {MAX_STOPS} stop strings, got {len(stops)}")
        if any(not 0 < len(s) <= MAX_STOP_CHARS for s in stops):
            raise ValueError(f"each stop string must have 1 to {MAX_STOP_CHARS} characters")
        return stop

    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


class CompletionRequest(GenerationRequest):
    prompt: str | list[int]
    max_tokens: int | None = Field(default=16, ge=1)  # OpenAI's default for completions
    logprobs: int | None = Field(default=None, ge=0, le=5)

    def recorded_logprobs(self) -> int | None:
        return self.logprobs


class Message(BaseModel):
    role: Literal["system", "user", "assistant"]
    content: str


class ChatRequest(GenerationRequest):
    messages: list[Message] = Field(min_length=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)

    @model_validator(mode="after")
    def _top_logprobs_need_logprobs(self):
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs to be true")
        return self

    def recorded_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


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


class ServerMetrics:
    """Prometheus metrics of one server (its own registry: several servers can live in one
    process, as in the tests)."""

    def __init__(self, llm: LLM):
        self.registry = registry = CollectorRegistry()
        self.requests = Counter("minillm_requests", "Requests by outcome", ["outcome"],
                                registry=registry)
        self.prompt_tokens = Counter("minillm_prompt_tokens", "Prompt tokens", registry=registry)
        self.generated_tokens = Counter("minillm_generation_tokens", "Generated tokens",
                                        registry=registry)
        self.ttft = Histogram("minillm_time_to_first_token_seconds", "TTFT", registry=registry)
        self.tpot = Histogram("minillm_time_per_output_token_seconds", "TPOT",
                              registry=registry, buckets=(.01, .025, .05, .1, .25, .5, 1, 2.5))
        Gauge("minillm_kv_blocks_used", "KV-cache blocks in use", registry=registry) \
            .set_function(lambda: llm.blocks.num_blocks - llm.free_blocks())
        Gauge("minillm_kv_blocks_total", "KV-cache blocks", registry=registry) \
            .set_function(lambda: llm.blocks.num_blocks)
        Gauge("minillm_requests_waiting", "Requests queued", registry=registry) \
            .set_function(lambda: len(llm.scheduler.waiting))
        Gauge("minillm_requests_running", "Requests running", registry=registry) \
            .set_function(lambda: len(llm.scheduler.running))

    def record(self, request: EngineRequest, outcome: str) -> None:
        self.requests.labels(outcome).inc()
        self.prompt_tokens.inc(request.seq.num_prompt_tokens)
        for seq in request.samples:
            self.generated_tokens.inc(len(seq.output))
            if seq.token_times:
                self.ttft.observe(metrics.ttft(seq))
            if (per_token := metrics.tpot(seq)) is not None:
                self.tpot.observe(per_token)


def create_app(llm: LLM, model_name: str = "smollm2", *,
               hold_back: HoldBack = held_back,
               next_delta: NextDelta = next_delta,
               on_engine_stop: Callable[[str], None] | None = None,
               api_key: str | None = None) -> FastAPI:
    """The server's ASGI app around ``llm`` (which needs a tokenizer). ``hold_back`` is the
    detokenizer's rule for text that may start a stop string and ``next_delta`` its step
    that decides what to send (chapter 15: yours, exercises 15.2 and 15.4).
    ``on_engine_stop(reason)`` is called once if the engine stops for good. With an
    ``api_key``, every ``/v1`` endpoint wants ``Authorization: Bearer <api_key>`` (as
    vLLM's ``--api-key``); the chat page, ``/health`` and ``/metrics`` stay open."""
    if llm.tokenizer is None:
        raise ValueError("the server needs an engine with a tokenizer")
    engine = AsyncEngine(llm)
    server_metrics = ServerMetrics(llm)

    def engine_ended(task: asyncio.Task) -> None:
        if engine.dead is not None and on_engine_stop is not None:
            on_engine_stop(engine.dead)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        task = asyncio.create_task(engine.run())
        task.add_done_callback(engine_ended)
        yield
        task.cancel()

    app = FastAPI(title="minillm", lifespan=lifespan)
    app.state.engine = engine
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
        param = ".".join(str(part) for part in problem["loc"][1:]) or None
        return ApiError(400, f"{param or 'body'}: {problem['msg']}", param=param).response()

    @app.get("/", response_class=HTMLResponse)
    async def chat_page():
        return CHAT_PAGE.read_text()

    @app.get("/health", responses={503: {"description": "The engine has stopped: why"}})
    async def health():
        if engine.dead is not None:
            return JSONResponse(status_code=503, content={"status": "error",
                                                          "message": engine.dead})
        return {"status": "ok"}

    @app.get("/v1/models", responses=_documented(401))
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model",
                                            "created": 0, "owned_by": "minillm"}]}

    @app.get("/metrics", response_class=PlainTextResponse)
    async def prometheus():
        return PlainTextResponse(generate_latest(server_metrics.registry).decode())

    async def start(body: GenerationRequest, prompt: list[int]) -> EngineRequest:
        if body.model != model_name:
            raise ApiError(404, f"the model {body.model!r} does not exist; this server has "
                           f"{model_name!r}", param="model", code="model_not_found")
        params = SamplingParams(temperature=body.temperature, top_p=body.top_p,
                                seed=body.seed, n=body.n, logprobs=body.recorded_logprobs(),
                                max_tokens=body.max_tokens or _room(llm, prompt))
        try:
            request = await engine.submit(prompt, params)
        except EngineDeadError as error:
            raise ApiError(503, str(error), kind="server_error") from None
        if request.seq.error is not None:
            server_metrics.record(request, "rejected")
            raise ApiError(400, request.seq.error, param="prompt")
        return request

    @app.post("/v1/completions", responses=_documented(400, 401, 404, 500, 503, streams=True))
    async def completions(body: CompletionRequest):
        prompt = body.prompt if isinstance(body.prompt, list) else \
            llm.tokenizer.encode(body.prompt)
        request = await start(body, prompt)
        completion_choice = partial(_completion_choice, llm.tokenizer)
        return await respond(body, request, "text_completion",
                             whole=completion_choice, delta=completion_choice)

    @app.post("/v1/chat/completions",
              responses=_documented(400, 401, 404, 500, 503, streams=True))
    async def chat_completions(body: ChatRequest):
        prompt = llm.tokenizer.conversation_prompt([m.model_dump() for m in body.messages])
        request = await start(body, prompt)
        return await respond(body, request, "chat.completion",
                             whole=partial(_chat_choice, llm.tokenizer, "message"),
                             delta=partial(_chat_choice, llm.tokenizer, "delta"))

    async def respond(body: GenerationRequest, request: EngineRequest, kind: str, *,
                      whole, delta):
        """The response: one JSON body built with ``whole`` choices, or an SSE stream of
        ``delta`` choices."""
        header = {"id": f"{'chatcmpl' if kind.startswith('chat') else 'cmpl'}-{uuid.uuid4().hex}",
                  "created": int(time.time()), "model": model_name}
        pieces = follow(request, body.stops())
        if body.stream:
            include_usage = body.stream_options is not None and body.stream_options.include_usage
            return StreamingResponse(stream(header, kind, pieces, request, include_usage, delta),
                                     media_type="text/event-stream")
        samples = len(request.samples)
        texts, reasons, logprobs = [""] * samples, [None] * samples, [[] for _ in range(samples)]
        async for piece in pieces:
            texts[piece.index] += piece.text
            reasons[piece.index] = piece.reason or reasons[piece.index]
            logprobs[piece.index] += piece.logprobs
        if (failure := _failure(request)) is not None:
            raise ApiError(500, failure, kind="server_error")
        wanted = request.seq.params.logprobs is not None
        choices = [whole(i, texts[i], reasons[i], logprobs[i] if wanted else None)
                   for i in range(samples)]
        return {**header, "object": kind, "choices": choices, "usage": _usage(request)}

    async def stream(header, kind, pieces, request, include_usage, delta):
        chunk_kind = kind + ".chunk" if kind.startswith("chat") else kind
        extra = {"usage": None} if include_usage else {}
        try:
            if kind.startswith("chat"):  # OpenAI's first chat chunk names the role
                for index in range(len(request.samples)):
                    first = {"index": index, "delta": {"role": "assistant", "content": ""},
                             "finish_reason": None}
                    yield sse_event({**header, "object": chunk_kind, "choices": [first],
                                     **extra})
            wanted = request.seq.params.logprobs is not None
            async for piece in pieces:
                if piece.reason == FinishReason.ERROR.value:  # the engine failed it
                    yield sse_event(ApiError(500, request.samples[piece.index].error,
                                             kind="server_error").body())
                    break
                entries = piece.logprobs if wanted else None
                yield sse_event({**header, "object": chunk_kind, **extra, "choices": [
                    delta(piece.index, piece.text, piece.reason, entries)]})
            if include_usage:
                yield sse_event({**header, "object": chunk_kind, "choices": [],
                                 "usage": _usage(request)})
            yield "data: [DONE]\n\n"
        finally:  # also when the client went away: cancel whatever still runs
            for seq in request.samples:
                if not seq.finished:
                    engine.cancel(seq)

    async def follow(request: EngineRequest, stops: list[str]) -> AsyncIterator[Piece]:
        """Each sample's new text as the engine produces it (with the log-probabilities of
        the tokens consumed since the last piece, when recorded)."""
        detokenizers = [IncrementalDetokenizer(llm.tokenizer, stops, hold_back, next_delta)
                        for _ in request.samples]
        sent = [0] * len(request.samples)
        reported = [0] * len(request.samples)  # log-probabilities handed out
        done = [False] * len(request.samples)
        while not all(done):
            await request.updated.wait()
            request.updated.clear()
            for index, seq in enumerate(request.samples):
                if done[index]:
                    continue
                finished = seq.finished  # read first: a step in flight appends, then finishes
                new = seq.output[sent[index]:]
                sent[index] += len(new)
                detokenizer = detokenizers[index]
                text = detokenizer.push(new)
                if detokenizer.stopped or finished or text:
                    logprobs = seq.logprobs[reported[index]:sent[index]]
                    reported[index] = sent[index]
                if detokenizer.stopped:  # a stop string: the reply ends before it
                    engine.cancel(seq)
                    done[index] = True
                    yield Piece(index, text, "stop", logprobs)
                elif finished:
                    done[index] = True
                    yield Piece(index, text + detokenizer.finish(), seq.finish_reason.value,
                                logprobs)
                elif text:
                    yield Piece(index, text, None, logprobs)
        server_metrics.record(request, "failed" if _failure(request) else "finished")

    return app


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


def _failure(request: EngineRequest) -> str | None:
    """The engine's error if it failed one of the request's samples."""
    return next((seq.error for seq in request.samples
                 if seq.finish_reason is FinishReason.ERROR), None)


@contextmanager
def serve_in_background(llm: LLM, model_name: str = "smollm2", **app_options
                        ) -> Iterator[str]:
    """Serve ``llm`` on a free port of 127.0.0.1 from a thread of this process (uvicorn),
    for a notebook or a test; yields the server's URL and stops it on exit.
    ``app_options`` go to :func:`create_app` (``hold_back``, ``next_delta``,
    ``on_engine_stop``, ``api_key``)."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(create_app(llm, model_name, **app_options),
                                           host="127.0.0.1", port=free_port(),
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("the server did not start (its error is printed above)")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{server.config.port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def _room(llm: LLM, prompt: list[int]) -> int:
    """The default max_tokens of a chat request: the rest of the model's context."""
    return max(1, llm.model.config.max_position_embeddings - len(prompt))


def sse_event(payload: dict) -> str:
    """One server-sent event carrying ``payload`` as JSON: ``data: {...}`` and a blank line."""
    return f"data: {json.dumps(payload)}\n\n"


def usage(prompt_tokens: int, completions: list[list[int]]) -> dict:
    """OpenAI's usage block: the prompt counted once (its blocks are shared by the ``n``
    samples), every sample's generated tokens (a stop token included)."""
    completion = sum(len(tokens) for tokens in completions)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
            "total_tokens": prompt_tokens + completion}


def _usage(request: EngineRequest) -> dict:
    return usage(request.seq.num_prompt_tokens, [seq.output for seq in request.samples])


def _completion_choice(tokenizer, index: int, text: str, reason: str | None,
                       logprobs: list[TokenLogprob] | None) -> dict:
    """A completions choice (whole or streamed alike); its logprobs in the legacy format
    (parallel lists)."""
    if logprobs is not None:
        logprobs = {
            "tokens": [_token_text(tokenizer, e.token) for e in logprobs],
            "token_logprobs": [e.logprob for e in logprobs],
            "top_logprobs": [{_token_text(tokenizer, t): lp for t, lp in e.top}
                             for e in logprobs]}
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": reason}


def _chat_choice(tokenizer, field: str, index: int, text: str, reason: str | None,
                 logprobs: list[TokenLogprob] | None) -> dict:
    """A chat choice: a whole ``message`` (which names its role), or a streamed ``delta``
    (the role came in the stream's first chunk)."""
    body = {"role": "assistant", "content": text} if field == "message" else {"content": text}
    choice = {"index": index, field: body, "finish_reason": reason,
              "logprobs": None}
    if logprobs is not None:
        choice["logprobs"] = {"content": [
            {**_chat_token(tokenizer, e.token, e.logprob),
             "top_logprobs": [_chat_token(tokenizer, t, lp) for t, lp in e.top]}
            for e in logprobs]}
    return choice


def _token_text(tokenizer, token: int) -> str:
    return tokenizer.decode([token], skip_special_tokens=False)


def _chat_token(tokenizer, token: int, logprob: float) -> dict:
    text = _token_text(tokenizer, token)
    return {"token": text, "logprob": logprob, "bytes": list(text.encode())}
