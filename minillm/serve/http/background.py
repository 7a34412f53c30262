"""The server in a thread of this process, for a notebook or a test."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from ...parallel.launch import free_port
from ..llm import LLM
from .app import create_app


@contextmanager
def serve_in_background(llm: LLM, model_name: str = "smollm2", **app_options
                        ) -> Iterator[str]:
    """Serve ``llm`` on a free port of 127.0.0.1 from a thread of this process (uvicorn),
    for a notebook or a test; yields the server's URL and stops it on exit.
    ``app_options`` go to :func:`~.app.create_app` (``on_engine_stop``, ``api_key``)."""
    import uvicorn  # heavy: the HTTP server loads only when one is started

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
