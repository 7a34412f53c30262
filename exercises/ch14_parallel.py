# Generated from solutions/ch14_parallel.py by `python -m minillm.grading.exercises`.
# Fill in the parts that raise NotImplementedError; do not edit the rest.
"""Chapter 14: parallelism — cutting weights into tensor-parallel shards, where the MLP's
all-reduce goes, the GPipe bubble, the bytes a tensor-parallel rank sends per token, the ring
all-reduce that sends them, and a pipeline schedule builder (GPipe and 1F1B)."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from minillm.parallel.pipeline import Event


def shard_weight(weight: torch.Tensor, dim: int, rank: int, world: int) -> torch.Tensor:
    """Exercise 14.1: Rank ``rank``'s contiguous slice of a weight along ``dim``, as a copy.

    Tensor parallelism over ``world`` ranks keeps one of ``world`` equal, consecutive parts
    of every weight on each rank. For an ``nn.Linear`` weight [out, in] (y = x Wᵀ):
    ``dim=0`` cuts the output rows (column-parallel: rank r computes its own slice of y
    from the whole x), ``dim=1`` the input columns (row-parallel: rank r computes a
    partial sum of y from its slice of x). With ``part = size / world``, rank r keeps
    indices [r·part, (r + 1)·part) along ``dim``; a 1-D bias is cut along dim 0.

    The result must be a tensor of its own (same dtype), not a view: a view keeps the
    whole weight's storage alive, and the point of sharding is that the rank frees the
    rest. A size that does not divide by ``world`` raises ValueError saying so (uneven
    shards would break the equal split the collectives rely on).
    """
    raise NotImplementedError("Exercise 14.1: Rank ``rank``'s contiguous slice of a weight along ``dim``, as a copy")


def unshard(shards: Sequence[torch.Tensor], dim: int) -> torch.Tensor:
    """Exercise 14.1: The whole weight again from every rank's shard (in rank order).

    The inverse of :func:`shard_weight`: ``unshard([shard_weight(w, dim, r, t) for r in
    range(t)], dim)`` equals ``w``. The shards lie side by side along ``dim``: this is what
    an all-gather along that dimension returns (the way the LM head's logits come back).
    """
    raise NotImplementedError("Exercise 14.1: The whole weight again from every rank's shard (in rank order)")


def parallel_mlp(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor,
                 world: int) -> list[torch.Tensor]:
    """Exercise 14.2: A tensor-parallel SwiGLU MLP on simulated ranks: each rank's partial sum.

    The MLP is down(silu(x gateᵀ) * (x upᵀ)) with nn.Linear-style weights: gate and up
    [intermediate, hidden], down [hidden, intermediate]; x [..., hidden]. Rank r keeps the
    column-parallel shards of gate and up (rows [r·part, (r + 1)·part), part =
    intermediate / world, as ``shard_weight(·, 0, r, world)``) and the row-parallel shard
    of down (the same columns, ``shard_weight(down, 1, r, world)``), and computes

        partial_r = (silu(x gate_rᵀ) * (x up_rᵀ)) down_rᵀ        [..., hidden]

    silu and the product are elementwise, so rank r's slice of the intermediate
    activation needs only its own slices of gate and up: no communication until down.
    down's row shard turns the slice into a partial sum: Σ_r partial_r is the MLP's
    output. That sum is the one all-reduce of the MLP (Megatron-LM §3): after down, not
    after gate/up. Returns [partial_0, ..., partial_{world-1}].
    """
    raise NotImplementedError("Exercise 14.2: A tensor-parallel SwiGLU MLP on simulated ranks: each rank's partial sum")


def all_reduce(partials: Sequence[torch.Tensor]) -> torch.Tensor:
    """Exercise 14.2: What an all-reduce leaves on every rank: the sum of the partials.

    ``torch.distributed.all_reduce`` adds every rank's tensor elementwise and gives each
    rank the total; in one process, that is the sum of the list (a new tensor; the
    partials are left as they are).
    """
    raise NotImplementedError("Exercise 14.2: What an all-reduce leaves on every rank: the sum of the partials")


def gpipe_bubble(stages: int, microbatches: int) -> float:
    """Exercise 14.3: The GPipe bubble, the share of time a stage is idle: (p − 1)/(m + p − 1).

    p stages of equal time t, m micro-batches (GPipe, Huang et al. 2019, §2.3). The last
    micro-batch leaves the last stage after (m + p − 1)·t; each stage works m·t of that and
    waits the other (p − 1)·t while the pipeline fills and drains. So the idle share is
    (p − 1) / (m + p − 1): 0 for one stage, (p − 1)/p for one micro-batch. Fewer than one
    stage or micro-batch raises ValueError.
    """
    raise NotImplementedError("Exercise 14.3: The GPipe bubble, the share of time a stage is idle: (p − 1)/(m + p − 1)")


def pipeline_time(stage_time: float, stages: int, microbatches: int) -> float:
    """Exercise 14.3: How long a GPipe forward of m micro-batches takes: (m + p − 1)·t.

    Every stage takes ``stage_time`` t per micro-batch. Micro-batch 0 reaches the last
    stage after (p − 1)·t; from then on one micro-batch leaves every t. Fewer than one
    stage or micro-batch raises ValueError.
    """
    raise NotImplementedError("Exercise 14.3: How long a GPipe forward of m micro-batches takes: (m + p − 1)·t")


def all_reduce_bytes(message_bytes: float, world: int) -> float:
    """Exercise 14.4: Bytes each rank sends in a ring all-reduce of n bytes: 2(t − 1)/t · n.

    A ring all-reduce is a reduce-scatter then an all-gather. Each of the t ranks owns one
    chunk of n/t bytes; in t − 1 steps of the reduce-scatter every rank sends one chunk to
    its neighbour (which adds its own), and in t − 1 steps of the all-gather it passes the
    summed chunks on: 2(t − 1) chunks of n/t bytes. Nearly 2n for large t, and nothing for
    t = 1. A world size below 1 raises ValueError.
    """
    raise NotImplementedError("Exercise 14.4: Bytes each rank sends in a ring all-reduce of n bytes: 2(t − 1)/t · n")


def tp_bytes_per_token(hidden: int, layers: int, world: int, bytes_per_value: int = 2) -> float:
    """Exercise 14.4: Bytes a tensor-parallel rank sends per token in all the blocks.

    Each block all-reduces twice (attention's output and the MLP's, Megatron §3), each
    time a ``hidden``-vector of ``bytes_per_value`` bytes per value:

        layers · 2 · 2(t − 1)/t · hidden · bytes_per_value

    Llama-2-7B (hidden 4096, 32 layers) in fp16 at t = 2: 524,288 bytes per token. A world
    size below 1 raises ValueError.
    """
    raise NotImplementedError("Exercise 14.4: Bytes a tensor-parallel rank sends per token in all the blocks")


def ring_all_reduce(tensors: Sequence[torch.Tensor]
                    ) -> tuple[list[torch.Tensor], list[tuple[int, int, int]]]:
    """Exercise 14.5: A ring all-reduce simulated chunk by chunk: reduce-scatter, all-gather.

    ``tensors[r]`` is rank r's tensor (all the same shape). Flatten each and cut it into
    ``t = len(tensors)`` chunks with ``tensor_split`` (chunk c of every rank covers the same
    elements). Rank r sends only to rank (r + 1) % t, one chunk per step, all ranks at once:

    * reduce-scatter, steps s = 0 .. t − 2: rank r sends its chunk (r − s) % t, and the
      receiver **adds** it to its own chunk of that index. Afterwards rank r holds the full
      sum of chunk (r + 1) % t;
    * all-gather, steps s = 0 .. t − 2: rank r sends its chunk (r + 1 − s) % t, and the
      receiver **replaces** its chunk of that index with it.

    Return every rank's result, reshaped like its input (the inputs are left unchanged),
    and the messages in the order sent, as (sender, receiver, chunk): 2(t − 1) steps of t
    messages, so each rank sends 2(t − 1) chunks of about n/t values (exercise 14.4).
    Within a step, every rank sends what it held before the step.
    """
    raise NotImplementedError("Exercise 14.5: A ring all-reduce simulated chunk by chunk: reduce-scatter, all-gather")


def stage_order(kind: str, stage: int, stages: int, microbatches: int,
                backward: bool = True) -> list[tuple[str, int]]:
    """Exercise 14.6: The order in which one pipeline stage runs its work, GPipe or 1F1B.

    Returns (phase, micro-batch) pairs, phase ``"F"`` (forward) or ``"B"`` (backward), for
    stage ``stage`` of p = ``stages``, with m = ``microbatches``:

    * ``"gpipe"``: every forward, then every backward: F0 F1 .. F(m-1) B0 B1 .. B(m-1);
    * ``"1f1b"`` (PipeDream-Flush): p − stage − 1 warm-up forwards (m if that is fewer),
      then one forward and one backward in turn until the forwards run out, then the
      remaining backwards. Stage 0 of 4 with m = 6: F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5;
      the last stage alternates from the start: F0 B0 F1 B1 ...

    Backward passes belong to training. 1F1B exists for training memory: a micro-batch's
    backward comes soon after its forward, so a stage holds at most p micro-batches'
    activations instead of m. Inference (``backward=False``) runs forwards only, and both
    schedules are then F0 .. F(m-1). Any other ``kind`` raises ValueError.
    Hint: build the list of forwards and the list of backwards, then take from them.
    """
    raise NotImplementedError("Exercise 14.6: The order in which one pipeline stage runs its work, GPipe or 1F1B")


def simulate_pipeline(orders: Sequence[Sequence[tuple[str, int]]],
                      forward_times: Sequence[float],
                      backward_times: Sequence[float]) -> list[Event]:
    """Exercise 14.6: Time every operation of a pipeline, given each stage's order.

    ``orders[s]`` is stage s's work as (phase, micro-batch) pairs (:func:`stage_order`);
    on stage s a forward takes ``forward_times[s]`` and a backward ``backward_times[s]``,
    so a slow stage can be modelled. Each stage runs its operations one at a time, in its
    order, and an operation starts as soon as

    * its stage has finished its previous operation, and
    * its input has been computed (sends take no time): a forward needs the previous
      stage's forward of the same micro-batch (stage 0 has its input at time 0); a
      backward needs the next stage's backward of the same micro-batch, and the last
      stage's backward needs its own forward (which computed the loss).

    So start = max(when the stage is free, when the input ended), end = start + duration.
    Returns one :class:`~minillm.parallel.pipeline.Event` ``(stage, microbatch, phase,
    start, end)`` per operation, sorted by start time, then stage. Orders that can never
    all run (an operation waiting for one that waits for it, like the last stage's B0
    before its F0) raise ValueError.
    Hint: keep each stage's operations still to run and a dict of end times by (stage,
    phase, micro-batch). Sweep over the stages again and again, each running its next
    operations while their inputs have ended; a sweep that runs nothing is stuck.
    """
    raise NotImplementedError("Exercise 14.6: Time every operation of a pipeline, given each stage's order")
