"""Serving SmolLM2 on this CPU: batching policies, paged KV memory, prefix caching and
chunked prefill, each measured on one seeded trace in one run.

    python benchmarks/serving.py              # every table (about 15 minutes on 2 cores)
    python benchmarks/serving.py --requests 16 --only policies

Tables (docs/benchmarks.md records them):

1. **policies**: one Poisson trace of real chat prompts with long-tailed output lengths,
   served by Hugging Face ``generate`` one request at a time, and by the engine with
   static, dynamic and continuous batching (and chunked prefill) at the same max batch:
   throughput, P50/P95 TTFT and TPOT. Every engine row's greedy tokens are checked
   against the one-at-a-time run.
2. **memory**: KV slots allocated vs used during the continuous run, paged (blocks of 16)
   vs a contiguous cache that reserves prompt + max_tokens per request up front.
3. **prefix**: 16 requests sharing a 512-token system prompt, with and without prefix
   caching: prompt tokens computed, TTFT.
4. **chunked**: P95 inter-token latency of running decodes while long prompts arrive, with
   and without chunked prefill, and the throughput it costs.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from minillm import SamplingParams, Tokenizer, load_model
from minillm.data import load_documents
from minillm.engine.deltas import StepReport
from minillm.experiments.workload import TraceRequest, make_trace, replay
from minillm.serve import LLM, SchedulerConfig
from minillm.serve.metrics import Summary, percentiles, summarize
from minillm.serve.output_processor import CompletionOutput

BLOCK_SIZE = 16


def hf_one_at_a_time(hf, trace: list[TraceRequest], stop_tokens) -> list[CompletionOutput]:
    """The baseline: one request at a time through Hugging Face ``generate`` (a streamer
    records when each token comes), queueing the others."""
    from transformers.generation.streamers import BaseStreamer

    class Clock(BaseStreamer):
        def __init__(self):
            self.times, self.calls = [], 0

        def put(self, value):  # first call: the prompt; then one call per new token
            self.calls += 1
            if self.calls > 1:
                self.times.append(time.perf_counter())

        def end(self):
            pass

    start, samples = time.perf_counter(), []
    for request in trace:
        time.sleep(max(0.0, request.arrival - (time.perf_counter() - start)))
        clock = Clock()
        with torch.inference_mode():
            out = hf.generate(torch.tensor([request.prompt]), max_new_tokens=request.max_tokens,
                              do_sample=False, streamer=clock, eos_token_id=list(stop_tokens),
                              pad_token_id=stop_tokens[0])
        tokens = out[0, len(request.prompt):].tolist()
        samples.append(CompletionOutput(0, tokens, arrival_time=start + request.arrival,
                                        token_times=clock.times[:len(tokens)]))
    return samples


def engine(model, tokenizer, num_blocks=2048, prefix_caching=True, on_step=None,
           **config) -> LLM:
    return LLM(model, tokenizer=tokenizer, block_size=BLOCK_SIZE, num_blocks=num_blocks,
               prefix_caching=prefix_caching, scheduler=SchedulerConfig(**config),
               on_step=on_step)


def row(name: str, s: Summary, base: Summary, same: str) -> str:
    return (f"| {name} | {s.throughput:.1f} | {s.throughput / base.throughput:.2f}x | "
            f"{s.ttft['p50']:.2f} / {s.ttft['p95']:.2f} | "
            f"{1000 * s.tpot['p50']:.0f} / {1000 * s.tpot['p95']:.0f} | {same} |")


class MemoryProbe:
    """Counts KV slots before each step of a run. It is the engine's ``on_step`` and reads
    the core's running sequences after each step: their state when the next step begins
    (none run before the first step or after the last). ``tokens``: the running requests'
    computed tokens, each request counted on its own (what a contiguous cache must hold);
    ``contiguous``: what a contiguous cache reserves (prompt + max_tokens per request);
    ``paged``: distinct blocks in use x block size; ``filled``: the slots of those blocks
    that hold a token (a block shared by several requests through the prefix cache counts
    once, so ``filled`` can be less than ``tokens``). ``rounded[b]``: what blocks of ``b``
    slots would allocate for the same requests without sharing (each request's computed
    tokens rounded up to whole blocks), the block-size trade-off on the same steps."""

    SIZES = (8, 16, 32)

    def __init__(self):
        self.tokens = self.contiguous = self.paged = self.filled = 0
        self.rounded = dict.fromkeys(self.SIZES, 0)
        self.llm: LLM | None = None  # the engine it watches (set once it exists)

    def __call__(self, report: StepReport) -> None:
        running = self.llm.core.scheduler.running  # white-box: the core's live sequences
        self.tokens += sum(seq.num_computed for seq in running)
        self.contiguous += sum(seq.num_prompt_tokens + seq.max_tokens for seq in running)
        for size in self.SIZES:
            self.rounded[size] += sum(-(-seq.num_computed // size) * size for seq in running)
        fill = {}  # block id: slots holding a token
        for seq in running:
            for i, block in enumerate(seq.block_table):
                fill[block] = min(BLOCK_SIZE, max(0, seq.num_computed - i * BLOCK_SIZE))
        self.paged += BLOCK_SIZE * len(fill)
        self.filled += sum(fill.values())

    def table(self) -> str:
        rows = [("contiguous, prompt + max_tokens reserved", self.contiguous, self.tokens),
                (f"paged, blocks of {BLOCK_SIZE} (the run's blocks)", self.paged, self.filled)]
        rows += [(f"paged, blocks of {size} (tokens rounded up per request, no sharing)",
                  self.rounded[size], self.tokens) for size in self.SIZES]
        lines = ["| cache | slots allocated | slots holding a token | waste "
                 "| slots per token of the requests |", "|---|---:|---:|---:|---:|"]
        lines += [f"| {name} | {allocated} | {filled} | {100 * (1 - filled / allocated):.1f}% | "
                  f"{allocated / self.tokens:.2f} |" for name, allocated, filled in rows]
        return "\n".join(lines)


POLICIES = {
    "static": dict(policy="static", chunked_prefill=False),
    "dynamic (wait 1 s)": dict(policy="dynamic", max_wait=1.0, chunked_prefill=False),
    "continuous": dict(policy="continuous", chunked_prefill=False),
    "continuous + chunked prefill (256)": dict(max_tokens_per_step=256),
}


def policies_table(model, hf, tokenizer, trace, max_batches: list[int]):
    """Every policy at every max batch against one HF baseline; the memory probe rides on
    each continuous run."""
    stop = tokenizer.stop_tokens
    baseline = hf_one_at_a_time(hf, trace, stop)
    base = summarize(baseline)
    expected = [sample.tokens for sample in baseline]
    probes = {}
    for max_batch in max_batches:
        print(f"\n## Batching policies: {len(trace)} requests, max batch {max_batch}")
        print("| policy | tokens/s | vs HF one at a time | TTFT P50 / P95 (s) "
              "| TPOT P50 / P95 (ms) | same tokens |\n|---|---:|---:|---:|---:|---|")
        print(row("Hugging Face generate, one request at a time", base, base, "(reference)"))
        throughput = {}
        for name, config in POLICIES.items():
            probe = MemoryProbe() if name == "continuous" else None
            llm = engine(model, tokenizer, max_batch=max_batch, on_step=probe, **config)
            if probe is not None:
                probe.llm, probes[max_batch] = llm, probe
            samples = replay(llm, trace)
            same = "yes" if [sample.tokens for sample in samples] == expected else "NO"
            summary = summarize(samples)
            throughput[name] = summary.throughput
            print(row(name, summary, base, same))
        print(f"continuous / static: {throughput['continuous'] / throughput['static']:.2f}x; "
              f"with chunked prefill "
              f"{throughput['continuous + chunked prefill (256)'] / throughput['static']:.2f}x")
    for max_batch, probe in probes.items():
        print(f"\n## KV memory during the continuous run at max batch {max_batch}")
        print(probe.table())
        print("(summed over the steps of the run; paged blocks shared through the prefix cache "
              "count once)")


def prefix_table(model, tokenizer, system_tokens: int = 512, requests: int = 16):
    documents = load_documents("wikipedia", "train")
    system = tokenizer.encode(" ".join(documents[:5]))[:system_tokens]
    prompts = [system + tokenizer.chat_prompt(q) for q in
               [f"Question {i}: what is the main topic?" for i in range(requests)]]
    print(f"\n## Prefix caching: {requests} requests sharing a {system_tokens}-token prefix")
    print("| prefix caching | prompt tokens computed | TTFT mean (s) | TTFT of hits (s) |"
          "\n|---|---:|---:|---:|")
    for enabled in (False, True):
        reports: list[StepReport] = []
        llm = engine(model, tokenizer, prefix_caching=enabled, max_batch=1,
                     on_step=reports.append)
        computed, ttfts = 0, []
        for prompt in prompts:  # one after another: each later request may hit
            request_id = llm.add_request(prompt, SamplingParams(max_tokens=1))
            start = time.perf_counter()
            while llm.has_work:
                llm.step()
            # its first prompt chunk started after the tokens the prefix cache held
            cached = next(work.start for report in reports for work in report.work
                          if work.request_id == request_id)
            computed += len(prompt) - cached
            ttfts.append(llm.output(request_id).outputs[0].token_times[0] - start)
        print(f"| {'on' if enabled else 'off'} | {computed} | {np.mean(ttfts):.3f} | "
              f"{np.mean(ttfts[1:]):.3f} |")


def gaps_during(decodes: list[CompletionOutput], windows: list[tuple[float, float]]
                ) -> list[float]:
    """Inter-token gaps of ``decodes`` that overlap any window (start, end): what a user
    watching a stream sees while a long prompt is being prefilled."""
    gaps = []
    for sample in decodes:
        times = sample.token_times
        for before, after in zip(times, times[1:], strict=False):
            if any(after > start and before < end for start, end in windows):
                gaps.append(after - before)
    return gaps


def chunked_run(model, tokenizer, mixed, long_length: int, config: dict):
    """One replay of the mixed trace: (ITL percentiles during long prefills, longest gap,
    the run's summary)."""
    llm = engine(model, tokenizer, max_batch=12, **config)
    samples = replay(llm, mixed)  # in trace order
    longs = [s for s, r in zip(samples, mixed, strict=True) if len(r.prompt) == long_length]
    decodes = [s for s, r in zip(samples, mixed, strict=True) if len(r.prompt) != long_length]
    during = percentiles(gaps_during(decodes, [(s.arrival_time, s.token_times[0])
                                               for s in longs]))
    longest = max(gaps_during(decodes, [(0.0, float("inf"))]))
    return during, longest, summarize(samples)


def chunked_table(model, tokenizer, trace, long_prompt_tokens: int = 1024,
                  budgets=(32, 64, 128, 256), repeats: int = 3):
    """Eight trace requests decode while three long prompts arrive. For each long prompt,
    the window from its arrival to its first token is when it stalls the others; the
    decodes' inter-token gaps that overlap a window are the ITL "while a long prompt
    arrives". Whole prompts vs chunked prefill under several per-step token budgets; each
    configuration is replayed ``repeats`` times in turn and the run with the median
    throughput is shown (a run is about 10 s of real time, so one run is noisy)."""
    documents = load_documents("wikipedia", "train")
    long = tokenizer.encode(" ".join(documents[10:20]))[:long_prompt_tokens]
    mixed = [TraceRequest(r.arrival, r.prompt, 48) for r in trace[:8]]
    mixed += [TraceRequest(2.0 + i, long, 8) for i in range(3)]
    mixed.sort(key=lambda r: r.arrival)
    configs = {"whole prompts": dict(chunked_prefill=False)}
    configs |= {f"chunks, budget {b} tokens per step": dict(max_tokens_per_step=b)
                for b in budgets}
    runs = {name: [] for name in configs}
    for _ in range(repeats):  # interleaved, so a slow spell of the machine hits every row
        for name, config in configs.items():
            runs[name].append(chunked_run(model, tokenizer, mixed, len(long), config))
    print(f"\n## Chunked prefill: decodes running while {long_prompt_tokens}-token prompts "
          f"arrive (median of {repeats} runs by throughput)")
    print("| prefill | ITL while a long prompt is prefilled, P50 / P95 (ms) | longest gap (ms) "
          "| ITL of the whole run, P50 / P95 (ms) | tokens/s (all runs) | throughput vs whole |"
          "\n|---|---:|---:|---:|---:|---:|")
    whole = None
    for name, results in runs.items():
        results.sort(key=lambda r: r[2].throughput)
        during, longest, s = results[len(results) // 2]
        whole = whole or s.throughput
        every = ", ".join(f"{r[2].throughput:.1f}" for r in results)
        print(f"| {name} | {1000 * during['p50']:.0f} / {1000 * during['p95']:.0f} | "
              f"{1000 * longest:.0f} | {1000 * s.itl['p50']:.0f} / {1000 * s.itl['p95']:.0f} | "
              f"{s.throughput:.1f} ({every}) | {s.throughput / whole:.2f}x |")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--rate", type=float, default=4.0, help="arrivals per second")
    parser.add_argument("--median-tokens", type=int, default=32)
    parser.add_argument("--max-batch", type=int, nargs="+", default=[8, 16])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--only", nargs="*", default=["policies", "prefix", "chunked"])
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    tokenizer = Tokenizer("smollm2")
    model = load_model("smollm2")
    passages = load_documents("sotu", "train")[:200]
    trace = make_trace(tokenizer, args.requests, args.rate, args.median_tokens, seed=0,
                       passages=passages)
    print(f"trace: {len(trace)} requests over {trace[-1].arrival:.1f} s, prompt tokens "
          f"{int(np.mean([len(r.prompt) for r in trace]))} mean, output tokens "
          f"{int(np.median([r.max_tokens for r in trace]))} median / "
          f"{max(r.max_tokens for r in trace)} max; torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    if "policies" in args.only:
        from transformers import AutoModelForCausalLM

        from minillm.assets import fetch_course_model

        hf = AutoModelForCausalLM.from_pretrained(fetch_course_model(),
                                                  dtype=torch.float32).eval()
        policies_table(model, hf, tokenizer, trace, args.max_batch)
    if "prefix" in args.only:
        prefix_table(model, tokenizer)
    if "chunked" in args.only:
        chunked_table(model, tokenizer, trace)


if __name__ == "__main__":
    main()
