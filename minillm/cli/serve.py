"""``minillm serve``: an OpenAI-compatible HTTP server over the engine."""

from __future__ import annotations

import os
import sys

import uvicorn

from ..serve import LLM, SchedulerConfig
from ..serve.server import create_app
from ..tokenizer import Tokenizer
from .loading import add_executor_option, serving_model


def add_arguments(parser) -> None:
    parser.add_argument("--model", default="smollm2",
                        help="checkpoint dir (float or `minillm quantize` output), hub id, or "
                             "smollm2 (default)")
    parser.add_argument("--served-name",
                        help="the model name clients ask for (default: --model)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="the address to listen on (default: this machine only; 0.0.0.0 "
                             "serves the network, with --api-key)")
    parser.add_argument("--api-key", default=None,
                        help="require 'Authorization: Bearer KEY' on /v1 (or set "
                             "MINILLM_API_KEY)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--num-blocks", type=int, default=1024,
                        help="KV-cache blocks of 16 tokens")
    parser.add_argument("--max-batch", type=int, default=16, help="sequences per step")
    parser.add_argument("--tensor-parallel", type=int, default=1, metavar="N",
                        help="run the model on N processes (chapter 14)")
    parser.add_argument("--replicate-attention", action="store_true",
                        help="with --tensor-parallel: keep attention whole on every process "
                             "(SmolLM2 on 2 processes)")
    add_executor_option(parser)
    parser.add_argument("--worker-timeout", type=float, default=60.0, metavar="SECONDS",
                        help="with --tensor-parallel: how long a step may take before the "
                             "workers count as hung and the server stops (exit status 1)")
    parser.add_argument("--draft-model", default=None, metavar="DIR",
                        help="with --speculative-tokens: a smaller model guesses instead of "
                             "prompt lookup (e.g. one made by minillm distill)")
    parser.add_argument("--draft-head", default=None, metavar="DIR",
                        help="with --speculative-tokens: an EAGLE draft head guesses (made by "
                             "minillm train-draft-head)")
    parser.add_argument("--speculative-tokens", type=int, default=0, metavar="K",
                        help="prompt-lookup guesses per decode step (chapter 11; 0: off)")
    parser.add_argument("--kv-cache-dtype", default=None, choices=("float32", "int8", "int4"),
                        help="how the paged KV cache stores keys and values (default float32; "
                             "int8: a quarter of the bytes, int4: KIVI, eager steps)")
    parser.add_argument("--int8-activations", action="store_true",
                        help="with per-channel int8 weights (or grouped int4): round activations "
                             "to int8 too (W8A8/W4A8, chapter 6; the capstone's fastest engine)")


def run(args) -> int:
    scheduler = SchedulerConfig(max_batch=args.max_batch,
                                speculative_tokens=args.speculative_tokens)
    llm = LLM(serving_model(args), num_blocks=args.num_blocks, scheduler=scheduler,
              tensor_parallel_size=args.tensor_parallel,
              shard_attention=not args.replicate_attention, tokenizer=Tokenizer(args.model),
              worker_timeout=args.worker_timeout, executor=args.executor,
              draft_model=args.draft_model, draft_head=args.draft_head,
              kv_cache_dtype=args.kv_cache_dtype)
    stopped: list[str] = []

    def engine_stopped(reason: str) -> None:  # serve nothing rather than hang: exit, 1
        print(f"minillm serve: the engine stopped: {reason}", file=sys.stderr)
        stopped.append(reason)
        server.should_exit = True

    app = create_app(llm, args.served_name or args.model, on_engine_stop=engine_stopped,
                     api_key=args.api_key or os.environ.get("MINILLM_API_KEY"))
    # SIGTERM/Ctrl-C: open streams get a few seconds to finish, then the server exits even
    # if a step is stuck (the engine's step thread is a daemon).
    server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port,
                                           log_level="warning", timeout_graceful_shutdown=3))
    try:
        server.run()
    finally:
        llm.close()
    return 1 if stopped else 0
