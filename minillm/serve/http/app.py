"""The routes: :func:`create_app` builds the server's FastAPI app around an engine (the
chat page, health, models, metrics, completions and chat completions), starts each
request's prompts in the engine and answers with one JSON body or an SSE stream."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, StreamingResponse
from prometheus_client import generate_latest

from ...engine.errors import EngineDeadError
from ..async_engine import AsyncEngine
from ..async_engine import Request as EngineRequest
from ..llm import LLM
from ..output_processor import OutputProcessor
from .errors import ApiError, _documented, answer_errors_as_openai
from .following import Follower, failure, usage_of
from .prometheus import ServerMetrics
from .responses import Reply, _best, _chat_choice, _completion_choice, sse_event
from .schemas import ChatRequest, CompletionRequest, GenerationRequest

CHAT_PAGE = Path(__file__).parents[1] / "chat.html"  # the page at /: streams a conversation


def create_app(llm: LLM, model_name: str = "smollm2", *,
               on_engine_stop: Callable[[str], None] | None = None,
               api_key: str | None = None) -> FastAPI:
    """The server's ASGI app around ``llm`` (which needs a tokenizer). Its requests' text is
    made by an output processor of its own, with the engine's sample streams
    (``LLM(sample_stream=...)``: chapter 15's lab runs the learner's in the server).
    ``on_engine_stop(reason)`` is called once if the engine stops for good. With an
    ``api_key``, every ``/v1`` endpoint wants ``Authorization: Bearer <api_key>`` (as
    vLLM's ``--api-key``); the chat page, ``/health`` and ``/metrics`` stay open."""
    if llm.tokenizer is None:
        raise ValueError("the server needs an engine with a tokenizer")
    engine = AsyncEngine(llm, OutputProcessor(llm.tokenizer,
                                              sample_stream=llm.processor.sample_stream))
    server_metrics = ServerMetrics(llm)
    follower = Follower(engine, server_metrics.record)

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
    answer_errors_as_openai(app, api_key)

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

    async def start(body: GenerationRequest, prompts: list[list[int]]
                    ) -> tuple[list[EngineRequest], asyncio.Queue]:
        """One engine request per prompt, submitted together (they join the same step) and
        reporting to one queue; if one is refused, the others are cancelled and the whole
        request gets the 400."""
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
        updates = asyncio.Queue()
        submitted = await asyncio.gather(*(engine.submit(prompt, sp, updates)
                                           for prompt, sp in zip(prompts, params, strict=True)),
                                         return_exceptions=True)
        requests = [r for r in submitted if isinstance(r, EngineRequest)]
        failed = next((r for r in submitted if isinstance(r, BaseException)), None)
        rejected = next((r.rejected for r in requests if r.rejected is not None), None)
        if failed is None and rejected is None:
            return requests, updates
        for request in requests:
            follower.cancel(request)
            server_metrics.record(request, "rejected")
        if isinstance(failed, EngineDeadError):
            raise ApiError(503, str(failed), kind="server_error")
        if failed is not None:
            raise failed
        raise ApiError(400, rejected, param="prompt")

    @app.post("/v1/completions", responses=_documented(400, 401, 404, 500, 503, streams=True))
    async def completions(body: CompletionRequest):
        prompts = body.prompts()
        requests, updates = await start(body, [llm.tokenizer.prompt(p) if isinstance(p, str)
                                               else p for p in prompts])
        completion_choice = partial(_completion_choice, llm.tokenizer)
        echoes, openings = [""] * len(prompts), []
        if body.echo:  # each choice starts with its prompt (streamed: in a first chunk)
            echoes = [p if isinstance(p, str) else llm.tokenizer.decode(p) for p in prompts]
            openings = [completion_choice(p * body.n + s, echo, None, None)
                        for p, echo in enumerate(echoes) for s in range(body.n)]
        return await respond(body, requests, updates, "text_completion",
                             whole=completion_choice, delta=completion_choice, echoes=echoes,
                             openings=openings)

    @app.post("/v1/chat/completions",
              responses=_documented(400, 401, 404, 500, 503, streams=True))
    async def chat_completions(body: ChatRequest):
        try:
            prompt = llm.tokenizer.conversation_prompt([m.model_dump() for m in body.messages])
        except ValueError as error:  # a base model has no chat template
            raise ApiError(400, str(error), param="messages") from None
        requests, updates = await start(body, [prompt])
        roles = [{"index": index, "delta": {"role": "assistant", "content": ""},
                  "finish_reason": None} for index in range(body.n)]  # OpenAI's first chunks
        return await respond(body, requests, updates, "chat.completion",
                             whole=partial(_chat_choice, llm.tokenizer, "message"),
                             delta=partial(_chat_choice, llm.tokenizer, "delta"),
                             echoes=[""], openings=roles)

    async def respond(body: GenerationRequest, requests: list[EngineRequest],
                      updates: asyncio.Queue, kind: str, *, whole, delta, echoes: list[str],
                      openings: list[dict]):
        """The response: one JSON body built with ``whole`` choices, or an SSE stream of
        ``delta`` choices after the ``openings``. Prompt p's sample s is choice
        ``p * n + s`` (OpenAI's rule); its text follows ``echoes[p]``."""
        header = {"id": f"{'chatcmpl' if kind.startswith('chat') else 'cmpl'}-{uuid.uuid4().hex}",
                  "created": int(time.time()), "model": model_name}
        pieces = follower.follow(requests, updates)
        wanted = body.requested_logprobs() is not None
        if body.stream:
            include_usage = body.stream_options is not None and body.stream_options.include_usage
            return StreamingResponse(stream(header, kind, pieces, requests, include_usage,
                                            wanted, delta, openings),
                                     media_type="text/event-stream")
        replies = [Reply() for request in requests for _ in request.output.outputs]
        async for piece in pieces:
            replies[piece.index].add(piece)
        if (failed := failure(requests)) is not None:
            raise ApiError(500, failed, kind="server_error")
        choices, per_prompt = [], body.samples
        for p, echo in enumerate(echoes):
            best = _best(replies[p * per_prompt:(p + 1) * per_prompt], body.n)
            choices += [whole(p * body.n + s, echo + reply.text, reply.reason,
                              reply.logprobs if wanted else None)
                        for s, reply in enumerate(best)]
        return {**header, "object": kind, "choices": choices, "usage": usage_of(requests)}

    async def stream(header, kind, pieces, requests, include_usage, wanted, delta, openings):
        chunk_kind = kind + ".chunk" if kind.startswith("chat") else kind
        extra = {"usage": None} if include_usage else {}
        try:
            for opening in openings:
                yield sse_event({**header, "object": chunk_kind, "choices": [opening], **extra})
            async for piece in pieces:
                if piece.reason == "error":  # the engine failed it
                    yield sse_event(ApiError(500, failure(requests),
                                             kind="server_error").body())
                    break
                yield sse_event({**header, "object": chunk_kind, **extra, "choices": [
                    delta(piece.index, piece.text, piece.reason,
                          piece.logprobs if wanted else None)]})
            if include_usage:
                yield sse_event({**header, "object": chunk_kind, "choices": [],
                                 "usage": usage_of(requests)})
            yield "data: [DONE]\n\n"
        finally:  # also when the client went away: cancel whatever still runs
            for request in requests:
                follower.cancel(request)

    return app


def _room(llm: LLM, prompt: list[int]) -> int:
    """The default max_tokens of a chat request: the rest of the model's context."""
    return max(1, llm.model.config.max_position_embeddings - len(prompt))
