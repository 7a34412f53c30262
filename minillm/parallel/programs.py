"""Rank programs: what each process runs in chapter 14's experiments.

``run_ranks(program, world, *args)`` starts ``world`` processes and calls
``program(rank, world, *args)`` on each; spawned processes import the program by name, so
it lives here, in a module (a function defined in a notebook cannot be imported by a new
process). The notebook, ``benchmarks/parallel.py`` and the tests share them:

* :func:`sharded_forward` — one forward under tensor (and optionally sequence)
  parallelism: the logits, the collectives counted, the activation bytes;
* :func:`pipelined_forward` — forwards through pipeline stages with micro-batches: the
  logits on the last stage and every stage's timeline of every repeat;
* :func:`timed_decode` — a greedy decode, every step timed, with the time spent in
  collectives;
* :func:`all_reduce_seconds` — what one all-reduce of a hidden-state vector costs.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from ..checkpoint import load_model
from ..reference import generate
from .layers import COLLECTIVES
from .loading import load_shard
from .pipeline import pipeline_forward, pipeline_stage
from .sequence import activation_bytes, sequence_parallel


def sharded_forward(rank: int, world: int, checkpoint: str, token_ids: list[list[int]],
                    shard_attention: bool = True, sequence: bool = False) -> dict:
    """Logits of ``token_ids`` from this rank's shard (``sequence``: with sequence
    parallelism), the collectives one forward ran, and its activation bytes per rank."""
    model = load_shard(checkpoint, rank, world, shard_attention=shard_attention)
    if sequence:
        model = sequence_parallel(model)
    ids = torch.tensor(token_ids)
    COLLECTIVES.clear()
    with torch.no_grad():
        logits = model(ids)
    collectives = dict(COLLECTIVES)
    return {"logits": logits, "collectives": collectives,
            "activation_bytes": activation_bytes(model, ids)}


def pipelined_forward(rank: int, world: int, checkpoint: str, token_ids: list[list[int]],
                      microbatch_counts: list[int], repeats: int = 1) -> dict:
    """This stage's timelines for each number of micro-batches (after one warm-up pass):
    ``runs[count]`` holds ``repeats`` of them (the counts taken in turn, so a slow moment
    of the machine touches each alike), ``timelines[count]`` the last; and the last
    stage's logits of the last run."""
    stage = pipeline_stage(load_model(checkpoint), rank, world)
    ids = torch.tensor(token_ids)
    pipeline_forward(stage, ids, microbatch_counts[0])  # warm-up
    runs, logits = {count: [] for count in microbatch_counts}, None
    for _ in range(repeats):
        for count in microbatch_counts:
            logits, timeline = pipeline_forward(stage, ids, count)
            runs[count].append(timeline)
    return {"logits": logits, "runs": runs,
            "timelines": {count: timelines[-1] for count, timelines in runs.items()}}


def _timed(collective, spent: list[float]):
    def call(*args, **kwargs):
        start = time.perf_counter()
        result = collective(*args, **kwargs)
        spent.append(time.perf_counter() - start)
        return result
    return call


def timed_decode(rank: int, world: int, checkpoint: str, prompts: list[list[int]],
                 new_tokens: int, shard_attention: bool = True) -> dict:
    """Greedy-decode ``new_tokens`` after ``prompts`` (one process: the plain model), and
    time the decode steps (the prefill excluded; ``step_s``: each step's seconds) and the
    part spent in collectives."""
    model = load_model(checkpoint) if world == 1 else \
        load_shard(checkpoint, rank, world, shard_attention=shard_attention)
    generate(model, prompts, 4)  # warm-up
    spent: list[float] = []
    if world > 1:  # this process only: count the time inside every collective
        dist.all_reduce = _timed(dist.all_reduce, spent)
        dist.all_gather = _timed(dist.all_gather, spent)
    marks = []
    tokens = generate(model, prompts, new_tokens,
                      on_token=lambda _: marks.append((time.perf_counter(), sum(spent))))
    (first, comm_first), (last, comm_last) = marks[0], marks[-1]
    return {"tokens": tokens, "decode_s": last - first, "comm_s": comm_last - comm_first,
            "steps": len(marks) - 1,
            "step_s": [b - a for (a, _), (b, _) in zip(marks, marks[1:], strict=False)]}


def all_reduce_seconds(rank: int, world: int, values: int, repeats: int = 500) -> float:
    """Mean seconds of one all-reduce of ``values`` fp32 numbers (after a warm-up)."""
    x = torch.randn(values)
    for _ in range(50):
        dist.all_reduce(x)
    start = time.perf_counter()
    for _ in range(repeats):
        dist.all_reduce(x)
    return (time.perf_counter() - start) / repeats
