"""Beyond this CPU, on paper: the engine's own scheduler driven by a cost model.

A step of the engine reads every weight once, reads the KV cache of every sequence in the
batch, and does about 2 x parameters FLOPs per new token. So its time is roughly

    step(new tokens n, cached tokens c) = overhead
        + max((weight bytes + c x KV bytes per token) / bandwidth, n x FLOPs per token / FLOP/s)

— the roofline of chapter 01 applied to one iteration: decode steps are memory-bound,
long prefills compute-bound. :class:`CostModel` is that formula. Its three machine numbers
are *measured* here (:meth:`CostModel.fit` to the engine's real step times) or *taken from
a data sheet* (:meth:`CostModel.for_model` with a GPU's bandwidth and FLOP/s), which is how
the chapter projects Llama-2-7B/70B-class models onto one GPU: a projection, not a
measurement.

:func:`simulate` runs the real :class:`~.scheduler.Scheduler` and
:class:`~.block_manager.BlockManager` on a trace with no model at all: each step advances a
simulated clock by the cost model's time, every running request receives a token (applied
by the scheduler, as in the engine), and each request's times come out as a
:class:`SimulatedRequest`, for the usual metrics (:mod:`minillm.serve.metrics`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from ..config import ModelConfig
from .block_manager import BlockManager
from .sampler import Sampled
from .scheduler import Scheduler, SchedulerConfig
from .sequence import Sequence
from .step import Step


class Arrival(Protocol):
    """A request of a trace (:class:`minillm.experiments.workload.TraceRequest`)."""

    arrival: float
    prompt: list[int]
    max_tokens: int


@dataclass
class SimulatedRequest:
    """A simulated request's times: when it arrived and when each token came, and its
    tokens (all 0: no model chose them)."""

    arrival_time: float
    tokens: list[int] = field(default_factory=list)
    token_times: list[float] = field(default_factory=list)
    finish_reason: str | None = None


@dataclass(frozen=True)
class CostModel:
    weight_bytes: float  # read once per step
    kv_bytes_per_token: float  # K and V of one cached token, all layers
    flops_per_token: float  # about 2 x parameters
    bandwidth: float  # bytes / s the machine sustains
    flops: float  # FLOP / s the machine sustains
    overhead: float = 0.0  # seconds per step spent outside the model (scheduling, launch)

    def step_time(self, new_tokens: int, cached_tokens: int) -> float:
        memory = (self.weight_bytes + cached_tokens * self.kv_bytes_per_token) / self.bandwidth
        compute = new_tokens * self.flops_per_token / self.flops
        return self.overhead + max(memory, compute)

    @classmethod
    def for_model(cls, config: ModelConfig, bandwidth: float, flops: float,
                  bytes_per_weight: float = 2.0, bytes_per_kv: float = 2.0,
                  overhead: float = 0.0) -> CostModel:
        """A model (from its config) on a machine given by its data-sheet numbers."""
        params = config.num_parameters()
        kv = 2 * config.num_layers * config.num_kv_heads * config.head_dim * bytes_per_kv
        return cls(params * bytes_per_weight, kv, 2.0 * params, bandwidth, flops, overhead)

    def fit(self, measured: list[tuple[int, int, float]]) -> CostModel:
        """The same model with bandwidth, FLOP/s and overhead fitted to measured steps
        ``(new tokens, cached tokens, seconds)``. Steps of at most 16 new tokens count as
        memory-bound (overhead + bytes / bandwidth), the others as compute-bound (overhead
        + FLOPs / FLOP/s); one least-squares fit finds the three numbers. If the steps
        cannot tell the overhead from the bytes (on a CPU every decode step reads about the
        same bytes, and noise decides), a number comes out negative: then the overhead is
        taken as 0 and each kind of step is fitted through the origin."""
        decodes = [(n, c, t) for n, c, t in measured if n <= 16]
        prefills = [(n, c, t) for n, c, t in measured if n > 16]
        if len(decodes) < 2 or not prefills:
            raise ValueError("fit needs at least two decode steps and one prefill step")
        rows = np.array([(1.0, self.weight_bytes + c * self.kv_bytes_per_token, 0.0)
                         for _, c, _ in decodes]
                        + [(1.0, 0.0, n * self.flops_per_token) for n, _, _ in prefills])
        times = np.array([t for *_, t in decodes + prefills])
        overhead, per_byte, per_flop = np.linalg.lstsq(rows, times, rcond=None)[0]
        if min(overhead, per_byte, per_flop) < 0:
            overhead = 0.0
            per_byte, per_flop = np.linalg.lstsq(rows[:, 1:], times, rcond=None)[0]
        return CostModel(self.weight_bytes, self.kv_bytes_per_token, self.flops_per_token,
                         1.0 / per_byte, 1.0 / per_flop, float(overhead))


def simulate(trace: list[Arrival], cost: CostModel, config: SchedulerConfig,
             num_blocks: int, block_size: int = 16,
             on_step: Callable[[float, Step, Scheduler], None] | None = None
             ) -> list[SimulatedRequest]:
    """Serve ``trace`` on a simulated clock; returns each request's times (trace order).
    ``on_step(clock, step, scheduler)`` is called after each step (the clock at its end)."""
    scheduler = Scheduler(config, BlockManager(num_blocks, block_size))
    pending = sorted(trace, key=lambda r: r.arrival)
    served: dict[int, SimulatedRequest] = {}
    clock = 0.0
    while pending or scheduler.has_work:
        while pending and pending[0].arrival <= clock:
            request = pending.pop(0)
            seq = Sequence(prompt=request.prompt, max_tokens=request.max_tokens,
                           arrival_time=request.arrival)
            scheduler.add(seq)
            served[seq.request_id] = SimulatedRequest(request.arrival)
        step = scheduler.schedule(now=clock)
        if not step.work:  # nothing may run yet: jump to the next arrival or deadline
            clock = _next_event(pending, scheduler, clock)
            continue
        cached = sum(seq.num_computed for seq, _ in step.work)
        clock += cost.step_time(step.num_tokens, cached)
        sampled = {seq.id: Sampled([0]) for seq, n in step.work
                   if seq.num_computed + n == seq.num_tokens}
        for delta in scheduler.apply(step, {}, sampled, now=clock):
            record = served[delta.request_id]
            record.tokens += delta.token_ids
            record.token_times += [delta.time] * len(delta.token_ids)
            record.finish_reason = delta.finish_reason
        if on_step is not None:
            on_step(clock, step, scheduler)
    return list(served.values())


def _next_event(pending: list[Arrival], scheduler: Scheduler, clock: float) -> float:
    """When something can next change, after a step with nothing to run: the next arrival,
    or the moment dynamic batching stops waiting to fill a batch (its oldest request has
    waited ``max_wait``)."""
    events = [pending[0].arrival] if pending else []
    if scheduler.config.policy == "dynamic" and scheduler.waiting:
        events.append(scheduler.waiting[0].arrival_time + scheduler.config.max_wait)
    later = [t for t in events if t > clock]
    if not later:
        raise RuntimeError(f"the simulation is stuck at {clock:.3f} s: requests are waiting "
                           "but none can run and nothing will arrive")
    return min(later)
