"""Pipeline parallelism: the layers split into consecutive stages, one per process.

Rank ``s`` of ``p`` keeps a run of consecutive layers (the first stage also the embedding,
the last also the final norm and the LM head) and passes its output, the hidden states,
to rank ``s + 1``. One send per stage boundary replaces tensor parallelism's two
all-reduces per layer, so stages can sit on machines joined by a slow network; the price
is that the stages work one after another on the same data.

**GPipe** (Huang et al. 2019) cuts the batch into ``m`` micro-batches. Stage 0 sends
micro-batch 0 on as soon as it is done and starts micro-batch 1, so every stage is busy
once the pipeline is full. It still has to fill and drain: with equal stage times ``t``,
the last micro-batch leaves stage ``p - 1`` after ``(m + p - 1) t``, while each stage
works only ``m t`` of it. The idle share, the **bubble**, is

    bubble = (p - 1) / (m + p - 1)

(§2.3 of the paper): 1/2 for 2 stages and one micro-batch, 1/9 with 8. More micro-batches
shrink it, but each is smaller and uses the hardware less well. In training, GPipe runs
every forward and then every backward, the same bubble again, and each stage holds the
activations of all ``m`` micro-batches until their backward comes.

**1F1B** (PipeDream-Flush, Narayanan et al. 2021, §2.2) reorders each stage's work:
stage ``s`` runs ``p - s - 1`` warm-up forwards, then alternates one forward and one
backward, then finishes the remaining backwards. Its bubble is GPipe's, but a
micro-batch's backward now comes soon after its forward, so a stage holds at most ``p``
micro-batches' activations instead of ``m``: the reason 1F1B exists.

This module has two halves.

* A cost model: :func:`schedule` simulates either schedule (each operation starts as soon
  as its stage is free and its input has arrived; sends are free), :func:`bubble_fraction`
  and :func:`peak_in_flight` measure the result, :func:`gpipe_bubble` is the formula.
  Stage times may differ: the slowest stage then sets the pace of the whole pipeline.
* Real pipelined inference on torch.distributed: :func:`pipeline_stage` keeps a rank's
  share of a :class:`~minillm.model.Transformer`, :func:`pipeline_forward` runs a GPipe
  forward over whole sequences (the prefill case: no KV cache) and records when each
  stage computed, so :func:`measured_bubble` gives the bubble of a real run.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from ..model import Transformer
from ..transform import copy_modules

SCHEDULES = ("gpipe", "1f1b")


@dataclass(frozen=True)
class Event:
    """Stage ``stage`` working on micro-batch ``microbatch`` from ``start`` to ``end``;
    ``phase`` is ``"F"`` (forward) or ``"B"`` (backward)."""

    stage: int
    microbatch: int
    phase: str
    start: float
    end: float


# --- the cost model ---------------------------------------------------------------------


def gpipe_bubble(stages: int, microbatches: int) -> float:
    """The share of time a stage is idle in GPipe with equal stage times: (p-1)/(m+p-1)."""
    return (stages - 1) / (microbatches + stages - 1)


def _per_stage(duration: float | Sequence[float], stages: int, name: str) -> list[float]:
    """One duration per stage, from a single number (every stage alike) or a list."""
    if isinstance(duration, int | float):
        return [float(duration)] * stages
    durations = [float(d) for d in duration]
    if len(durations) != stages:
        raise ValueError(f"{name} has {len(durations)} values for {stages} stages; give one "
                         "number for every stage or one per stage")
    return durations


def stage_order(kind: str, stage: int, stages: int, microbatches: int,
                backward: bool = True) -> list[tuple[str, int]]:
    """The order in which ``stage`` runs its work, as (phase, micro-batch) pairs.

    GPipe: every forward, then every backward. 1F1B: ``stages - stage - 1`` warm-up
    forwards, then one forward and one backward in turn, then the remaining backwards.
    Without a backward (inference) both are just the forwards in order.
    """
    if kind not in SCHEDULES:
        raise ValueError(f"unknown pipeline schedule {kind!r}; choose one of {SCHEDULES}")
    forwards = [("F", i) for i in range(microbatches)]
    backwards = [("B", i) for i in range(microbatches)]
    if not backward:
        return forwards
    if kind == "gpipe":
        return forwards + backwards
    warmup = min(stages - stage - 1, microbatches)
    order = forwards[:warmup]
    for i in range(microbatches - warmup):
        order += [forwards[warmup + i], backwards[i]]
    return order + backwards[microbatches - warmup:]


def _input_of(stage: int, phase: str, microbatch: int, stages: int):
    """The operation whose output this one consumes, as (stage, phase, micro-batch), or None.

    A forward reads the previous stage's forward of the same micro-batch; a backward reads
    the next stage's backward (the last stage's backward starts from its own forward).
    """
    if phase == "F":
        return (stage - 1, "F", microbatch) if stage > 0 else None
    return (stage + 1, "B", microbatch) if stage < stages - 1 else (stage, "F", microbatch)


def schedule(kind: str, stages: int, microbatches: int,
             forward_time: float | Sequence[float] = 1.0,
             backward_time: float | Sequence[float] = 0.0) -> list[Event]:
    """Simulate a ``"gpipe"`` or ``"1f1b"`` pipeline: every operation of every stage, timed.

    Each stage runs its :func:`stage_order`; an operation starts as soon as its stage has
    finished the previous one and its input has been computed (communication is free).
    ``forward_time`` / ``backward_time``: one per micro-batch, for every stage alike or as
    a list per stage. ``backward_time=0`` (the default) is inference: forwards only.
    Events come sorted by start time, then stage.
    """
    if stages < 1 or microbatches < 1:
        raise ValueError(f"a pipeline needs at least one stage and one micro-batch, got "
                         f"{stages} stages and {microbatches} micro-batches")
    duration = {"F": _per_stage(forward_time, stages, "forward_time"),
                "B": _per_stage(backward_time, stages, "backward_time")}
    has_backward = any(duration["B"])
    waiting = [deque(stage_order(kind, s, stages, microbatches, has_backward))
               for s in range(stages)]
    finished: dict[tuple[int, str, int], float] = {}  # (stage, phase, micro-batch) -> end
    stage_free = [0.0] * stages
    events = []
    while any(waiting):
        for stage, queue in enumerate(waiting):
            while queue:
                phase, microbatch = queue[0]
                needed = _input_of(stage, phase, microbatch, stages)
                if needed is not None and needed not in finished:
                    break  # its input is not computed yet: look at the other stages first
                queue.popleft()
                start = max(stage_free[stage], finished.get(needed, 0.0))
                end = start + duration[phase][stage]
                finished[stage, phase, microbatch] = stage_free[stage] = end
                events.append(Event(stage, microbatch, phase, start, end))
    return sorted(events, key=lambda e: (e.start, e.stage))


def bubble_fraction(events: Sequence[Event]) -> float:
    """Idle time over all stages / (stages x makespan): the share of the pipeline wasted."""
    stages = len({e.stage for e in events})
    makespan = max(e.end for e in events) - min(e.start for e in events)
    busy = sum(e.end - e.start for e in events)
    return 1.0 - busy / (stages * makespan)


def peak_in_flight(events: Sequence[Event], stage: int) -> int:
    """The most micro-batches ``stage`` holds at once: forward done, backward not yet.

    Each of them keeps its activations for the backward, so this is the stage's peak
    activation memory in micro-batches: ``m`` under GPipe, at most ``p`` under 1F1B.
    """
    mine = [e for e in events if e.stage == stage]
    if not any(e.phase == "B" for e in mine):
        raise ValueError("peak_in_flight needs a schedule with a backward pass "
                         "(backward_time > 0); inference keeps no activations for later")
    # a backward's release sorts before a forward's arrival at the same instant
    changes = sorted((e.end, e.phase == "F") for e in mine)
    held = peak = 0
    for _, is_forward in changes:
        held += 1 if is_forward else -1
        peak = max(peak, held)
    return peak


# --- pipelined inference on torch.distributed --------------------------------------------


def stage_layers(num_layers: int, rank: int, world: int) -> range:
    """The layers stage ``rank`` of ``world`` keeps: consecutive, balanced, the first
    ``num_layers % world`` stages one more (30 layers over 4 stages: 8, 8, 7, 7)."""
    if world < 1:
        raise ValueError(f"a pipeline needs at least one stage, got world size {world}")
    if world > num_layers:
        raise ValueError(f"cannot split {num_layers} layers into {world} pipeline stages: "
                         f"every stage needs at least one layer; use at most {num_layers} "
                         "ranks")
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is not one of the {world} ranks 0..{world - 1}")
    per_stage, extra = divmod(num_layers, world)
    first = rank * per_stage + min(rank, extra)
    return range(first, first + per_stage + (rank < extra))


class PipelineStage(nn.Module):
    """One rank's share of a Transformer: the model itself, trimmed to a run of consecutive
    layers, with the embedding on the first stage and the final norm and LM head on the last
    (the others hold None). It runs the model's own embedding, layer loop
    (:meth:`~minillm.model.Transformer.run_layers`) and head.

    ``forward`` takes token ids on the first stage and hidden states elsewhere; it returns
    logits on the last stage and hidden states elsewhere.
    """

    def __init__(self, model: Transformer, rank: int, world: int):
        super().__init__()
        self.model, self.config, self.rank, self.world = model, model.config, rank, world

    @property
    def layers(self) -> nn.ModuleList:
        return self.model.layers

    @property
    def embed_tokens(self) -> nn.Embedding | None:
        return self.model.embed_tokens

    @property
    def norm(self) -> nn.Module | None:
        return self.model.norm

    @property
    def lm_head(self) -> nn.Module | None:
        return self.model.lm_head

    @property
    def is_first(self) -> bool:
        return self.rank == 0

    @property
    def is_last(self) -> bool:
        return self.rank == self.world - 1

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the hidden states passed between stages."""
        return self.layers[0].attn_norm.weight.dtype

    def forward(self, x, inputs):
        """``inputs``: the whole model's :meth:`~minillm.model.Transformer.layer_inputs`."""
        if self.is_first:
            x = self.model.embed(x)
        x = self.model.run_layers(x, inputs)
        return self.model.head(x) if self.is_last else x


def pipeline_stage(model: Transformer, rank: int, world: int) -> PipelineStage:
    """Rank ``rank``'s stage of a ``world``-stage pipeline, made of ``model``'s weights.

    The stage is a copy of ``model`` (sharing its tensors; ``model`` is not changed) trimmed
    to :func:`stage_layers`, plus the embedding on rank 0 and the final norm and LM head on
    the last rank: once the caller lets ``model`` go, the rest is freed. With tied
    embeddings the last stage's head still holds the embedding matrix (it is the head's
    weight) though the embedding module is dropped.
    """
    layers = stage_layers(model.config.num_layers, rank, world)
    stage = copy_modules(model)
    stage.layers = nn.ModuleList(stage.layers[layers.start:layers.stop])
    if rank > 0:
        stage.embed_tokens = None
    if rank < world - 1:
        stage.norm = stage.lm_head = None
    return PipelineStage(stage, rank, world)


@torch.no_grad()
def pipeline_forward(stage: PipelineStage, input_ids: torch.Tensor,
                     microbatches: int) -> tuple[torch.Tensor | None, list[Event]]:
    """A GPipe forward of ``input_ids`` [batch, seq] in ``microbatches`` pieces; every rank
    calls it with the same shape (only the first stage reads the token ids).

    Returns the logits [batch, seq, vocab] on the last stage (None elsewhere) and this
    stage's timeline: one :class:`Event` per micro-batch, from the start to the end of its
    compute, so waiting for the previous stage shows as idle time. Times are seconds of
    ``time.perf_counter`` since a barrier that all ranks leave together (to within the
    barrier's latency, ~0.1 ms on gloo over loopback): the ranks share that origin, on one
    machine or several.
    """
    batch, seq = input_ids.shape
    if microbatches < 1 or batch % microbatches:
        raise ValueError(f"a batch of {batch} sequences does not split into {microbatches} "
                         "equal micro-batches; choose a micro-batch count that divides the "
                         "batch size")
    size = batch // microbatches
    inputs = stage.model.layer_inputs(seq, input_ids.device)
    in_transit, outputs, timeline = [], [], []
    dist.barrier()
    origin = time.perf_counter()
    for i, tokens in enumerate(input_ids.split(size)):
        if stage.is_first:
            x = tokens
        else:
            x = torch.empty(size, seq, stage.config.hidden_size, dtype=stage.dtype)
            dist.recv(x, src=stage.rank - 1, tag=i)
        start = time.perf_counter() - origin
        y = stage(x, inputs)
        timeline.append(Event(stage.rank, i, "F", start, time.perf_counter() - origin))
        if stage.is_last:
            outputs.append(y)
        else:  # isend: start the next micro-batch while this one travels
            in_transit.append((dist.isend(y, dst=stage.rank + 1, tag=i), y))
    for request, _ in in_transit:
        request.wait()
    return (torch.cat(outputs) if stage.is_last else None), timeline


def measured_bubble(timelines: Sequence[Sequence[Event]]) -> float:
    """The bubble of a real run, from every stage's :func:`pipeline_forward` timeline."""
    return bubble_fraction([event for timeline in timelines for event in timeline])
