"""Tensor parallelism on this CPU: SmolLM2 decode tokens/s with 1, 2 and 3 processes.

    python benchmarks/parallel.py                  # the table in docs/benchmarks.md
    python benchmarks/parallel.py --tokens 32      # shorter runs

Each row decodes ``--tokens`` greedy tokens after a 32-token prompt, at batch 1 and 8,
with the plain ``generate`` loop (contiguous KV cache) on every rank:

* TP 1: one process, the plain model, using both cores (torch threads = 2);
* TP 2, MLP + vocabulary: 2 processes, one thread each; attention replicated (SmolLM2's
  3 KV heads do not split 2 ways), the MLP and the embedding/head sharded: one
  all-reduce per block + the embedding's, one all-gather of the logits;
* TP 3, KV groups: 3 processes on 2 cores (one is always waiting for a core), everything
  sharded: two all-reduces per block.

First, the latency of one gloo all-reduce of a hidden-state vector (576 fp32 values, and
8 of them for batch 8) on 2 and 3 processes: a decode step runs 2 per block.

"comm" is the share of rank 0's decode time spent inside collectives (gloo over
127.0.0.1), waiting for the other ranks included. The speedup is over TP 1 in the same
run; the tokens are compared with TP 1's (all rows must say "same").
"""

from __future__ import annotations

import argparse

import torch

from minillm.parallel.launch import run_ranks
from minillm.parallel.programs import all_reduce_seconds, timed_decode

SETUPS = [("TP 1", 1, True), ("TP 2, MLP + vocabulary", 2, False), ("TP 3, KV groups", 3, True)]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=64, help="tokens decoded per row")
    args = parser.parse_args(argv)
    generator = torch.Generator().manual_seed(0)
    print(f"SmolLM2, greedy, 32-token prompts, {args.tokens} decoded tokens; "
          f"{torch.get_num_threads()} threads available\n")
    print("| processes | values | one all-reduce, ms |\n|---:|---:|---:|")
    for world in (2, 3):
        for values in (576, 8 * 576):
            seconds = run_ranks(all_reduce_seconds, world, values, timeout=300)[0]
            print(f"| {world} | {values} | {1000 * seconds:.2f} |", flush=True)
    print()
    print("| setup | batch | tok/s | comm | vs TP 1 | tokens |")
    print("|---|---:|---:|---:|---:|---|")
    for batch in (1, 8):
        prompts = torch.randint(100, 40000, (batch, 32), generator=generator).tolist()
        baseline = None
        for name, world, shard_attention in SETUPS:
            result = run_ranks(timed_decode, world, "smollm2", prompts, args.tokens,
                               shard_attention, timeout=900)[0]
            rate = batch * result["steps"] / result["decode_s"]
            baseline = baseline or (rate, result["tokens"])
            same = "same" if result["tokens"] == baseline[1] else "DIFFERENT"
            print(f"| {name} | {batch} | {rate:.1f} | "
                  f"{result['comm_s'] / result['decode_s']:.0%} | {rate / baseline[0]:.2f}x "
                  f"| {same} |", flush=True)


if __name__ == "__main__":
    main()
