"""The course's techniques switched on one at a time, on one 64-request trace (SmolLM2, CPU).

    python benchmarks/capstone.py                  # the table in docs/benchmarks.md
    python benchmarks/capstone.py --requests 16    # quicker

The trace is :func:`minillm.serve.workload.make_trace` (chat questions and passages to
summarise, long-tailed lengths around ``--median-tokens``), every request greedy with its
own ``max_tokens`` and the tokenizer's stop tokens, all submitted at once. Rows:

1. Hugging Face ``generate``, one request at a time (its own KV cache);
2. minillm ``generate``, one request at a time (KV cache of the KV heads only: GQA-aware);
3. + ``compile_decode`` (the [in, out] weight layout and a compiled decode step);
4. + continuous batching over paged KV blocks (the engine, 16 sequences a step, prefix
   caching off);
5. + prefix caching (the chat template's shared prefix is computed once);
6. + speculative decoding (prompt lookup, 4 guesses a step);
7. + int8 weights (round-to-nearest, per channel) in the engine;
8. + tensor parallelism on 2 processes (MLP and vocabulary split).

Throughput is generated tokens over the wall time of the trace; TTFT/TPOT are P95 over
requests (one-at-a-time rows: each request's clock starts when it starts). "lossless"
compares the row's tokens with row 2's (greedy decoding must not change them; row 7
changes the weights, so it is compared for information only).
"""

from __future__ import annotations

import argparse
import copy
import time

import numpy as np
import torch

from minillm import SamplingParams, Tokenizer, generate, load_model
from minillm.checkpoint import resolve_checkpoint
from minillm.compile import compile_decode
from minillm.data import load_documents
from minillm.quant import quantize_model
from minillm.quant.basic import QuantScheme
from minillm.serve import LLM, SchedulerConfig
from minillm.serve.metrics import summarize
from minillm.serve.workload import make_trace


def one_at_a_time(run, trace) -> dict:
    """Serve the trace request by request with ``run(prompt, max_tokens, on_first_token)``
    -> tokens (after one untimed request: compiling happens there)."""
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
    return {"tokens": tokens, "seconds": time.perf_counter() - start, "ttft": ttfts,
            "tpot": tpots}


def hf_runner(stop):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(resolve_checkpoint("smollm2"),
                                              dtype=torch.float32).eval()

    def run(prompt, max_tokens, first_token):
        with torch.inference_mode():
            out = hf.generate(torch.tensor([prompt]), max_new_tokens=max_tokens,
                              do_sample=False, eos_token_id=stop, pad_token_id=stop[0],
                              streamer=_FirstTokenClock(first_token))
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


def minillm_runner(model, stop):
    def run(prompt, max_tokens, first_token):
        return generate(model, [prompt], max_tokens, stop_tokens=stop,
                        on_token=lambda _: first_token())[0]
    return run


def _until_stop(tokens, stop):
    for i, token in enumerate(tokens):
        if token in stop:
            return tokens[:i + 1]
    return tokens


def engine_row(trace, model, tokenizer, **options) -> dict:
    if not isinstance(model, str):  # a loaded model comes with no tokenizer: its stop tokens
        options["tokenizer"] = tokenizer
    with LLM(model, scheduler=options.pop("scheduler", SchedulerConfig(max_batch=16)),
             **options) as llm:
        llm.generate([trace[0].prompt], SamplingParams(max_tokens=4), progress=False)  # warm-up
        start = time.perf_counter()
        outputs = llm.generate([r.prompt for r in trace],
                               [SamplingParams(max_tokens=r.max_tokens) for r in trace],
                               progress=False)
        seconds = time.perf_counter() - start
        summary = summarize([llm.requests[o.request_id] for o in outputs])
    return {"tokens": [o.tokens for o in outputs], "seconds": seconds,
            "ttft_p95": summary.ttft["p95"], "tpot_p95": summary.tpot["p95"]}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--median-tokens", type=int, default=32)
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    tokenizer = Tokenizer("smollm2")
    stop = tokenizer.stop_tokens
    trace = make_trace(tokenizer, args.requests, rate=0, median_tokens=args.median_tokens,
                       passages=load_documents("sotu", "train")[:200])
    plain = load_model("smollm2")
    int8 = quantize_model(copy.deepcopy(plain), "rtn", QuantScheme(8, group_size=None))
    rows = [
        ("HF generate, one at a time", lambda: one_at_a_time(hf_runner(stop), trace)),
        ("minillm, KV cache (GQA), one at a time",
         lambda: one_at_a_time(minillm_runner(plain, stop), trace)),
        ("+ compiled decode, [in, out] layout",
         lambda: one_at_a_time(minillm_runner(compile_decode(copy.deepcopy(plain)), stop),
                               trace)),
        ("+ continuous batching, paged KV", lambda: engine_row(trace, plain, tokenizer,
                                                               prefix_caching=False)),
        ("+ prefix caching", lambda: engine_row(trace, plain, tokenizer)),
        ("+ speculative decoding", lambda: engine_row(
            trace, plain, tokenizer,
            scheduler=SchedulerConfig(max_batch=16, speculative_tokens=4))),
        ("+ int8 weights (RTN)", lambda: engine_row(trace, int8, tokenizer)),
        ("+ tensor parallel, 2 processes", lambda: engine_row(
            trace, "smollm2", tokenizer, tensor_parallel_size=2, shard_attention=False)),
    ]
    print(f"{args.requests} requests, greedy, {sum(r.max_tokens for r in trace)} tokens at most\n")
    print("| row | tokens/s | vs HF | TTFT p95 | TPOT p95 | lossless |")
    print("|---|---:|---:|---:|---:|---|")
    baseline = reference = None
    for name, run in rows:
        result = run()
        rate = sum(map(len, result["tokens"])) / result["seconds"]
        baseline = baseline or rate
        if name.startswith("minillm"):
            reference = result["tokens"]
        ttft = result.get("ttft_p95", np.percentile(result.get("ttft", [np.nan]), 95))
        tpot = result.get("tpot_p95", np.percentile(result.get("tpot", [np.nan]), 95))
        lossless = "-" if reference is None else \
            f"{sum(a == b for a, b in zip(result['tokens'], reference, strict=True))}" \
            f"/{len(trace)} equal"
        print(f"| {name} | {rate:.1f} | {rate / baseline:.2f}x | {ttft:.2f} s | "
              f"{1000 * tpot:.0f} ms | {lossless} |", flush=True)


if __name__ == "__main__":
    main()
