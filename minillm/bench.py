"""Decode-speed benchmark: minillm (cached, uncached) vs Hugging Face ``generate``.

Decoding one token at batch 1 must read every weight once, so its speed limit is the
memory bandwidth: ``roofline tokens/s = bandwidth / bytes of weights per token``. We
measure this machine's bandwidth with a large tensor copy in the same run (STREAM's
convention: bytes read + bytes written per second) and report every loop against it.

Used by ``benchmarks/decode.py`` and ``minillm bench``.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass

import torch

from .generate import generate, pad_left
from .model import Transformer
from .quant.qlinear import model_nbytes
from .roofline import copy_bandwidth

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


@dataclass
class DecodeRow:
    name: str
    batch: int
    new_tokens: int
    seconds: float
    tokens: list[list[int]]

    @property
    def tokens_per_second(self) -> float:
        return self.batch * self.new_tokens / self.seconds


def weight_bytes_per_token(model: torch.nn.Module) -> int:
    """Bytes of weights one decode step reads: every stored tensor once, except the embedding
    table, of which a step reads one row (unless the lm_head shares it: then it is read in
    full). Works for any storage format (fp32, transposed, quantized, compact embedding)."""
    embedding = _stored_tensors(model.embed_tokens)
    shared_with_head = embedding.keys() & _stored_tensors(model.lm_head).keys()
    total = model_nbytes(model)
    if not shared_with_head:
        total -= sum(t.nbytes for t in embedding.values())
    return total


def _stored_tensors(module: torch.nn.Module) -> dict[int, torch.Tensor]:
    return {t.data_ptr(): t for t in [*module.parameters(), *module.buffers()]}


def time_call(fn, repeats: int = 2, warmup: bool = True):
    """Best wall time over ``repeats`` runs (after a warm-up run) and the last result."""
    if warmup:
        fn()
    best, result = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def bench_minillm(name: str, model: Transformer, prompts, new_tokens: int, use_cache=True,
                  pad_id: int = 0, repeats: int = 2, warmup: bool = True) -> DecodeRow:
    seconds, tokens = time_call(
        lambda: generate(model, prompts, new_tokens, use_cache=use_cache, pad_id=pad_id),
        repeats, warmup)
    return DecodeRow(name, len(prompts), new_tokens, seconds, tokens)


def bench_hf(hf_model, prompts, new_tokens: int, pad_id: int, repeats: int = 2) -> DecodeRow:
    """Hugging Face ``generate``, greedy, left-padded batch, exactly ``new_tokens`` tokens."""
    ids, mask = pad_left(prompts, pad_id)

    def run():
        with torch.inference_mode():
            out = hf_model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens,
                                    min_new_tokens=new_tokens, do_sample=False,
                                    eos_token_id=None, pad_token_id=pad_id)
        return out[:, ids.shape[1]:].tolist()

    seconds, tokens = time_call(run, repeats)
    return DecodeRow("Hugging Face generate", len(prompts), new_tokens, seconds, tokens)


def same_tokens(a: list[list[int]], b: list[list[int]]) -> bool:
    """Do two runs agree on every token both produced (compared up to the shorter run)?"""
    return all(x[:len(y)] == y[:len(x)] for x, y in zip(a, b, strict=True))


def format_table(rows: list[DecodeRow], baseline: DecodeRow, roofline_tps: float) -> str:
    """A markdown table: tokens/s, ratio to the baseline, share of the roofline, same tokens?"""
    lines = [
        f"| batch {baseline.batch} | new tokens | tokens/s | vs {baseline.name} "
        "| % of roofline | same greedy tokens |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row.name} | {row.new_tokens} | {row.tokens_per_second:.1f} | "
            f"{row.tokens_per_second / baseline.tokens_per_second:.2f}x | "
            f"{100 * row.tokens_per_second / roofline_tps:.0f}% | "
            f"{'yes' if same_tokens(row.tokens, baseline.tokens) else 'NO'} |")
    return "\n".join(lines)


def run_decode_benchmark(threads: int = 2, new_tokens: int = 128, uncached_tokens: int = 256,
                         batches: tuple[int, ...] = (1, 8), compiled: bool = True) -> None:
    """Print one table per batch size; every row decodes the same prompts greedily.

    ``compiled`` adds a row for :func:`minillm.compile.compile_decode` at batch 1 (its
    warm-up run includes a few minutes of compilation, reported separately).
    """
    from transformers import AutoModelForCausalLM

    from .assets import fetch_course_model
    from .checkpoint import load_model
    from .compile import compile_decode
    from .tokenizer import Tokenizer
    from .weight_layout import transpose_linear_weights

    torch.set_num_threads(threads)
    tokenizer = Tokenizer("smollm2")
    plain = load_model("smollm2")
    transposed = transpose_linear_weights(copy.deepcopy(plain))
    hf = AutoModelForCausalLM.from_pretrained(fetch_course_model(), dtype=torch.float32).eval()

    bandwidth = copy_bandwidth()
    weight_bytes = weight_bytes_per_token(plain)
    print(f"threads: {torch.get_num_threads()}, dtype: float32, torch {torch.__version__}")
    print(f"copy bandwidth (read + write): {bandwidth / 1e9:.1f} GB/s")
    print(f"weights read per decode step: {weight_bytes / 1e6:.0f} MB")
    print(f"roofline at batch 1: {bandwidth / weight_bytes:.1f} tokens/s\n")

    pad = tokenizer.pad_id
    for batch in batches:
        prompts = [tokenizer.chat_prompt(q) for q in BENCH_QUESTIONS[:batch]]
        roofline = batch * bandwidth / weight_bytes  # one pass over the weights serves the batch
        baseline = bench_hf(hf, prompts, new_tokens, pad)
        rows = [
            baseline,
            bench_minillm("minillm, KV cache", plain, prompts, new_tokens, pad_id=pad),
            bench_minillm("minillm, KV cache, [in, out] weights", transposed, prompts,
                          new_tokens, pad_id=pad),
        ]
        if batch == 1 and compiled:
            start = time.perf_counter()
            model = compile_decode(copy.deepcopy(plain))
            generate(model, prompts, 2)  # compiles the decode step
            print(f"compile_decode: {time.perf_counter() - start:.0f} s to compile")
            rows.append(bench_minillm("minillm, KV cache, compile_decode", model, prompts,
                                      new_tokens, pad_id=pad))
        if batch == 1 and uncached_tokens:
            cached = bench_minillm("minillm, KV cache", plain, prompts, uncached_tokens,
                                   repeats=1)
            uncached = bench_minillm("minillm, no cache", plain, prompts, uncached_tokens,
                                     use_cache=False, repeats=1, warmup=False)
            rows += [cached, uncached]
        print(format_table(rows, baseline, roofline))
        print(f"(roofline at batch {batch}: {roofline:.1f} tokens/s)\n")
        if batch == 1 and uncached_tokens:
            print(f"KV cache vs no cache, {uncached_tokens} new tokens: "
                  f"{cached.tokens_per_second / uncached.tokens_per_second:.1f}x\n")
