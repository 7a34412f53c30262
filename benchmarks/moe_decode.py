"""MoE decode on random layers: time per step and weight bytes read, against dense MLPs.

    python benchmarks/moe_decode.py                        # the recorded table
    python benchmarks/moe_decode.py --busy-ok --repeats 3  # a smoke run on a busy machine

A decode step of B sequences sends B tokens through each feed-forward layer. Three
layers of the same hidden size, fp32, random weights (``--layers`` of each, stacked like
a model's, so the weights do not sit in cache from one call to the next):

* MoE: ``--experts`` SwiGLU experts of width ``--expert-width``, top ``--top-k``
  (softmax routing, renormalised), :class:`minillm.moe.MoE`, the grouped dispatch;
* dense-active: one SwiGLU MLP of width k·I (the MoE's active parameters per token);
* dense-total: one SwiGLU MLP of width E·I (all the MoE's parameters).

Bytes read per step are counted from the routing (:func:`minillm.moe.expert_bytes_read`:
the router plus the distinct experts the B tokens chose); time is the median over
``--repeats`` of the steps' mean. At B = 1 the MoE reads k of E experts; as B grows its
tokens choose more distinct experts and its bytes climb towards the dense-total layer's.
The router's choices on random weights are near-uniform, which is the worst case for
bytes (trained routers are skewed). Timings are only honest on a quiet machine
(:func:`minillm.machine.quiet_problem`); ``--busy-ok`` marks the table as not for the
record.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from minillm.machine import describe, quiet_problem
from minillm.moe import MoE, SharedMLP, expert_bytes_read


def random_moe(args) -> MoE:
    layer = MoE(args.hidden, args.expert_width, args.experts, args.top_k, norm_topk_prob=True)
    with torch.no_grad():
        for parameter in layer.parameters():
            parameter.normal_(0, 0.02)
    return layer


def step_seconds(layers, batch: int, hidden: int, repeats: int, steps: int = 5) -> float:
    """Median over repeats of the mean time of one step through every layer."""
    x = torch.randn(batch, hidden)
    times = []
    with torch.no_grad():
        for _ in range(repeats + 1):  # the first is a warm-up
            start = time.perf_counter()
            for _ in range(steps):
                for layer in layers:
                    layer(x)
            times.append((time.perf_counter() - start) / steps)
    return statistics.median(times[1:])


def moe_bytes(layers, batch: int, args) -> tuple[int, float]:
    """Bytes one step of ``batch`` random tokens reads from the MoE layers, and the mean
    number of distinct experts per layer."""
    x = torch.randn(batch, args.hidden)
    with torch.no_grad():
        traffic = [expert_bytes_read(layer.gate(x)[0], args.experts, args.hidden,
                                     args.expert_width) for layer in layers]
    return sum(t.moe_bytes for t in traffic), sum(t.experts_used for t in traffic) / len(traffic)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--experts", type=int, default=32)
    parser.add_argument("--top-k", type=int, default=4)
    parser.add_argument("--expert-width", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--busy-ok", action="store_true")
    args = parser.parse_args(argv)
    problem = quiet_problem()
    if problem and not args.busy_ok:
        sys.exit(f"not timing: {problem} (--busy-ok to run anyway, not for the record)")
    torch.manual_seed(0)
    moes = [random_moe(args) for _ in range(args.layers)]
    active = [SharedMLP(args.hidden, args.top_k * args.expert_width) for _ in range(args.layers)]
    total = [SharedMLP(args.hidden, args.experts * args.expert_width) for _ in range(args.layers)]
    dense = {name: 3 * args.hidden * width * 4 * args.layers for name, width in
             (("active", args.top_k * args.expert_width),
              ("total", args.experts * args.expert_width))}
    print(f"{describe()}, {torch.get_num_threads()} threads"
          + (f"; BUSY ({problem}): not for the record" if problem else ""))
    print(f"{args.layers} layers, hidden {args.hidden}, {args.experts} experts of "
          f"{args.expert_width}, top {args.top_k}; fp32; MB read per step, ms per step")
    print(f"{'B':>3} {'experts used':>12} {'MoE MB':>7} {'MoE ms':>7} {'active MB':>9} "
          f"{'active ms':>9} {'total MB':>8} {'total ms':>8}")
    for batch in args.batches:
        read, used = moe_bytes(moes, batch, args)
        times = [step_seconds(layers, batch, args.hidden, args.repeats) * 1e3
                 for layers in (moes, active, total)]
        print(f"{batch:>3} {used:>12.1f} {read / 1e6:>7.1f} {times[0]:>7.2f} "
              f"{dense['active'] / 1e6:>9.1f} {times[1]:>9.2f} {dense['total'] / 1e6:>8.1f} "
              f"{times[2]:>8.2f}")


if __name__ == "__main__":
    main()
