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

No request field is silently ignored: each is honoured or refused with a 400 that names it.
Refused: unknown fields, and OpenAI's that this server cannot honour (:data:`UNSUPPORTED`:
tools, audio, ``suffix``, ...), with the reason. Honoured: OpenAI's sampling fields
(``logit_bias``, the presence and frequency penalties and ``seed`` among them), vLLM's
extras (``top_k``, ``min_p``, ``repetition_penalty``), and one output constraint at most
(``response_format``; vLLM's ``guided_regex``, ``guided_choice``, ``guided_json``,
``guided_grammar``), which the engine enforces (:mod:`minillm.structured`). ``user`` and
``safety_identifier`` are accepted and unused: they only identify the caller. For
``/v1/completions``, ``prompt`` takes OpenAI's four shapes (several prompts: prompt p's
sample s is choice ``p * n + s``), ``echo`` starts each choice with its prompt, and
``best_of`` samples return the ``n`` with the highest cumulative log-probability.

Every prompt becomes one engine request (:class:`~.async_engine.AsyncEngine`); its text
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
import re
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, StreamingResponse
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..parallel.launch import free_port
from ..sampling import (
    MAX_LOGIT_BIAS,
    MAX_LOGPROBS,
    MAX_PENALTY,
    SEED_RANGE,
    SamplingParams,
    TokenLogprob,
)
from ..structured.backend import check_json_schema
from ..structured.spec import Choice, Grammar, JsonObject, JsonSchema, Regex, StructuredOutput
from . import metrics
from .async_engine import AsyncEngine
from .async_engine import Request as EngineRequest
from .detokenizer import HoldBack, IncrementalDetokenizer, NextDelta, held_back, next_delta
from .errors import EngineDeadError
from .llm import LLM
from .sequence import FinishReason

# Limits a public server needs; each request past one gets a 400 that names it.
MAX_SAMPLES = 4  # n, and best_of
MAX_PROMPTS = 16  # prompts in one completions request (each is an engine request)
MAX_BODY_BYTES = 1 << 20  # a request body (a prompt of a million characters is no chat)
MAX_STOPS = 4  # stop strings (OpenAI's limit)
MAX_STOP_CHARS = 256  # characters of one stop string
SEED_BOUNDS = dict(ge=SEED_RANGE[0], le=SEED_RANGE[1])  # a 64-bit integer, as OpenAI's

_NO_TOOLS = "no tool calling; for a reply of a given shape, use response_format"
_NO_CACHE_CONTROL = "the engine's prefix cache is automatic and takes no key or retention"
# OpenAI's request fields this server cannot honour, and why: a request that asks for one
# gets a 400 saying so, not a reply that quietly ignored it.
UNSUPPORTED = {
    "suffix": "no fill-in-the-middle: the model only continues the prompt",
    "tools": _NO_TOOLS, "tool_choice": _NO_TOOLS, "parallel_tool_calls": _NO_TOOLS,
    "functions": _NO_TOOLS, "function_call": _NO_TOOLS,
    "audio": "text in, text out only", "modalities": "text in, text out only",
    "prediction": "no predicted outputs",
    "reasoning_effort": "the model does not reason before it answers",
    "verbosity": "no verbosity control; bound the reply with max_tokens",
    "web_search_options": "no web search",
    "service_tier": "there is one tier",
    "store": "completions are not stored", "metadata": "completions are not stored",
    "moderation": "no moderation",
    "prompt_cache_key": _NO_CACHE_CONTROL, "prompt_cache_retention": _NO_CACHE_CONTROL,
    "prompt_cache_options": _NO_CACHE_CONTROL,
    "include_obfuscation": "no stream obfuscation",  # in stream_options
}


class Piece(NamedTuple):
    """New text of one sample, its finish reason when it ended, and the log-probabilities
    of the tokens consumed since its last piece (empty when not recorded)."""

    index: int
    text: str
    reason: str | None
    logprobs: list[TokenLogprob]


@dataclass
class Reply:
    """One sample's whole reply, gathered from its pieces."""

    text: str = ""
    reason: str | None = None
    logprobs: list[TokenLogprob] = field(default_factory=list)

    def add(self, piece: Piece) -> None:
        self.text += piece.text
        self.reason = piece.reason or self.reason
        self.logprobs += piece.logprobs

    @property
    def cumulative_logprob(self) -> float:
        return sum(entry.logprob for entry in self.logprobs)


CHAT_PAGE = Path(__file__).with_name("chat.html")  # the page at /: streams a conversation


def _refusal(param: str, message: str) -> PydanticCustomError:
    """A validation error about ``param``, its message shown as is: the error body names
    ``param`` even when a rule across several fields raised it."""
    return PydanticCustomError("refused", message, {"param": param})


class RequestPart(BaseModel):
    """A request, or a part of one. An unknown field is refused (a 400 that names it),
    never ignored; so is one of OpenAI's that this server cannot honour (:data:`UNSUPPORTED`,
    with the reason), unless its value asks for nothing (null or false, as some clients
    send: ``"tools": null``, ``"store": false``)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _drop_unsupported_asking_nothing(cls, data):
        if not isinstance(data, dict):
            return data
        return {name: value for name, value in data.items()
                if name not in UNSUPPORTED or value not in (None, False)}


class StreamOptions(RequestPart):
    include_usage: bool = False


def _checked_schema(schema: dict[str, Any], param: str) -> dict[str, Any]:
    """``schema`` if it is a valid JSON schema (the ``jsonschema`` package's check of it
    against its meta-schema), else a refusal naming ``param``."""
    try:
        check_json_schema(schema)
    except ValueError as error:
        raise _refusal(param, str(error)) from None
    return schema


class TextFormat(RequestPart):
    type: Literal["text"]

    def constraint(self) -> None:
        return None


class JsonObjectFormat(RequestPart):
    type: Literal["json_object"]

    def constraint(self) -> JsonObject:
        return JsonObject()


class JsonSchemaSpec(RequestPart):
    """OpenAI's ``json_schema``: the reply always follows ``schema`` (``strict`` or not)."""

    name: str
    description: str | None = None
    schema_: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None

    @field_validator("schema_")
    @classmethod
    def _valid(cls, schema):
        return _checked_schema(schema, "response_format")


class JsonSchemaFormat(RequestPart):
    type: Literal["json_schema"]
    json_schema: JsonSchemaSpec

    def constraint(self) -> JsonSchema:
        return JsonSchema.of(self.json_schema.schema_)


ResponseFormat = Annotated[TextFormat | JsonObjectFormat | JsonSchemaFormat,
                           Field(discriminator="type")]

# vLLM's guided-decoding fields, and the constraint each one asks for
GUIDED = {"guided_regex": Regex, "guided_choice": Choice, "guided_json": JsonSchema.of,
          "guided_grammar": Grammar}


class GenerationRequest(RequestPart):
    """The fields shared by completions and chat completions: OpenAI's (names, defaults,
    ranges), and vLLM's extras (``top_k``, ``min_p``, ``repetition_penalty``, ``guided_*``).
    ``user`` is accepted and unused: it only identifies the caller (to OpenAI, for abuse
    monitoring)."""

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: int | None = Field(default=None, **SEED_BOUNDS)
    stop: str | list[str] | None = None
    n: int = Field(default=1, ge=1, le=MAX_SAMPLES)
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float = Field(default=0.0, ge=-MAX_PENALTY, le=MAX_PENALTY)
    frequency_penalty: float = Field(default=0.0, ge=-MAX_PENALTY, le=MAX_PENALTY)
    logit_bias: dict[str, float] | None = None  # JSON's string keys; validated to int ones
    response_format: ResponseFormat | None = None
    user: str | None = None
    top_k: int = Field(default=0, ge=-1)  # 0, or vLLM's -1: off
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    repetition_penalty: float = Field(default=1.0, gt=0.0)
    guided_regex: str | None = None
    guided_choice: list[str] | None = Field(default=None, min_length=1)
    guided_json: dict[str, Any] | str | None = None
    guided_grammar: str | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _stream_options_need_stream(self):
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed when stream is true")
        return self

    @model_validator(mode="after")
    def _one_constraint(self):
        asked = list(self.constraints())
        if len(asked) > 1:
            raise _refusal(asked[1], "give at most one output constraint; got "
                           + " and ".join(asked))
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

    @field_validator("logit_bias")
    @classmethod
    def _token_ids_and_biases(cls, logit_bias):
        """JSON's keys are strings: each must be a token id, and map to a bias in OpenAI's
        range. (Whether the id is in the vocabulary, the server checks: it knows the model.)"""
        checked = {}
        for key, bias in (logit_bias or {}).items():
            try:
                checked[int(key)] = bias
            except ValueError:
                raise _refusal("logit_bias", f"the key {key!r} is not a token id; give token "
                               "ids (as strings), e.g. {\"1234\": -100}") from None
            if not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS:
                raise _refusal("logit_bias", f"the bias of token {key} is {bias}; biases go "
                               f"from -{MAX_LOGIT_BIAS} to {MAX_LOGIT_BIAS}")
        return checked or None

    @field_validator("top_k")
    @classmethod
    def _minus_one_is_off(cls, top_k):
        return max(top_k, 0)

    @field_validator("guided_regex")
    @classmethod
    def _compiles(cls, pattern):
        if pattern is None:
            return None
        try:
            re.compile(pattern)
        except re.error as error:
            raise _refusal("guided_regex", f"not a valid regular expression: {error}") from None
        return pattern

    @field_validator("guided_json")
    @classmethod
    def _a_json_schema(cls, schema):
        if schema is None:
            return None
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as error:
                raise _refusal("guided_json", f"a JSON schema, but not JSON: {error}") from None
        if not isinstance(schema, dict):
            raise _refusal("guided_json", "a JSON schema is a JSON object")
        return _checked_schema(schema, "guided_json")

    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def constraints(self) -> dict[str, StructuredOutput]:
        """The output constraints asked for, by the field that asks (one at most, once
        validated)."""
        asked = {}
        if self.response_format is not None and self.response_format.constraint():
            asked["response_format"] = self.response_format.constraint()
        for name, constraint in GUIDED.items():
            if getattr(self, name) is not None:
                asked[name] = constraint(getattr(self, name))
        return asked

    @property
    def samples(self) -> int:
        """Samples generated per prompt."""
        return self.n

    def token_limit(self) -> int | None:
        return self.max_tokens

    def requested_logprobs(self) -> int | None:
        """Alternatives per token the client wants back (None: no log-probabilities)."""
        raise NotImplementedError

    def sampling_params(self, max_tokens: int) -> SamplingParams:
        """The engine's parameters for each prompt of this request. Ranking ``best_of``
        samples needs their log-probabilities, so they are recorded even when unwanted."""
        logprobs = self.requested_logprobs()
        if logprobs is None and self.samples > self.n:
            logprobs = 0
        return SamplingParams(
            temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
            min_p=self.min_p, repetition_penalty=self.repetition_penalty,
            presence_penalty=self.presence_penalty, frequency_penalty=self.frequency_penalty,
            logit_bias=self.logit_bias or {}, seed=self.seed, n=self.samples,
            logprobs=logprobs, max_tokens=max_tokens,
            structured=next(iter(self.constraints().values()), None))


Prompts = Annotated[list[str], Field(min_length=1, max_length=MAX_PROMPTS)]
TokenPrompts = Annotated[list[list[int]], Field(min_length=1, max_length=MAX_PROMPTS)]


class CompletionRequest(GenerationRequest):
    """A completion of one prompt or several (OpenAI's four shapes: a string, a list of
    strings, a list of token ids, a list of lists of token ids); ``echo`` puts the prompt
    before each choice's text, and ``best_of`` samples return the ``n`` most likely."""

    prompt: str | Prompts | Annotated[list[int], Field(min_length=1)] | TokenPrompts
    max_tokens: int | None = Field(default=16, ge=1)  # OpenAI's default for completions
    logprobs: int | None = Field(default=None, ge=0, le=5)
    echo: bool = False
    best_of: int | None = Field(default=None, ge=1, le=MAX_SAMPLES)

    @field_validator("prompt", mode="wrap")
    @classmethod
    def _one_of_four_shapes(cls, prompt, validate):
        """One message for a prompt of no known shape (not one per shape tried)."""
        try:
            return validate(prompt)
        except ValidationError:
            raise _refusal("prompt", "give a string, a list of strings, a list of token ids "
                           f"or a list of lists of token ids (1 to {MAX_PROMPTS} prompts)"
                           ) from None

    @model_validator(mode="after")
    def _best_of_and_echo_fit(self):
        if self.best_of is not None and self.best_of < self.n:
            raise _refusal("best_of", f"must be at least n ({self.n}), got {self.best_of}: "
                           "it is how many samples are generated, of which the n most likely "
                           "are returned")
        if self.samples > self.n and self.stream:
            raise _refusal("best_of", "more than n cannot stream (the best samples are "
                           "known only at the end); set stream to false, or best_of to n")
        if self.echo and self.logprobs is not None:
            raise _refusal("echo", "not supported with logprobs by this server (it would "
                           "need the prompt tokens' log-probabilities, which the engine does "
                           "not compute); ask for one or the other")
        return self

    @property
    def samples(self) -> int:
        return self.best_of or self.n

    def prompts(self) -> list[str | list[int]]:
        """Each prompt, as text or as token ids."""
        one = isinstance(self.prompt, str) or isinstance(self.prompt[0], int)
        return [self.prompt] if one else list(self.prompt)

    def requested_logprobs(self) -> int | None:
        return self.logprobs


class Message(RequestPart):
    role: Literal["system", "user", "assistant"]
    content: str


class ChatRequest(GenerationRequest):
    """A chat completion. ``max_completion_tokens`` is the newer name of ``max_tokens``;
    ``safety_identifier``, like ``user``, is accepted and unused (it only identifies the
    caller)."""

    messages: list[Message] = Field(min_length=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    safety_identifier: str | None = None

    @model_validator(mode="after")
    def _top_logprobs_need_logprobs(self):
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs to be true")
        return self

    @model_validator(mode="after")
    def _one_token_limit(self):
        if None not in (self.max_tokens, self.max_completion_tokens) and \
                self.max_tokens != self.max_completion_tokens:
            raise _refusal("max_completion_tokens", "give max_completion_tokens (the newer "
                           "name) or max_tokens, not two different limits")
        return self

    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def requested_logprobs(self) -> int | None:
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
        param = (problem.get("ctx") or {}).get("param") or \
            ".".join(str(part) for part in problem["loc"][1:]) or None
        return ApiError(400, f"{param or 'body'}: {_explained(problem)}", param=param).response()

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

    async def start(body: GenerationRequest, prompts: list[list[int]]) -> list[EngineRequest]:
        """One engine request per prompt, submitted together (they join the same step);
        if one is refused, the others are cancelled and the whole request gets the 400."""
        if body.model != model_name:
            raise ApiError(404, f"the model {body.model!r} does not exist; this server has "
                           f"{model_name!r}", param="model", code="model_not_found")
        vocab = llm.model.config.vocab_size
        if outside := sorted(t for t in body.logit_bias or {} if not 0 <= t < vocab):
            raise ApiError(400, f"logit_bias: token ids {outside} are outside the vocabulary "
                           f"(0..{vocab - 1})", param="logit_bias")
        try:  # the engine's own checks, should they be stricter than the request model's
            params = [body.sampling_params(body.token_limit() or _room(llm, prompt))
                      for prompt in prompts]
        except ValueError as error:
            raise ApiError(400, str(error)) from None
        submitted = await asyncio.gather(*map(engine.submit, prompts, params),
                                         return_exceptions=True)
        requests = [r for r in submitted if isinstance(r, EngineRequest)]
        failure = next((r for r in submitted if isinstance(r, BaseException)), None)
        rejected = next((r.seq.error for r in requests if r.seq.error is not None), None)
        if failure is None and rejected is None:
            return requests
        for request in requests:
            cancel(request)
            server_metrics.record(request, "rejected")
        if isinstance(failure, EngineDeadError):
            raise ApiError(503, str(failure), kind="server_error")
        if failure is not None:
            raise failure
        raise ApiError(400, rejected, param="prompt")

    def cancel(request: EngineRequest) -> None:
        for seq in request.samples:
            if not seq.finished:
                engine.cancel(seq)

    @app.post("/v1/completions", responses=_documented(400, 401, 404, 500, 503, streams=True))
    async def completions(body: CompletionRequest):
        prompts = body.prompts()
        requests = await start(body, [llm.tokenizer.encode(p) if isinstance(p, str) else p
                                      for p in prompts])
        completion_choice = partial(_completion_choice, llm.tokenizer)
        echoes, openings = [""] * len(prompts), []
        if body.echo:  # each choice starts with its prompt (streamed: in a first chunk)
            echoes = [p if isinstance(p, str) else llm.tokenizer.decode(p) for p in prompts]
            openings = [completion_choice(p * body.n + s, echo, None, None)
                        for p, echo in enumerate(echoes) for s in range(body.n)]
        return await respond(body, requests, "text_completion", whole=completion_choice,
                             delta=completion_choice, echoes=echoes, openings=openings)

    @app.post("/v1/chat/completions",
              responses=_documented(400, 401, 404, 500, 503, streams=True))
    async def chat_completions(body: ChatRequest):
        prompt = llm.tokenizer.conversation_prompt([m.model_dump() for m in body.messages])
        requests = await start(body, [prompt])
        roles = [{"index": index, "delta": {"role": "assistant", "content": ""},
                  "finish_reason": None} for index in range(body.n)]  # OpenAI's first chunks
        return await respond(body, requests, "chat.completion",
                             whole=partial(_chat_choice, llm.tokenizer, "message"),
                             delta=partial(_chat_choice, llm.tokenizer, "delta"),
                             echoes=[""], openings=roles)

    async def respond(body: GenerationRequest, requests: list[EngineRequest], kind: str, *,
                      whole, delta, echoes: list[str], openings: list[dict]):
        """The response: one JSON body built with ``whole`` choices, or an SSE stream of
        ``delta`` choices after the ``openings``. Prompt p's sample s is choice
        ``p * n + s`` (OpenAI's rule); its text follows ``echoes[p]``."""
        header = {"id": f"{'chatcmpl' if kind.startswith('chat') else 'cmpl'}-{uuid.uuid4().hex}",
                  "created": int(time.time()), "model": model_name}
        pieces = follow(requests, body.stops())
        wanted = body.requested_logprobs() is not None
        if body.stream:
            include_usage = body.stream_options is not None and body.stream_options.include_usage
            return StreamingResponse(stream(header, kind, pieces, requests, include_usage,
                                            wanted, delta, openings),
                                     media_type="text/event-stream")
        replies = [Reply() for request in requests for _ in request.samples]
        async for piece in pieces:
            replies[piece.index].add(piece)
        if (failure := _failure(requests)) is not None:
            raise ApiError(500, failure, kind="server_error")
        choices, per_prompt = [], body.samples
        for p, echo in enumerate(echoes):
            best = _best(replies[p * per_prompt:(p + 1) * per_prompt], body.n)
            choices += [whole(p * body.n + s, echo + reply.text, reply.reason,
                              reply.logprobs if wanted else None)
                        for s, reply in enumerate(best)]
        return {**header, "object": kind, "choices": choices, "usage": _usage(requests)}

    async def stream(header, kind, pieces, requests, include_usage, wanted, delta, openings):
        chunk_kind = kind + ".chunk" if kind.startswith("chat") else kind
        extra = {"usage": None} if include_usage else {}
        samples = [seq for request in requests for seq in request.samples]
        try:
            for opening in openings:
                yield sse_event({**header, "object": chunk_kind, "choices": [opening], **extra})
            async for piece in pieces:
                if piece.reason == FinishReason.ERROR.value:  # the engine failed it
                    yield sse_event(ApiError(500, samples[piece.index].error,
                                             kind="server_error").body())
                    break
                yield sse_event({**header, "object": chunk_kind, **extra, "choices": [
                    delta(piece.index, piece.text, piece.reason,
                          piece.logprobs if wanted else None)]})
            if include_usage:
                yield sse_event({**header, "object": chunk_kind, "choices": [],
                                 "usage": _usage(requests)})
            yield "data: [DONE]\n\n"
        finally:  # also when the client went away: cancel whatever still runs
            for request in requests:
                cancel(request)

    async def follow(requests: list[EngineRequest], stops: list[str]
                     ) -> AsyncIterator[Piece]:
        """Each sample's new text as the engine produces it (with the log-probabilities of
        the tokens consumed since the last piece, when recorded). The samples of all
        ``requests`` are numbered in order: request p's sample s is ``p * samples + s``."""
        samples = [seq for request in requests for seq in request.samples]
        owners = [request for request in requests for _ in request.samples]
        detokenizers = [IncrementalDetokenizer(llm.tokenizer, stops, hold_back, next_delta)
                        for _ in samples]
        sent = [0] * len(samples)
        reported = [0] * len(samples)  # log-probabilities handed out
        done = [False] * len(samples)
        while not all(done):
            # every followed request is woken after each step: waiting for one that has
            # samples still running is waiting for the next step
            await owners[done.index(False)].updated.wait()
            for request in requests:
                request.updated.clear()
            for index, seq in enumerate(samples):
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
        for request in requests:
            server_metrics.record(request, "failed" if _failure([request]) else "finished")

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


def _failure(requests: list[EngineRequest]) -> str | None:
    """The engine's error if it failed one of the requests' samples."""
    return next((seq.error for request in requests for seq in request.samples
                 if seq.finish_reason is FinishReason.ERROR), None)


def _best(replies: list[Reply], n: int) -> list[Reply]:
    """The ``n`` replies of one prompt to return: all of them, or of ``best_of`` more the
    ``n`` with the highest cumulative log-probability, best first (vLLM's rule)."""
    if len(replies) == n:
        return replies
    return sorted(replies, key=lambda reply: reply.cumulative_logprob, reverse=True)[:n]


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


def _usage(requests: list[EngineRequest]) -> dict:
    """The usage of every prompt's request, summed (all ``best_of`` samples count)."""
    return usage(sum(request.seq.num_prompt_tokens for request in requests),
                 [seq.output for request in requests for seq in request.samples])


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
