"""Decode speed on SmolLM2-135M, fp32, CPU: minillm (KV cache, no cache) vs Hugging Face.

    python benchmarks/decode.py            # the full tables recorded in docs/benchmarks.md
    python benchmarks/decode.py --quick    # about a minute (the same as `minillm bench`)

Same prompts, same greedy tokens (checked), same weights, same thread count, same run.
The measuring code is in minillm/bench.py.
"""

from __future__ import annotations

import argparse

from minillm.bench import run_decode_benchmark


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--uncached-tokens", type=int, default=256,
                        help="new tokens for the cached-vs-uncached comparison (batch 1)")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--no-compile", action="store_true", help="skip the compile_decode row")
    parser.add_argument("--quick", action="store_true",
                        help="32 tokens, batch 1, no uncached or compiled rows")
    args = parser.parse_args(argv)
    if args.quick:
        args.new_tokens, args.uncached_tokens, args.batches, args.no_compile = 32, 0, [1], True
    run_decode_benchmark(args.threads, args.new_tokens, args.uncached_tokens, args.batches,
                         compiled=not args.no_compile)


if __name__ == "__main__":
    main()
