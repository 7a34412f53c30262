"""Decode-step time vs batch size for each executor, against this CPU's roofline.

    python benchmarks/step_time.py                     # fp32, B = 1, 2, 4, 8, 16, 32
    python benchmarks/step_time.py --weights W8A8      # int8 weights and activations

Every sequence has a 128-token prompt and is 16 tokens into its reply when the steps are
timed; the table gives the median of 20 decode steps of B sequences (the step's forward
pass, as the runner times it, and the whole engine step: scheduling, inputs, sampling
included), and the roofline's bound for the same step: the larger of its FLOPs over the
measured peak matmul rate and its bytes (the weights once, every sequence's KV cache)
over the measured copy bandwidth (:mod:`minillm.roofline`). The compiled executor's
first step of each bucket compiles, so it is warmed up first.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from minillm import Tokenizer, load_model
from minillm.data import load_text
from minillm.engine.deltas import StepReport
from minillm.experiments.decode import QUANTIZED, quantized_reference
from minillm.quant.int8_activations import to_int8_activations
from minillm.quant.qlinear import weight_bytes_per_token
from minillm.roofline import Roofline, forward_flops
from minillm.sampling import SamplingParams
from minillm.serve import LLM, SchedulerConfig

PROMPT_TOKENS, WARM_TOKENS, TIMED_STEPS = 128, 16, 20


def step_times(llm: LLM, reports: list[StepReport], prompts: list[list[int]]
               ) -> tuple[float, float]:
    """Median (forward, whole step) seconds of decode steps of ``len(prompts)`` sequences
    (``reports``: the engine's step reports, as its ``on_step`` appends them)."""
    params = SamplingParams(max_tokens=WARM_TOKENS + TIMED_STEPS + 2)
    ids = [llm.add_request(prompt, params) for prompt in prompts]
    while min(len(llm.outputs[i].tokens) for i in ids) < WARM_TOKENS:
        llm.step()
    forward, whole = [], []
    for _ in range(TIMED_STEPS):
        started = time.perf_counter()
        llm.step()
        whole.append(time.perf_counter() - started)
        forward.append(reports[-1].forward_seconds)
    for request_id in ids:
        llm.abort(request_id)
        llm.output(request_id)
    return statistics.median(forward), statistics.median(whole)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    parser.add_argument("--weights", choices=("fp32", "W8A8"), default="fp32")
    parser.add_argument("--executors", nargs="+", default=["eager", "compiled", "native"])
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    tokenizer = Tokenizer("smollm2")
    model = load_model("smollm2")
    if args.weights == "W8A8":
        model = to_int8_activations(quantized_reference(model, QUANTIZED["int8"]))
    roofline = Roofline.measure()
    text = tokenizer.encode(load_text("sotu", "train")[:100_000])
    prompts = [text[i * PROMPT_TOKENS:(i + 1) * PROMPT_TOKENS] for i in range(max(args.batches))]
    weights = weight_bytes_per_token(model)
    per_token_kv = 2 * model.config.num_layers * model.config.num_kv_heads * \
        model.config.head_dim * 4
    print(f"SmolLM2-135M {args.weights}, {args.threads} threads: peak matmul "
          f"{roofline.peak_flops / 1e9:.0f} GFLOP/s, copy bandwidth "
          f"{roofline.bandwidth / 1e9:.1f} GB/s, weights {weights / 1e6:.0f} MB per step\n")
    print("| executor | B | forward ms | step ms | host ms | tokens/s | roofline ms "
          "| % of roofline |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for executor in args.executors:
        reports: list[StepReport] = []
        llm = LLM(model, num_blocks=max(args.batches) * 12, prefix_caching=False,
                  executor=executor, scheduler=SchedulerConfig(max_batch=max(args.batches)),
                  on_step=reports.append)
        for batch in args.batches:
            if executor == "compiled":
                step_times(llm, reports, prompts[:batch])  # compiles this batch's bucket
            forward, whole = step_times(llm, reports, prompts[:batch])
            context = PROMPT_TOKENS + WARM_TOKENS
            bound = roofline.time(
                forward_flops(model.config, 1, batch, past_tokens=context),
                weights + batch * context * per_token_kv)
            print(f"| {executor} | {batch} | {1e3 * forward:.2f} | {1e3 * whole:.2f} | "
                  f"{1e3 * (whole - forward):.2f} | {batch / whole:.1f} | {1e3 * bound:.2f} | "
                  f"{100 * bound / whole:.0f}% |", flush=True)


if __name__ == "__main__":
    main()
