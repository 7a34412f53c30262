"""KV-cache quantization on SmolLM2-135M: what int8 KV costs in quality, and what it buys
in capacity and long-context decode speed.

    python benchmarks/kv_quant.py                       # everything, llama.cpp rows skipped
    python benchmarks/kv_quant.py --only quality --windows 2
    python benchmarks/kv_quant.py --only speed --contexts 2048 8192 \\
        --llama-cpp /path/to/llama.cpp/build/bin

* **perplexity** on the Wikipedia eval split (:mod:`minillm.eval`'s windows, no overlap) at
  512 and 2,048 tokens of context, per KV dtype, through the engine's paged path: each
  window is one prefill of a :class:`~minillm.engine.runner.ModelRunner` (eager executor)
  with logits at every position, so every token attends over the K/V of itself and its
  predecessors as the pool stores them (int8: rounded when written, dequantized when
  gathered), as in decoding;
* **greedy agreement** with float32 KV: held-out prompts (SOTU text), 64 greedy tokens
  each; the share of tokens equal up to the first difference, and how many runs are equal;
* **capacity**: how many 2,048-token sequences a fixed pool byte budget holds per dtype;
* **decode tokens/s** at 2,048 (and 8,192) tokens of context, B = 1 and 4, W8A8 weights,
  the native executor: the prompts are prefilled (chunked) untimed, then the decode steps
  are timed. With ``--llama-cpp BIN`` also ``llama-batched-bench`` (``-fa on``) with the
  KV cache in q8_0 and in f16, on the Q8_0 GGUF (``--gguf``, else the one
  ``benchmarks/llama_cpp.py`` makes).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from minillm import Tokenizer, load_model
from minillm.attention.kv_quant import KV_CACHE_DTYPES
from minillm.attention.paged import slot_mapping
from minillm.data import load_text
from minillm.engine.executors.batch import SequenceWork, flat_batch
from minillm.engine.paged_cache import PagedKVCache
from minillm.engine.runner import ModelRunner
from minillm.eval import EvalSlice, eval_tokens
from minillm.experiments.decode import QUANTIZED, quantized_reference
from minillm.quant.int8_activations import to_int8_activations
from minillm.sampling import SamplingParams
from minillm.serve import LLM, SchedulerConfig

BLOCK = 16


def paged_perplexity(model, tokens: torch.Tensor, window: int, kv_cache_dtype: str) -> float:
    """exp(mean NLL) over windows of ``window`` tokens, each one prefill through a paged
    pool of ``kv_cache_dtype`` (logits at every position)."""
    blocks = -(-window // BLOCK)
    runner = ModelRunner(model, blocks, BLOCK, executor="eager", kv_cache_dtype=kv_cache_dtype)
    total, count = 0.0, 0
    for begin in range(0, len(tokens) - window + 1, window):
        ids = tokens[begin:begin + window].tolist()
        batch = flat_batch([SequenceWork(ids, 0, list(range(blocks)), window)], [], BLOCK,
                           slot_mapping, "cpu")
        logits = runner.forward(batch)
        total += F.cross_entropy(logits[:-1].float(), tokens[begin + 1:begin + window],
                                 reduction="sum").item()
        count += window - 1
    return float(torch.tensor(total / count).exp())


def agreed_prefix(tokens: list[int], reference: list[int]) -> int:
    """How many of ``tokens`` equal ``reference``'s before the first difference."""
    return next((i for i, (a, b) in enumerate(zip(tokens, reference, strict=False))
                 if a != b), len(tokens))


def quality(model, tokenizer, windows: int, prompts: int) -> None:
    print("\n| KV | context | perplexity | vs float32 |\n|---|---:|---:|---:|")
    for window in (512, 2048):
        tokens = eval_tokens(tokenizer, EvalSlice(f"wiki-eval-{windows}x{window}", "wikipedia",
                                                  "eval", window=window, num_windows=windows))
        base = None
        for dtype in KV_CACHE_DTYPES:
            ppl = paged_perplexity(model, tokens, window, dtype)
            base = base or ppl
            print(f"| {dtype} | {window} | {ppl:.3f} | {100 * (ppl / base - 1):+.2f}% |",
                  flush=True)
    held_out = tokenizer.encode(load_text("sotu", "eval")[:100_000])
    starts = [i * len(held_out) // prompts for i in range(prompts)]
    params = SamplingParams(max_tokens=64)
    runs = {dtype: [o.tokens for o in LLM(model, kv_cache_dtype=dtype).generate(
        [held_out[s:s + 200] for s in starts], params, progress=False)]
        for dtype in KV_CACHE_DTYPES}
    print("\n| KV | tokens equal to float32's up to the first difference | runs equal |\n"
          "|---|---:|---:|")
    for dtype, outputs in runs.items():
        prefix = sum(agreed_prefix(o, r) for o, r in zip(outputs, runs["float32"], strict=True))
        equal = sum(o == r for o, r in zip(outputs, runs["float32"], strict=True))
        print(f"| {dtype} | {prefix / sum(map(len, outputs)):.1%} | {equal}/{len(outputs)} |")


def capacity(model, budget_gib: float, context: int) -> None:
    print(f"\n| KV | bytes per token | {context}-token sequences in {budget_gib:g} GiB |\n"
          "|---|---:|---:|")
    for dtype in KV_CACHE_DTYPES:
        per_block = PagedKVCache(model.config, 1, BLOCK, kv_cache_dtype=dtype).bytes_per_block()
        blocks = int(budget_gib * 2**30) // per_block
        print(f"| {dtype} | {per_block / BLOCK:.0f} | {blocks // -(-context // BLOCK)} |")


def decode_rate(model, tokenizer, batch: int, context: int, new_tokens: int,
                kv_cache_dtype: str) -> tuple[float, str]:
    """(decode tokens/s, executor) of B sequences with ``context``-token prompts."""
    text = tokenizer.encode(load_text("wikipedia", "eval")[:4 * batch * context])
    prompts = [text[i * context:(i + 1) * context] for i in range(batch)]
    reports = []
    llm = LLM(model, num_blocks=batch * -(-(context + new_tokens + 1) // BLOCK) + 1,
              prefix_caching=False, kv_cache_dtype=kv_cache_dtype, on_step=reports.append,
              scheduler=SchedulerConfig(max_batch=batch, max_tokens_per_step=512))
    ids = [llm.add_request(p, SamplingParams(max_tokens=new_tokens + 1)) for p in prompts]
    while not all(llm.outputs[i].tokens for i in ids):
        llm.step()  # the prompts, chunked: untimed
    started = time.perf_counter()
    while llm.has_work:
        llm.step()
    return batch * new_tokens / (time.perf_counter() - started), reports[-1].executor


def llama_rates(binary: Path, gguf: Path, batches: list[int], context: int, new_tokens: int,
                threads: int, cache_type: str) -> dict[int, float]:
    """{B: S_TG} of ``llama-batched-bench`` with flash attention and this KV cache type."""
    out = subprocess.run(
        [str(binary / "llama-batched-bench"), "-m", str(gguf), "-t", str(threads),
         "-c", str(max(batches) * (context + new_tokens) + 64), "-b", "2048", "-ub", "512",
         "-npp", str(context), "-ntg", str(new_tokens), "-npl", ",".join(map(str, batches)),
         "-fa", "on", "-ctk", cache_type, "-ctv", cache_type, "--output-format", "jsonl"],
        check=True, capture_output=True, text=True).stdout
    return {row["pl"]: row["speed_tg"] for row in map(json.loads, (
        line for line in out.splitlines() if line.startswith("{") and '"pl"' in line))}


def speed(tokenizer, args) -> None:
    w8a8 = to_int8_activations(quantized_reference(load_model("smollm2"), QUANTIZED["int8"]))
    print(f"\nW8A8 decode, {args.threads} threads, {args.new_tokens} tokens per sequence\n\n"
          "| context | B | KV | minillm tokens/s | executor | llama.cpp q8_0 KV | f16 KV |\n"
          "|---:|---:|---|---:|---|---:|---:|")
    for context in args.contexts:
        peers = {}
        if args.llama_cpp:
            gguf = args.gguf or _course_gguf()
            peers = {kind: llama_rates(args.llama_cpp, gguf, args.batches, context,
                                       args.new_tokens, args.threads, kind)
                     for kind in ("q8_0", "f16")}
        for batch in args.batches:
            for dtype in args.kv_dtypes:
                rate, executor = decode_rate(w8a8, tokenizer, batch, context, args.new_tokens,
                                             dtype)
                llama = [f"{peers[k][batch]:.1f}" if k in peers else "" for k in ("q8_0", "f16")]
                print(f"| {context} | {batch} | {dtype} | {rate:.1f} | {executor} | "
                      f"{' | '.join(llama)} |", flush=True)


def _course_gguf() -> Path:
    import llama_cpp  # benchmarks/llama_cpp.py

    return llama_cpp.make_ggufs()["Q8_0"]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("quality", "capacity", "speed"))
    parser.add_argument("--windows", type=int, default=4, help="perplexity windows each")
    parser.add_argument("--prompts", type=int, default=8, help="greedy-agreement prompts")
    parser.add_argument("--budget-gib", type=float, default=1.0)
    parser.add_argument("--contexts", type=int, nargs="+", default=[2048, 8192])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--kv-dtypes", nargs="+", default=list(KV_CACHE_DTYPES),
                        choices=KV_CACHE_DTYPES, help="the KV dtypes the speed rows run")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--llama-cpp", type=Path, help="llama.cpp's build/bin directory")
    parser.add_argument("--gguf", type=Path, help="the Q8_0 GGUF for llama.cpp")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    tokenizer, model = Tokenizer("smollm2"), load_model("smollm2")
    if args.only in (None, "quality"):
        quality(model, tokenizer, args.windows, args.prompts)
    if args.only in (None, "capacity"):
        capacity(model, args.budget_gib, 2048)
    if args.only in (None, "speed"):
        speed(tokenizer, args)


if __name__ == "__main__":
    main()
