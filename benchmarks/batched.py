"""Batched decoding on a CPU: the serving engine vs ``llama-batched-bench``.

    python benchmarks/batched.py                 # SmolLM2-135M, B = 1, 4, 16; fp32, W8A8, W4A8
    python benchmarks/batched.py --model gemma3-270m          # Gemma 3 270M; fp32, W8A8
    python benchmarks/batched.py --batches 1 4 16 32 --no-llama-cpp

The work is ``llama-batched-bench``'s: B sequences at once, each with its own 128-token
prompt (nothing shared), then 128 decode steps that give every sequence one token each,
no stop. Prompt processing (PP) and text generation (TG) are timed apart:

* llama.cpp: ``llama-batched-bench -npp 128 -ntg 128 -npl B`` (built from the same sdist
  as ``llama-bench``, ``benchmarks/llama_cpp.py``), its ``S_PP`` and ``S_TG`` tokens/s;
* minillm: one :class:`~minillm.serve.LLM` per weight format, its default executor (the
  native decode step, for SmolLM2 and Gemma 3 alike), prefix caching off; PP is the
  step that computes all B prompts, TG the 128 decode steps after it (B × 128 tokens).

Prompts are State of the Union text, after Gemma's BOS token (a base model: no chat
template); llama.cpp's are random token ids, which cost the same.

Peers by precision: fp32 vs llama.cpp F32, W8A8 (per-channel int8 weights, int8
activations) vs Q8_0, W4A8 (int4 weights in groups of 32 with a float minimum, int8
activations) vs Q4_1 (SmolLM2 only: its course GGUF is Q4_1; llama.cpp's converter writes
no Q4_1 for Gemma). The F32 and Q8_0 GGUFs are converted from the same fp32 checkpoint the
engine loads (``benchmarks/llama_cpp.py``). llama.cpp's rows are skipped with a message
when it cannot be built here (``cmake``, ``ninja`` and a C++ compiler are needed).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from pathlib import Path

import torch

from minillm import Tokenizer, load_model
from minillm.data import load_text
from minillm.experiments.decode import QUANTIZED, quantized_reference
from minillm.quant.int8_activations import to_int8_activations
from minillm.sampling import SamplingParams
from minillm.serve import LLM, SchedulerConfig

PEERS = {"fp32": "F32", "W8A8": "Q8_0", "W4A8": "Q4_1"}
MODELS = {"smollm2": ("SmolLM2-135M", ("fp32", "W8A8", "W4A8")),  # name: (title, formats)
          "gemma3-270m": ("Gemma 3 270M", ("fp32", "W8A8"))}
ACTIVATION_QUANTIZED = {"W8A8": "int8", "W4A8": "int4"}  # format: its QUANTIZED weights


def in_format(plain, fmt: str):
    """``plain`` in weight format ``fmt``: itself for fp32, else a new quantized model."""
    if fmt == "fp32":
        return plain
    return to_int8_activations(quantized_reference(plain, QUANTIZED[ACTIVATION_QUANTIZED[fmt]]))


def prompts_of(tokenizer, count: int, length: int) -> list[list[int]]:
    """``count`` different prompts of exactly ``length`` tokens: the document start (Gemma's
    BOS; nothing for SmolLM2), then State of the Union text."""
    start = tokenizer.prompt("")
    text_length = length - len(start)
    tokens = tokenizer.encode(load_text("sotu", "train")[:200_000])
    return [start + tokens[i * text_length:(i + 1) * text_length] for i in range(count)]


def engine_rates(model, batch: int, prompt_tokens: int, new_tokens: int,
                 tokenizer) -> tuple[float, float, str]:
    """(PP tokens/s, TG tokens/s, the decode executor) of the engine on the batched work."""
    prompts = prompts_of(tokenizer, batch, prompt_tokens)
    blocks = batch * (-(-(prompt_tokens + new_tokens + 1) // 16))
    reports = []
    llm = LLM(model, num_blocks=blocks, prefix_caching=False, on_step=reports.append,
              scheduler=SchedulerConfig(max_batch=batch, chunked_prefill=False,
                                        max_tokens_per_step=batch * prompt_tokens))
    llm.generate(prompts[:1], SamplingParams(max_tokens=2), progress=False)  # warm-up
    params = SamplingParams(max_tokens=new_tokens + 1)  # one from the prompt, then TG
    ids = [llm.add_request(prompt, params) for prompt in prompts]
    started = time.perf_counter()
    llm.step()  # every prompt, in one step
    prefilled = time.perf_counter()
    assert all(len(llm.outputs[i].tokens) == 1 for i in ids)
    while llm.has_work:
        llm.step()
    done = time.perf_counter()
    return (batch * prompt_tokens / (prefilled - started),
            batch * new_tokens / (done - prefilled), reports[-1].executor)


def llama_rates(gguf: Path, batches: list[int], prompt_tokens: int, new_tokens: int,
                threads: int) -> dict[int, tuple[float, float]]:
    """{B: (S_PP, S_TG)} from one ``llama-batched-bench`` run."""
    import llama_cpp

    context = max(batches) * (prompt_tokens + new_tokens) + 64
    out = subprocess.run(
        [str(llama_cpp.bench_binary("llama-batched-bench")), "-m", str(gguf), "-t", str(threads),
         "-c", str(context), "-b", "2048", "-ub", "512", "-npp", str(prompt_tokens),
         "-ntg", str(new_tokens), "-npl", ",".join(map(str, batches)),
         "--output-format", "jsonl"], check=True, capture_output=True, text=True).stdout
    rates = {}
    for line in out.splitlines():
        if line.startswith("{") and '"pl"' in line:
            row = json.loads(line)
            rates[row["pl"]] = (row["speed_pp"], row["speed_tg"])
    return rates


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="smollm2")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-llama-cpp", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    title, formats = MODELS[args.model]
    peers = {}
    if not args.no_llama_cpp:
        import llama_cpp

        if reason := llama_cpp.llama_cpp_available():
            print(f"llama.cpp rows skipped: {reason}")
        else:
            llama_cpp.build_llama_bench()
            ggufs = llama_cpp.make_ggufs(args.model)
            peers = {fmt: llama_rates(ggufs[PEERS[fmt]], args.batches, args.prompt_tokens,
                                      args.new_tokens, args.threads) for fmt in formats}
    tokenizer, plain = Tokenizer(args.model), load_model(args.model)
    print(f"\n{title}, {args.threads} threads, {args.prompt_tokens}-token prompts, "
          f"{args.new_tokens} generated tokens per sequence\n")
    print("| weights | B | minillm TG tokens/s | llama.cpp TG tokens/s | ratio "
          "| minillm PP tokens/s | llama.cpp PP tokens/s | executor |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for fmt in formats:
        model = in_format(plain, fmt)
        for batch in args.batches:
            pp, tg, executor = engine_rates(model, batch, args.prompt_tokens, args.new_tokens,
                                            tokenizer)
            peer_pp, peer_tg = peers.get(fmt, {}).get(batch, (None, None))
            ratio = f"{tg / peer_tg:.2f}x" if peer_tg else ""
            print(f"| {fmt} vs {PEERS[fmt]} | {batch} | {tg:.1f} | "
                  f"{'' if peer_tg is None else f'{peer_tg:.1f}'} | {ratio} | {pp:.0f} | "
                  f"{'' if peer_pp is None else f'{peer_pp:.0f}'} | {executor} |", flush=True)


if __name__ == "__main__":
    main()
