"""The course's techniques switched on one at a time, on one trace (chapter 15's capstone).

Every row serves the same requests greedily, each with its own ``max_tokens`` and the
tokenizer's stop tokens, all submitted at once, and reports

* **throughput**: generated tokens over the wall time of the whole trace;
* **P95 TTFT and TPOT** over requests (one-at-a-time rows start each request's clock when
  that request starts; engine rows when it was submitted, so queueing counts);
* **memory**: the bytes of the weights (rank 0's under tensor parallelism), and of the KV
  cache at its peak — blocks held × bytes per block for the engine (rounding waste
  included), tokens held × bytes per token for one request at a time;
* **lossless**: how many requests got exactly the tokens of the course's reference loop
  (greedy decoding must not change them; rows that change the weights are compared for
  information, with their **perplexity** beside them).

The rows (:func:`capstone_rows`) are the chapters in order: Hugging Face ``generate``, the
reference loop's KV cache with every query head's own copy of its K/V head (MHA-style,
chapter 3), the cache of the KV heads only (GQA, chapter 4), the engine's native decode
step one request at a time (chapters 1–2: weights streamed by a loop that reads them at
memory speed), continuous batching over paged blocks with eager steps (chapters 12–13),
the same with native decode steps, prefix caching, speculation (chapter 11), int8 weights
× int8 activations (chapter 6) and tensor parallelism (chapter 14). Used by
``benchmarks/capstone.py`` and the chapter 15 notebook.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial

import numpy as np
import torch

from ..checkpoint import resolve_checkpoint
from ..config import ModelConfig
from ..generate import generate
from ..gqa import expand_kv_heads
from ..kv_cache import kv_cache_bytes
from ..model import Transformer
from ..quant import QuantScheme, quantize_model
from ..quant.embedding import compact_embedding
from ..quant.int8_activations import to_int8_activations
from ..quant.qlinear import model_nbytes
from ..reference import generate as reference_generate
from ..sampling import SamplingParams
from ..serve import LLM, SchedulerConfig
from ..serve.metrics import summarize
from .workload import TraceRequest

MAX_BATCH = 16  # sequences per engine step in every engine row
PLAIN = "+ GQA-aware KV cache"  # the reference loop: the tokens every row is compared with


@dataclass(frozen=True)
class CapstoneRow:
    name: str
    tokens: list[list[int]]  # each request's generated tokens
    seconds: float
    ttft_p95: float
    tpot_p95: float
    weight_bytes: int
    kv_bytes: int  # at the peak
    perplexity: float | None = None  # measured for rows whose weights differ from plain's

    @property
    def throughput(self) -> float:
        return sum(map(len, self.tokens)) / self.seconds


# -- one request at a time -----------------------------------------------------------------

Runner = Callable[[list[int], int, Callable[[], None]], list[int]]


def one_at_a_time(name: str, run: Runner, trace: list[TraceRequest], config: ModelConfig,
                  weight_bytes: int) -> CapstoneRow:
    """Serve the trace request by request with ``run(prompt, max_tokens, on_first_token)``
    -> tokens, after one untimed request (compiling happens there)."""
    run(trace[0].prompt, 4, lambda: None)
    tokens, ttfts, tpots = [], [], []
    start = time.perf_counter()
    for request in trace:
        begin = time.perf_counter()
        first: list[float] = []
        out = run(request.prompt, request.max_tokens,
                  lambda first=first: first.append(time.perf_counter()))
        end = time.perf_counter()
        tokens.append(out)
        ttfts.append(first[0] - begin)
        if len(out) > 1:
            tpots.append((end - first[0]) / (len(out) - 1))
    seconds = time.perf_counter() - start
    held = max(len(r.prompt) + len(out) for r, out in zip(trace, tokens, strict=True))
    return CapstoneRow(name, tokens, seconds, float(np.percentile(ttfts, 95)),
                       float(np.percentile(tpots, 95)), weight_bytes,
                       kv_cache_bytes(config, held, bytes_per_value=4))


def hf_runner(hf_model, stop: list[int]) -> Runner:
    """Hugging Face ``generate`` (its own KV cache), stopping at the first stop token."""
    def run(prompt, max_tokens, on_first_token):
        with torch.inference_mode():
            out = hf_model.generate(torch.tensor([prompt]), max_new_tokens=max_tokens,
                                    do_sample=False, eos_token_id=stop, pad_token_id=stop[0],
                                    streamer=_FirstTokenClock(on_first_token))
        return _until_stop(out[0, len(prompt):].tolist(), stop)
    return run


class _FirstTokenClock:
    """A Hugging Face streamer that only notes when the first new token comes (generate
    hands it the prompt first, then each new token)."""

    def __init__(self, on_first_token):
        self.on_first_token, self.calls = on_first_token, 0

    def put(self, value) -> None:
        self.calls += 1
        if self.calls == 2:
            self.on_first_token()

    def end(self) -> None:
        pass


def _until_stop(tokens: list[int], stop: list[int]) -> list[int]:
    for i, token in enumerate(tokens):
        if token in stop:
            return tokens[:i + 1]
    return tokens


def minillm_row(name: str, model: Transformer, trace: list[TraceRequest],
                stop: list[int], executor: str | None = None) -> CapstoneRow:
    """minillm, one request at a time: the reference loop, or with an ``executor`` the
    engine's ``generate``."""
    return one_at_a_time(name, minillm_runner(model, stop, executor), trace, model.config,
                         model_nbytes(model))


def minillm_runner(model: Transformer, stop: list[int], executor: str | None = None) -> Runner:
    def run(prompt, max_tokens, on_first_token):
        if executor is None:
            return reference_generate(model, [prompt], max_tokens, stop_tokens=stop,
                                      on_token=lambda _: on_first_token())[0]
        return generate(model, [prompt], max_tokens, stop_tokens=stop,
                        on_token=lambda _: on_first_token(), executor=executor)[0]
    return run


# -- the engine --------------------------------------------------------------------------------

def engine_row(name: str, trace: list[TraceRequest], model: Transformer | str, tokenizer,
               perplexity: Callable[[Transformer], float] | None = None,
               **options) -> CapstoneRow:
    """The whole trace submitted to one ``LLM(model, **options)`` at once (with the
    model's ``perplexity``, when given)."""
    options.setdefault("scheduler", SchedulerConfig(max_batch=MAX_BATCH))
    with LLM(model, tokenizer=tokenizer, **options) as llm:
        llm.generate([trace[0].prompt], SamplingParams(max_tokens=4), progress=False)  # warm-up
        start = time.perf_counter()
        ids = [llm.add_request(r.prompt, SamplingParams(max_tokens=r.max_tokens))
               for r in trace]
        peak_blocks = 0
        while llm.has_work:
            llm.step()
            peak_blocks = max(peak_blocks, llm.blocks.num_blocks - llm.free_blocks())
        seconds = time.perf_counter() - start
        outputs = [llm.output(i) for i in ids]
        summary = summarize([output.outputs[0] for output in outputs])
        return CapstoneRow(name, [list(output.tokens) for output in outputs], seconds,
                           summary.ttft["p95"], summary.tpot["p95"], model_nbytes(llm.model),
                           peak_blocks * llm.core.kv_bytes_per_block,
                           perplexity(llm.model) if perplexity else None)


def w8a8_model(plain: Transformer) -> Transformer:
    """A copy of ``plain`` with int8 weights (round-to-nearest, symmetric, one scale per
    row; the tied embedding/head too) and int8 activations: chapter 6's W8A8 kernel."""
    int8 = quantize_model(copy.deepcopy(plain), "rtn",
                          QuantScheme(8, symmetric=True, group_size=None))
    return to_int8_activations(compact_embedding(int8, "int8"))


def capstone_rows(trace: list[TraceRequest], plain: Transformer, tokenizer, *,
                  hf_model=None, tensor_parallel: bool = True,
                  perplexity: Callable[[Transformer], float] | None = None
                  ) -> list[tuple[str, Callable[[], CapstoneRow]]]:
    """(name, run) for each row, cheapest to build first; ``hf_model`` None leaves out
    Hugging Face's row, ``tensor_parallel=False`` the 2-process row (it needs the
    checkpoint on disk). ``perplexity(model)``, when given, scores the plain row and the
    row whose weights differ (W8A8)."""
    stop = tokenizer.stop_tokens
    speculative = SchedulerConfig(max_batch=MAX_BATCH, speculative_tokens=4)
    builds: dict[str, Callable[[str], CapstoneRow]] = {}
    if hf_model is not None:
        hf_weights = sum(p.nbytes for p in hf_model.parameters())  # tied: counted once
        builds["HF generate, one at a time"] = lambda name: one_at_a_time(
            name, hf_runner(hf_model, stop), trace, plain.config, hf_weights)

    def plain_row(name: str) -> CapstoneRow:
        row = minillm_row(name, plain, trace, stop)
        return replace(row, perplexity=perplexity(plain)) if perplexity else row

    builds |= {
        "minillm, KV cache (heads repeated: MHA)":
            lambda name: minillm_row(name, expand_kv_heads(plain), trace, stop),
        PLAIN: plain_row,
        "+ native decode step":
            lambda name: minillm_row(name, plain, trace, stop, executor="native"),
        "continuous batching, paged KV (eager steps)":
            lambda name: engine_row(name, trace, plain, tokenizer, prefix_caching=False,
                                    executor="eager"),
        "+ native decode steps":
            lambda name: engine_row(name, trace, plain, tokenizer, prefix_caching=False),
        "+ prefix caching": lambda name: engine_row(name, trace, plain, tokenizer),
        "+ speculation (prompt lookup)":
            lambda name: engine_row(name, trace, plain, tokenizer, scheduler=speculative),
        "prefix caching + W8A8 int8":
            lambda name: engine_row(name, trace, w8a8_model(plain), tokenizer, perplexity),
    }
    if tensor_parallel:
        builds["prefix caching + TP 2"] = lambda name: engine_row(
            name, trace, str(resolve_checkpoint("smollm2")), tokenizer,
            tensor_parallel_size=2, shard_attention=False)
    return [(name, partial(build, name)) for name, build in builds.items()]


def equal_to(row: CapstoneRow, reference: CapstoneRow) -> int:
    """How many requests got exactly the reference's tokens."""
    return sum(a == b for a, b in zip(row.tokens, reference.tokens, strict=True))


def format_table(rows: list[CapstoneRow], reference: CapstoneRow) -> str:
    """A Markdown table; speed-ups against the first row."""
    baseline = rows[0].throughput
    lines = ["| row | tokens/s | vs first | TTFT p95 | TPOT p95 | weights | KV peak | "
             "equal to plain | perplexity |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        quality = "" if row.perplexity is None else f"{row.perplexity:.2f}"
        lines.append(
            f"| {row.name} | {row.throughput:.1f} | {row.throughput / baseline:.2f}x | "
            f"{row.ttft_p95:.2f} s | {1000 * row.tpot_p95:.0f} ms | "
            f"{row.weight_bytes / 2**20:.0f} MiB | {row.kv_bytes / 2**20:.1f} MiB | "
            f"{equal_to(row, reference)}/{len(row.tokens)} | {quality} |")
    return "\n".join(lines)
