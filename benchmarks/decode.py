"""Decode speed on SmolLM2-135M, CPU: minillm at fp32, int8 and int4 vs Hugging Face and
llama.cpp, in one run.

    python benchmarks/decode.py               # the full tables recorded in docs/benchmarks.md
    python benchmarks/decode.py --llama-cpp   # + llama.cpp rows (builds llama-bench once)
    python benchmarks/decode.py --quick       # about a minute (the same as `minillm bench`)

Same prompts, same greedy tokens (checked: fp32 rows against Hugging Face, quantized rows
against the same weights dequantized; the W8A8 and W4A8 rows, which also round
activations, report how many leading tokens they share), same thread count, same run.
Every minillm row but the reference loop's is the serving engine with one executor (eager,
compiled or native), and reports the host time of its decode steps. The measuring code
is in minillm/bench.py; llama.cpp's rows come from benchmarks/llama_cpp.py
(``llama-bench`` generating 128 tokens at batch 1; batched decoding against llama.cpp is
``benchmarks/batched.py``).
"""

from __future__ import annotations

import argparse

from minillm.experiments.decode import DecodeRow, run_decode_benchmark

PEER_OF = {"minillm fp32, engine, compiled": "F32",
           "minillm fp32, engine, native": "F32",
           "minillm int8, weight-only, engine, compiled": "Q8_0",
           "minillm int8, int8 activations (W8A8), engine, native": "Q8_0",
           "minillm int4, weight-only, engine, compiled": "Q4_1",
           "minillm int4, int8 activations (W4A8), engine, native": "Q4_1"}


def llama_cpp_peers(threads: int, new_tokens: int):
    """A ``peers(batch)`` function giving llama.cpp rows at batch 1, or None if it cannot be
    built here (the reason is printed)."""
    import llama_cpp

    if reason := llama_cpp.llama_cpp_available():
        print(f"llama.cpp rows skipped: {reason}")
        return None
    llama_cpp.build_llama_bench()
    ggufs = llama_cpp.make_ggufs()

    def peers(batch: int):
        if batch != 1:
            return [], {}
        rows = []
        for precision, path in ggufs.items():
            tokens_per_second = llama_cpp.llama_bench(path, threads, new_tokens)["tg"]
            rows.append(DecodeRow(f"llama.cpp {precision}", 1, new_tokens,
                                  new_tokens / tokens_per_second, None, path.stat().st_size))
        return rows, {mine: f"llama.cpp {theirs}" for mine, theirs in PEER_OF.items()}

    return peers


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--uncached-tokens", type=int, default=256,
                        help="new tokens for the cached-vs-uncached comparison (batch 1)")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--no-compile", action="store_true", help="skip the compiled rows")
    parser.add_argument("--no-quantized", action="store_true", help="skip the int8/int4 rows")
    parser.add_argument("--llama-cpp", action="store_true",
                        help="add llama.cpp rows (F32, Q8_0, Q4_1), built on first use")
    parser.add_argument("--quick", action="store_true",
                        help="32 tokens, batch 1, fp32 rows without the compiled one")
    args = parser.parse_args(argv)
    if args.quick:
        args.new_tokens, args.uncached_tokens, args.batches = 32, 0, [1]
        args.no_compile = args.no_quantized = True
    peers = llama_cpp_peers(args.threads, args.new_tokens) if args.llama_cpp else None
    run_decode_benchmark(args.threads, args.new_tokens, args.uncached_tokens, args.batches,
                         compiled=not args.no_compile, quantized=not args.no_quantized,
                         peers=peers)


if __name__ == "__main__":
    main()
