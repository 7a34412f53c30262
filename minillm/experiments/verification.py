"""The cost of verifying n tokens of one sequence, r(n), for the speculative-decoding formula.

A speculative step verifies the newest token and γ guesses of a sequence in one forward
pass, so its speedup over plain decoding is τ / (r(γ+1) + γ·c), with

    r(n) = time of one forward pass over n new tokens of ONE sequence (its context cached)
           / time of one plain decode step of that sequence (n = 1).

This module times exactly that pass, the way the engine runs it: a
:class:`~minillm.engine.runner.ModelRunner` with the executor asked for (its model
prepared for it, as ``LLM`` prepares it) holds ``context`` tokens of one sequence in its
paged cache (one prefill pass, eager), then :meth:`~minillm.engine.runner.ModelRunner.forward`
is called on the flat batch a verification step lays out: tokens ``context ..
context + n - 1``, logits at each of them. The runner picks the executor per pass as in
the engine, so an executor that cannot verify (compiled: decode-only graphs) has its
n > 1 passes run eagerly, and the row says so (``ran_on``). Every pass writes the same
n slots of the pool, so the context never grows between repeats.

The context is random token ids (seeded): the time of a pass does not depend on them.
A **repeat** times every n once, each as the median of ``calls`` passes, n ascending on
even repeats and descending on odd ones (a drift of the machine's speed then falls on both
ends); r(n) is computed **within each repeat** (t(n) / t(1) of the same repeat) and
reported as the median over repeats with the smallest and largest.
"""

from __future__ import annotations

import copy
import statistics
import time
from dataclasses import dataclass

import torch

from ..engine.executors import resolve_executor
from ..engine.executors.batch import FlatBatch, SequenceWork, flat_batch
from ..engine.runner import ModelRunner
from ..model import Transformer
from ..quant.int8_activations import to_int8_activations
from .decode import QUANTIZED, quantized_reference

WEIGHTS = ("fp32", "W8A8", "W4A8")
EXECUTORS = ("eager", "compiled", "native")
BLOCK_SIZE = 16


def weight_format(plain: Transformer, weights: str) -> Transformer:
    """``plain`` in one of :data:`WEIGHTS`, as ``benchmarks/batched.py`` makes them: fp32
    as loaded; W8A8 (per-channel int8) and W4A8 (int4 in groups of 32, a float minimum)
    RTN-quantized with int8 activations and an int8 embedding."""
    if weights == "fp32":
        return plain
    scheme = {"W8A8": QUANTIZED["int8"], "W4A8": QUANTIZED["int4"]}[weights]
    return to_int8_activations(quantized_reference(copy.deepcopy(plain), scheme))


@dataclass(frozen=True)
class CostRow:
    """One executor and weight format: ``seconds[k][n - 1]`` is repeat k's time of a pass
    over n tokens (the median of its calls); ``ran_on[n - 1]`` the executor that ran it."""

    executor: str
    weights: str
    ran_on: tuple[str, ...]
    seconds: tuple[tuple[float, ...], ...]

    def ratios(self, n: int) -> list[float]:
        """r(n) of every repeat: its time over n tokens / its time over one."""
        return [times[n - 1] / times[0] for times in self.seconds]

    def ratio(self, n: int) -> tuple[float, float, float]:
        """(median, smallest, largest) of r(n) over the repeats."""
        values = self.ratios(n)
        return statistics.median(values), min(values), max(values)

    @property
    def decode_ms(self) -> float:
        """The median over repeats of one decode step's time (n = 1), in ms."""
        return 1e3 * statistics.median(times[0] for times in self.seconds)


def verification_batch(runner: ModelRunner, tokens: list[int], start: int,
                       block_table: list[int]) -> FlatBatch:
    """One sequence's ``tokens`` at positions ``start ..``, logits at every one of them
    (a verification's layout: the newest token and its guesses)."""
    work = SequenceWork(tokens, start, block_table, len(tokens))
    return flat_batch([work], [], runner.cache.block_size, runner.slot_mapping,
                      runner.model.device)


def measure_row(model: Transformer, executor: str, weights: str = "fp32", max_n: int = 8,
                context: int = 128, repeats: int = 7, calls: int = 5, warmup: int = 2,
                seed: int = 0) -> CostRow:
    """r(n), n = 1 .. ``max_n``, of ``model`` (already in its weight format, named by
    ``weights``) on ``executor`` with ``context`` tokens cached (module docstring).
    An executor the model cannot run raises ValueError with the reason."""
    if context + max_n > model.config.max_position_embeddings:
        raise ValueError(f"context {context} + {max_n} new tokens is past the model's "
                         f"{model.config.max_position_embeddings} positions")
    resolve_executor(model, executor)  # refuses with the reason
    blocks = -(-(context + max_n) // BLOCK_SIZE)
    runner = ModelRunner(model, num_blocks=blocks + 1, block_size=BLOCK_SIZE,
                         executor=executor)
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(model.config.vocab_size, (context + max_n,), generator=generator)
    ids = ids.tolist()
    table = list(range(1, blocks + 1))
    runner.forward(verification_batch(runner, ids[:context], 0, table))  # the context
    batches = [verification_batch(runner, ids[context:context + n], context, table)
               for n in range(1, max_n + 1)]
    chosen = [runner.executor_for(batch) for batch in batches]

    def timed(n: int) -> float:
        times = []
        for _ in range(calls):
            started = time.perf_counter()
            runner.forward(batches[n - 1], chosen[n - 1])
            times.append(time.perf_counter() - started)
        return statistics.median(times)

    order = list(range(1, max_n + 1))
    for _ in range(warmup):  # the compiled executor compiles its graph here
        for n in order:
            timed(n)
    seconds = []
    for k in range(repeats):
        times = {n: timed(n) for n in (order if k % 2 == 0 else order[::-1])}
        seconds.append(tuple(times[n] for n in order))
    runner.close()
    return CostRow(executor, weights, tuple(e.name for e in chosen), tuple(seconds))


def cost_table(rows: list[CostRow], skipped: dict[str, str] | None = None) -> str:
    """The markdown table: a row per executor/weights, r(n) as median [min–max] per column,
    the absolute time of n = 1, and what ran n > 1 when it was not the executor itself."""
    max_n = max((len(row.ran_on) for row in rows), default=1)
    lines = ["| executor / weights | n = 1 ms | " +
             " | ".join(f"r({n})" for n in range(1, max_n + 1)) + " | n > 1 ran on |",
             "|---|---:|" + "---:|" * max_n + "---|"]
    for row in rows:
        cells = []
        for n in range(1, len(row.ran_on) + 1):
            median, low, high = row.ratio(n)
            cells.append("1.00" if n == 1 else f"{median:.2f} [{low:.2f}–{high:.2f}]")
        others = sorted(set(row.ran_on[1:]))
        lines.append(f"| {row.executor} / {row.weights} | {row.decode_ms:.2f} | " +
                     " | ".join(cells) + f" | {', '.join(others)} |")
    for name, reason in (skipped or {}).items():
        lines.append(f"| {name} | skipped: {reason} |" + " |" * (max_n + 1))
    return "\n".join(lines)
