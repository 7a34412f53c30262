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
``best_of`` samples return the ``n`` with the highest cumulative log-probability. Text
that is not Unicode (JSON's ``\\udcff`` escape: a lone surrogate), in any field, is
refused with a 400 that names the field, never decoded into other characters.

Every prompt becomes one engine request (:class:`~.async_engine.AsyncEngine`); its text
comes from a :class:`~.sample_stream.SampleStream` per sample, so a stop string
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

Its parts live in :mod:`minillm.serve.http`, one concept per module; this module is the
entry point and names what the library, the course and the tests use.
"""

from .http.app import CHAT_PAGE, create_app
from .http.background import serve_in_background
from .http.errors import ApiError, ErrorBody, ErrorDetail, Limits
from .http.following import Follower, Piece
from .http.formats import GUIDED, ResponseFormat
from .http.parts import (
    MAX_BODY_BYTES,
    MAX_PROMPTS,
    MAX_SAMPLES,
    MAX_STOP_CHARS,
    MAX_STOPS,
    UNSUPPORTED,
    RequestPart,
    StreamOptions,
)
from .http.prometheus import ServerMetrics
from .http.responses import Reply, sse_event, usage
from .http.schemas import ChatRequest, CompletionRequest, GenerationRequest, Message

__all__ = [
    "CHAT_PAGE", "GUIDED", "MAX_BODY_BYTES", "MAX_PROMPTS", "MAX_SAMPLES", "MAX_STOPS",
    "MAX_STOP_CHARS", "UNSUPPORTED", "ApiError", "ChatRequest", "CompletionRequest",
    "ErrorBody", "ErrorDetail", "Follower", "GenerationRequest", "Limits", "Message",
    "Piece", "Reply", "RequestPart", "ResponseFormat", "ServerMetrics", "StreamOptions",
    "create_app", "serve_in_background", "sse_event", "usage",
]
