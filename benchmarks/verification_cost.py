"""The cost of verifying n tokens of one sequence, r(n), per executor and weight format.

    python benchmarks/verification_cost.py                       # SmolLM2-135M, all rows
    python benchmarks/verification_cost.py --executors native --weights W8A8 W4A8
    python benchmarks/verification_cost.py --tiny --busy-ok --repeats 1   # a smoke run

Speculative decoding's speedup is τ / (r(γ+1) + γ·c): r(n) is the time of one forward
pass over n new tokens of one sequence, ``--context`` tokens already cached, over the
time of one decode step of it (n = 1). Each row is one engine runner with that executor
(:mod:`minillm.experiments.verification`): ``--repeats`` repeats after warm-up (the
compiled executor compiles there), each timing every n as the median of ``--calls``
passes; r(n) is t(n) / t(1) within each repeat, reported as the median over repeats
[smallest–largest]. The compiled executor runs decode steps only: its n > 1 passes run
eagerly, as they do in the engine, and the last column says so. Weight formats as in
``benchmarks/batched.py``: fp32, W8A8, W4A8 (RTN, int8 activations).

Timings are only honest on a quiet machine (:func:`minillm.machine.quiet_problem`): the
script refuses to run on a busy one unless ``--busy-ok``, which marks the table as not
for the record.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from minillm import load_model
from minillm.config import ModelConfig
from minillm.experiments.verification import (
    EXECUTORS,
    WEIGHTS,
    cost_table,
    measure_row,
    weight_format,
)
from minillm.machine import describe, quiet_problem
from minillm.testing import TINY, varied_random_model


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--executors", nargs="+", choices=EXECUTORS, default=list(EXECUTORS))
    parser.add_argument("--weights", nargs="+", choices=WEIGHTS, default=list(WEIGHTS))
    parser.add_argument("--max-n", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--calls", type=int, default=5,
                        help="passes per n in each repeat (their median is the repeat's time)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed rounds over every n")
    parser.add_argument("--context", type=int, default=None,
                        help="tokens already cached (default 128; 32 with --tiny)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tiny", action="store_true",
                        help="the tests' tiny random model instead of SmolLM2 (a smoke run)")
    parser.add_argument("--busy-ok", action="store_true",
                        help="run on a busy machine too (the times are then not for the record)")
    args = parser.parse_args(argv)
    if not args.busy_ok and (problem := quiet_problem()) is not None:
        sys.exit(f"{problem}; wait for a quiet machine or pass --busy-ok")
    torch.set_num_threads(args.threads)
    context = args.context if args.context is not None else (32 if args.tiny else 128)
    plain = varied_random_model(ModelConfig(**TINY)) if args.tiny else load_model("smollm2")
    name = "tiny random model" if args.tiny else "SmolLM2-135M-Instruct"
    record = "busy: NOT for the record" if args.busy_ok else "quiet machine"
    print(f"{describe()}, {args.threads} threads, {record}")
    print(f"{name}, {context} tokens cached, {args.repeats} repeats of {args.calls} passes "
          f"per n after {args.warmup} warm-up rounds; r(n) per repeat, median [min–max]\n",
          flush=True)
    started = time.perf_counter()
    rows, skipped = [], {}
    for weights in args.weights:
        model = weight_format(plain, weights)
        for executor in args.executors:
            try:
                rows.append(measure_row(model, executor, weights, args.max_n, context,
                                        args.repeats, args.calls, args.warmup))
            except ValueError as error:  # an executor this model cannot run
                skipped[f"{executor} / {weights}"] = str(error)
            print(f"  {executor} / {weights} done ({time.perf_counter() - started:.0f} s)",
                  file=sys.stderr, flush=True)
    print(cost_table(rows, skipped))
    print(f"\n({time.perf_counter() - started:.0f} s in all)")


if __name__ == "__main__":
    main()
