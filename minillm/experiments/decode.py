"""Decode-speed benchmark: the engine's executors at fp32, int8 and int4 vs Hugging Face.

Decoding one token at batch 1 must read every weight once, so its speed limit is the
memory bandwidth: ``roofline tokens/s = bandwidth / bytes of weights per token``. We
measure this machine's bandwidth with a large tensor copy in the same run (STREAM's
convention: bytes read + bytes written per second) and report every row against the
roofline of its own weights (fp32, int8 or int4 bytes).

Every row decodes the same prompts greedily and is checked against a reference row: the
fp32 rows against Hugging Face, the quantized rows against the same quantized weights run
the simple way (dequantize, then matmul, in the course's reference loop). The W8A8 and
W4A8 rows round activations as well, a different computation: they report how many
leading tokens they share with that reference. The engine rows (:mod:`minillm.engine`, one
executor each) also report the host time of a decode step: its wall time minus its
forward pass. External peers (``benchmarks/llama_cpp.py``) join the table as rows without
tokens.

Used by ``benchmarks/decode.py`` and ``minillm bench``.
"""

from __future__ import annotations

import copy
import statistics
import time
from dataclasses import dataclass

import torch
from transformers import AutoModelForCausalLM

from ..assets import fetch_course_model
from ..checkpoint import load_model
from ..engine.deltas import StepReport
from ..model import Transformer
from ..quant import QuantScheme, quantize_model
from ..quant.embedding import compact_embedding
from ..quant.int8_activations import to_int8_activations
from ..quant.qlinear import weight_bytes_per_token
from ..quant.weight_only import to_weight_only
from ..reference import generate as reference_generate
from ..reference import pad_left
from ..roofline import copy_bandwidth
from ..sampling import SamplingParams
from ..serve import LLM, SchedulerConfig
from ..tokenizer import Tokenizer

BENCH_QUESTIONS = [
    "Explain why the sky is blue.",
    "Write a short poem about a lighthouse.",
    "What is the capital of Australia, and why was it chosen?",
    "Give me three tips for learning to play the guitar.",
    "Summarise the plot of Romeo and Juliet in two sentences.",
    "How do vaccines train the immune system?",
    "Describe a good breakfast.",
    "List the planets of the solar system in order from the Sun.",
]


# The precisions of the quantized rows, as llama.cpp names its peers: int8 per output
# channel (Q8_0 has groups of 32), and Q4_1 itself (4 bits, groups of 32, a float minimum),
# the format SmolLM2's weights come from. Both keep the tied embedding/head in int8.
QUANTIZED = {"int8": QuantScheme(8, symmetric=True, group_size=None),
             "int4": QuantScheme(4, symmetric=False, group_size=32, float_zero=True)}

NATIVE_FORMAT = {"int8": "W8A8", "int4": "W4A8"}


@dataclass
class DecodeRow:
    name: str
    batch: int
    new_tokens: int
    seconds: float
    tokens: list[list[int]] | None  # None for an external peer (no tokens to compare)
    weight_bytes: int  # bytes of weights one decode step reads
    reference: str = ""  # the row whose greedy tokens this one must reproduce
    first_run_seconds: float | None = None  # the warm-up run (includes compiling)
    host_ms: float | None = None  # an engine row: median host time of a decode step

    @property
    def tokens_per_second(self) -> float:
        return self.batch * self.new_tokens / self.seconds


def time_call(fn, repeats: int = 2, warmup: bool = True):
    """Best wall time over ``repeats`` runs, the last result, and the warm-up run's time."""
    first = None
    if warmup:
        start = time.perf_counter()
        fn()
        first = time.perf_counter() - start
    best, result = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result, first


def bench_reference(name: str, model: Transformer, prompts, new_tokens: int, pad_id: int = 0,
                    reference: str = "Hugging Face generate", repeats: int = 2,
                    warmup: bool = True, use_cache: bool = True) -> DecodeRow:
    """The course's dense loop (:mod:`minillm.reference`)."""
    seconds, tokens, first = time_call(
        lambda: reference_generate(model, prompts, new_tokens, use_cache=use_cache,
                                   pad_id=pad_id), repeats, warmup)
    return DecodeRow(name, len(prompts), new_tokens, seconds, tokens,
                     weight_bytes_per_token(model), reference, first)


def bench_engine(name: str, model: Transformer, prompts, new_tokens: int, executor: str,
                 reference: str = "Hugging Face generate", repeats: int = 2) -> DecodeRow:
    """The serving engine with ``executor`` on ``prompts`` at once, exactly ``new_tokens``
    each (no stop tokens), one engine for every run (a compiled graph is built once, in
    the warm-up run). Also the median host time of its decode steps: the step's wall
    time minus its forward pass (scheduling, inputs, sampling, bookkeeping)."""
    blocks = sum(-(-(len(p) + new_tokens) // 16) for p in prompts)
    reports: list[StepReport] = []
    llm = LLM(model, num_blocks=blocks, prefix_caching=False, executor=executor,
              scheduler=SchedulerConfig(max_batch=len(prompts), chunked_prefill=False,
                                        max_tokens_per_step=sum(map(len, prompts))),
              on_step=reports.append)
    params = SamplingParams(max_tokens=new_tokens)
    host: list[float] = []

    def run():
        ids = [llm.add_request(prompt, params) for prompt in prompts]
        while llm.has_work:
            started = time.perf_counter()
            llm.step()
            if reports[-1].executor == executor:
                host.append(time.perf_counter() - started - reports[-1].forward_seconds)
        return [llm.output(i).tokens for i in ids]

    seconds, tokens, first = time_call(run, repeats)
    return DecodeRow(name, len(prompts), new_tokens, seconds, tokens,
                     weight_bytes_per_token(model), reference, first,
                     host_ms=1e3 * statistics.median(host) if host else None)


def bench_hf(hf_model, prompts, new_tokens: int, pad_id: int, repeats: int = 2) -> DecodeRow:
    """Hugging Face ``generate``, greedy, left-padded batch, exactly ``new_tokens`` tokens."""
    ids, mask = pad_left(prompts, pad_id)

    def run():
        with torch.inference_mode():
            out = hf_model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens,
                                    min_new_tokens=new_tokens, do_sample=False,
                                    eos_token_id=None, pad_token_id=pad_id)
        return out[:, ids.shape[1]:].tolist()

    seconds, tokens, _ = time_call(run, repeats)
    weights = sum(p.nbytes for p in hf_model.parameters())
    return DecodeRow("Hugging Face generate", len(prompts), new_tokens, seconds, tokens, weights)


def same_tokens(a: list[list[int]], b: list[list[int]]) -> bool:
    """Do two runs agree on every token both produced (compared up to the shorter run)?"""
    return all(x[:len(y)] == y[:len(x)] for x, y in zip(a, b, strict=True))


def same_prefix_length(a: list[list[int]], b: list[list[int]]) -> int:
    """How many leading tokens every sequence of ``a`` shares with its partner in ``b``."""
    def shared(p: list[int], q: list[int]) -> int:
        differ = (i for i, (x, y) in enumerate(zip(p, q, strict=False)) if x != y)
        return next(differ, min(len(p), len(q)))

    return min(shared(p, q) for p, q in zip(a, b, strict=True))


def _agreement(row: DecodeRow, by_name: dict[str, DecodeRow]) -> str:
    if row.tokens is None or not row.reference:
        return "(reference)" if row.tokens is not None else "n/a"
    reference = by_name[row.reference].tokens
    if same_tokens(row.tokens, reference):
        return f"yes ({row.reference})"
    return (f"NO, the first {same_prefix_length(row.tokens, reference)} of {row.new_tokens} "
            f"({row.reference})")


def format_table(rows: list[DecodeRow], baseline: DecodeRow, bandwidth: float,
                 peers: dict[str, str] | None = None) -> str:
    """A markdown table: tokens/s, ratio to the baseline and to the row named in ``peers``
    (row -> peer row), share of the row's own roofline, same tokens as its reference?"""
    by_name = {row.name: row for row in rows}
    peers = peers or {}
    lines = [f"| batch {baseline.batch}, {baseline.new_tokens} new tokens | tokens/s "
             f"| vs {baseline.name} | vs peer | % of roofline | host ms/step "
             "| same greedy tokens as |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for row in rows:
        roofline = row.batch * bandwidth / row.weight_bytes
        peer = by_name.get(peers.get(row.name, ""))
        versus_peer = f"{row.tokens_per_second / peer.tokens_per_second:.2f}x" if peer else ""
        lines.append(
            f"| {row.name} | {row.tokens_per_second:.1f} | "
            f"{row.tokens_per_second / baseline.tokens_per_second:.2f}x | {versus_peer} | "
            f"{100 * row.tokens_per_second / roofline:.0f}% | "
            f"{'' if row.host_ms is None else f'{row.host_ms:.2f}'} | "
            f"{_agreement(row, by_name)} |")
    return "\n".join(lines)


def quantized_reference(plain: Transformer, scheme: QuantScheme) -> Transformer:
    """SmolLM2 with RTN-quantized linears and an int8 embedding, run the simple way
    (dequantize, then matmul): the tokens the quantized engine rows must reproduce."""
    return compact_embedding(quantize_model(copy.deepcopy(plain), "rtn", scheme), "int8")


def decode_rows(batch: int, new_tokens: int, tokenizer, plain: Transformer, hf,
                compiled: bool = True, quantized: bool = True) -> list[DecodeRow]:
    """Every minillm row (and Hugging Face's) for one batch size, same prompts: the course's
    dense loop, then the engine with each executor, for fp32, int8 and int4 weights."""
    prompts = [tokenizer.chat_prompt(q) for q in BENCH_QUESTIONS[:batch]]
    pad = tokenizer.pad_id
    rows = [bench_hf(hf, prompts, new_tokens, pad),
            bench_reference("minillm fp32, reference loop (dense, eager)", plain, prompts,
                            new_tokens, pad),
            bench_engine("minillm fp32, engine, eager", plain, prompts, new_tokens, "eager")]
    if compiled:
        rows.append(bench_engine("minillm fp32, engine, compiled", copy.deepcopy(plain),
                                 prompts, new_tokens, "compiled"))
    rows.append(bench_engine("minillm fp32, engine, native", plain, prompts, new_tokens,
                             "native"))
    for precision, scheme in QUANTIZED.items() if quantized else ():
        reference = quantized_reference(plain, scheme)
        name = f"minillm {precision}, dequantize + matmul (reference loop)"
        rows.append(bench_reference(name, reference, prompts, new_tokens, pad, reference="",
                                    repeats=1, warmup=False))
        if compiled:
            rows.append(bench_engine(f"minillm {precision}, weight-only, engine, compiled",
                                     to_weight_only(copy.deepcopy(reference)), prompts,
                                     new_tokens, "compiled", reference=name))
        rows.append(bench_engine(f"minillm {precision}, int8 activations "
                                 f"({NATIVE_FORMAT[precision]}), engine, native",
                                 to_int8_activations(copy.deepcopy(reference)), prompts,
                                 new_tokens, "native", reference=name))
    return rows


def run_decode_benchmark(threads: int = 2, new_tokens: int = 128, uncached_tokens: int = 256,
                         batches: tuple[int, ...] = (1, 8), compiled: bool = True,
                         quantized: bool = True, peers=None) -> None:
    """Print one table per batch size; every row decodes the same prompts greedily.

    ``compiled`` adds the compiled-executor rows (their warm-up runs include minutes of
    compiling, reported separately); ``quantized`` the int8/int4 rows. ``peers(batch)``
    may return external rows (llama.cpp) and a dict naming each minillm row's peer.
    """
    torch.set_num_threads(threads)
    tokenizer = Tokenizer("smollm2")
    plain = load_model("smollm2")
    hf = AutoModelForCausalLM.from_pretrained(fetch_course_model(), dtype=torch.float32).eval()

    bandwidth = copy_bandwidth()
    print(f"threads: {torch.get_num_threads()}, torch {torch.__version__}")
    print(f"copy bandwidth (read + write): {bandwidth / 1e9:.1f} GB/s")
    print(f"fp32 weights read per decode step: {weight_bytes_per_token(plain) / 1e6:.0f} MB\n")
    for batch in batches:
        rows = decode_rows(batch, new_tokens, tokenizer, plain, hf, compiled, quantized)
        external, peer_names = peers(batch) if peers else ([], {})
        print(format_table(rows + external, rows[0], bandwidth, peer_names))
        for row in rows:
            if row.first_run_seconds is not None and "compile" in row.name:
                print(f"{row.name}: first run {row.first_run_seconds:.0f} s (compiling)")
        print()
    if uncached_tokens:
        prompt = [tokenizer.chat_prompt(BENCH_QUESTIONS[0])]
        cached = bench_reference("KV cache", plain, prompt, uncached_tokens, repeats=1)
        uncached = bench_reference("no cache", plain, prompt, uncached_tokens, repeats=1,
                                   warmup=False, use_cache=False)
        print(f"KV cache vs no cache, batch 1, {uncached_tokens} new tokens: "
              f"{cached.tokens_per_second:.1f} vs {uncached.tokens_per_second:.1f} tokens/s, "
              f"{cached.tokens_per_second / uncached.tokens_per_second:.1f}x\n")
