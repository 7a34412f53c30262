"""What structured output costs the engine, and what jump-forward saves (chapter 16).

    python benchmarks/structured.py              # ~3 minutes on 2 cores
    python benchmarks/structured.py --busy-ok    # on a busy machine too (not for the record)
    python benchmarks/structured.py --busy-ok --max-tokens 8    # a quick check that it runs

SmolLM2 answers chat requests that ask for a city as JSON, greedy, through the engine
(``LLM("smollm2")``, its default executors):

1. **tokens/s, unconstrained vs constrained** by the JSON schema :data:`CITY` (xgrammar),
   at batch 1 (the requests one after another) and with 16 concurrent requests (all
   submitted at once, a batch of 16). The two runs write different texts of different
   lengths, so the ratio compares rates (output tokens per second of wall time), and the
   table prints the mean lengths beside them. Constrained replies are shorter, so their
   batch empties sooner and its later steps carry fewer rows: the "full steps" column
   is the rate over the decode steps that carry all 16 requests, the same work per step
   in both runs;
2. **the mask's own cost**: each constrained output's tokens replayed through a fresh
   matcher, timing what the sampler does per token (fill and apply the mask to a logits
   row, accept the token), as µs per step at 1 and at 16 rows;
3. **jump-forward**: the same 16 requests with ``LLM(jump_forward=True)``: the engine's
   steps (forward passes) and the tokens that joined an output without their own;
4. **compile time** of each schema or regex on a fresh backend (the first compile in a
   process, so nothing is cached), and of the backend itself (the vocabulary, once).

Timings are only honest on a quiet machine (:func:`minillm.machine.quiet_problem`).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from minillm import SamplingParams, Tokenizer
from minillm.engine.deltas import StepReport
from minillm.machine import describe, quiet_problem
from minillm.serve import LLM, SchedulerConfig
from minillm.structured import Choice, JsonObject, JsonSchema, Regex
from minillm.structured.backend import XGrammarBackend

CITY = {"type": "object", "additionalProperties": False,
        "required": ["name", "country", "population", "landmarks"],
        "properties": {"name": {"type": "string", "maxLength": 40},
                       "country": {"type": "string", "maxLength": 40},
                       "population": {"type": "integer", "minimum": 0},
                       "landmarks": {"type": "array", "maxItems": 3,
                                     "items": {"type": "string", "maxLength": 40}}}}
CITIES = ["Paris", "Tokyo", "Cairo", "Lima", "Oslo", "Nairobi", "Sydney", "Toronto",
          "Mumbai", "Rome", "Seoul", "Berlin", "Lagos", "Quito", "Hanoi", "Dublin"]
COMPILED = {"city schema": JsonSchema.of(CITY), "any JSON object": JsonObject(),
            "ISO date regex": Regex(r"[0-9]{4}-[0-9]{2}-[0-9]{2}"),
            "choice of 3": Choice(("yes", "no", "maybe")),
            "nested order schema": JsonSchema.of({
                "type": "object", "required": ["id", "items"],
                "properties": {"id": {"type": "integer"},
                               "items": {"type": "array", "items": {
                                   "type": "object", "required": ["sku", "qty"],
                                   "properties": {"sku": {"type": "string"},
                                                  "qty": {"type": "integer"}}}}}})}
MAX_TOKENS = 96


def prompts(tokenizer: Tokenizer) -> list[list[int]]:
    return [tokenizer.chat_prompt(f"Describe {city} as a JSON object with its name, country, "
                                  "population and three landmarks.") for city in CITIES]


def engine(**options) -> tuple[LLM, list[StepReport]]:
    """SmolLM2's engine with ``options``, and the list its ``on_step`` fills with every
    step's report (:func:`run` empties it first)."""
    reports: list[StepReport] = []
    return LLM("smollm2", on_step=reports.append, **options), reports


def run(llm: LLM, reports: list[StepReport], prompts: list[list[int]],
        params: SamplingParams, concurrent: bool):
    """Wall seconds, outputs, and the engine's steps: all at once, or one at a time."""
    reports.clear()
    start = time.perf_counter()
    if concurrent:
        outputs = llm.generate(prompts, params, progress=False)
    else:
        outputs = [llm.generate([p], params, progress=False)[0] for p in prompts]
    return time.perf_counter() - start, outputs, list(reports)


def full_step_rate(steps: list[StepReport], rows: int) -> float:
    """Tokens per second of the decode steps that carry ``rows`` sequences (one token each;
    with jump-forward off, every decode computes one token per sequence)."""
    full = [s for s in steps if len(s.work) == rows and s.num_tokens == rows]
    return rows * len(full) / sum(s.seconds for s in full)


def mask_micros(llm: LLM, outputs, rows: int) -> float:
    """µs per step of masking ``rows`` logits rows and accepting each row's token,
    replaying the constrained outputs (what the sampler does for them)."""
    structured = llm.core.runner.sampler.structured  # the engine's compiled constraints
    compiled = structured.compiled[JsonSchema.of(CITY)]
    matchers = [structured.backend.matcher(compiled) for _ in range(rows)]
    tokens = [outputs[i % len(outputs)].tokens for i in range(rows)]
    logits = torch.zeros(rows, llm.model.config.vocab_size)
    seconds, steps = 0.0, min(map(len, tokens))
    for t in range(steps):
        start = time.perf_counter()
        for row, matcher in enumerate(matchers):
            matcher.mask_logits(logits[row])
            matcher.accept(tokens[row][t])
        seconds += time.perf_counter() - start
    return 1e6 * seconds / steps


def compile_times(tokenizer: Tokenizer, vocab_size: int) -> list[tuple[str, float]]:
    """Milliseconds: the backend's vocabulary, then each spec's first compile."""
    start = time.perf_counter()
    backend = XGrammarBackend(tokenizer.hf, vocab_size, tokenizer.stop_tokens)
    rows = [("backend (vocabulary, once)", 1e3 * (time.perf_counter() - start))]
    for name, spec in COMPILED.items():
        start = time.perf_counter()
        backend.compile(spec)
        rows.append((name, 1e3 * (time.perf_counter() - start)))
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--busy-ok", action="store_true",
                        help="run on a busy machine too (the times are then not for the record)")
    parser.add_argument("--max-tokens", type=int, default=MAX_TOKENS,
                        help="tokens per answer (fewer: a quick check, not the table)")
    args = parser.parse_args(argv)
    if not args.busy_ok and (problem := quiet_problem()) is not None:
        sys.exit(f"{problem}; wait for a quiet machine or pass --busy-ok")
    torch.set_num_threads(2)
    tokenizer = Tokenizer("smollm2")
    asks = prompts(tokenizer)
    plain = SamplingParams(max_tokens=args.max_tokens)
    constrained = SamplingParams(max_tokens=args.max_tokens, structured=JsonSchema.of(CITY))
    llm, reports = engine(num_blocks=512, scheduler=SchedulerConfig(max_batch=16))
    llm.generate(asks[:2], constrained, progress=False)  # warm-up: executors, the grammar
    print(describe(), "quiet machine" if not args.busy_ok else "busy: NOT for the record")
    print(f"SmolLM2, greedy, up to {args.max_tokens} tokens, {len(asks)} chat requests for a "
          "city as JSON")
    print("| batch | run | tokens/s | mean tokens | steps | vs plain | full steps | vs plain |")
    results = {}
    for label, concurrent, requests in (("1", False, asks[:4]), ("16", True, asks)):
        for name, params in (("plain", plain), ("JSON schema", constrained)):
            seconds, outputs, steps = run(llm, reports, requests, params, concurrent)
            tokens = sum(len(o.tokens) for o in outputs)
            full = full_step_rate(steps, 1 if label == "1" else len(requests))
            results[label, name] = tokens / seconds, full, outputs
            base = results[label, "plain"]
            print(f"| {label} | {name} | {tokens / seconds:.1f} | "
                  f"{tokens / len(outputs):.1f} | {len(steps)} | "
                  f"{tokens / seconds / base[0]:.3f} | {full:.1f} | {full / base[1]:.3f} |")
    outputs = results["16", "JSON schema"][2]
    print("Mask cost (replayed outputs): µs per step, fill + apply + accept")
    print(f"| 1 row | {mask_micros(llm, outputs, 1):.0f} | "
          f"16 rows | {mask_micros(llm, outputs, 16):.0f} |")
    print("Jump-forward, 16 concurrent requests:")
    print("| jump-forward | steps | output tokens | forced tokens | valid JSON |")
    for jump in (False, True):
        jumping, jump_reports = engine(num_blocks=512, scheduler=SchedulerConfig(max_batch=16),
                                       jump_forward=jump)
        seconds, outputs, steps = run(jumping, jump_reports, asks, constrained, True)
        forced = sum(sample.forced for o in outputs for sample in o.outputs)
        valid = sum(o.finish_reason == "stop" for o in outputs)
        print(f"| {'on' if jump else 'off'} | {len(steps)} | "
              f"{sum(len(o.tokens) for o in outputs)}"
              f" | {forced} | {valid}/{len(outputs)} |")
    print("Compile time (ms), fresh backend:")
    for name, ms in compile_times(tokenizer, llm.model.config.vocab_size):
        print(f"| {name} | {ms:.1f} |")
    lengths = [len(o.tokens) for o in results["16", "JSON schema"][2]]
    print(f"constrained output lengths: median {statistics.median(lengths)}")


if __name__ == "__main__":
    main()
