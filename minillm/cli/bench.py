"""``minillm bench``: a quick decode-speed table against Hugging Face
(``benchmarks/decode.py`` has more)."""

from __future__ import annotations

from ..experiments.decode import run_decode_benchmark


def add_arguments(parser) -> None:
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=32)


def run(args) -> None:
    run_decode_benchmark(threads=args.threads, new_tokens=args.new_tokens, uncached_tokens=0,
                         batches=(1,), compiled=False, quantized=False)
