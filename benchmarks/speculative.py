"""Speculative decoding on this CPU: prompt lookup vs plain greedy decoding, SmolLM2.

    python benchmarks/speculative.py                 # the table in docs/benchmarks.md
    python benchmarks/speculative.py --gamma 2 4 8   # a gamma sweep
    python benchmarks/speculative.py --draft ~/.cache/minillm/drafts/smollm2-4l-kd
        # adds rows for a draft model (e.g. one made by `minillm distill`)
    python benchmarks/speculative.py --engine
        # the serving engine with and without SchedulerConfig(speculative_tokens=gamma)

Each prompt is decoded greedily twice by the serving engine: plainly with ``generate``,
and with ``speculative_generate`` guessing up to ``gamma`` tokens per target pass by
prompt lookup (n-grams of the context, up to 3 tokens and at least ``--min-ngram``) or,
with ``--draft``, by a draft model inside the engine. A pass that verifies guesses runs
eagerly (its shapes vary), while plain decode steps run the native executor: the
measured speedup includes that difference. Lossless rows only: the speculative tokens are
compared with the plain ones and the table says so.

Prompts (:mod:`minillm.task_prompts`) come in three kinds: *input-grounded* (rewrite,
extract, edit code: the answer copies spans of the prompt, which is what prompt lookup can
guess), *chat* (an explanation, advice) and *creative* (a story); the last two are the
open-ended ones.

Columns: alpha (share of drafted tokens accepted), tokens per target call (the speedup
if a verification cost one decode step: an upper bound, as a verify pass over gamma + 1
tokens costs more), and the measured wall-clock speedup. With ``--draft``, each prompt
also gets rows drafted by that model (its cost c, the bytes it reads per step over the
target's, is printed once), and the predicted speedup of Leviathan et al. 2023 (eq. 1 and
Theorem 3.8): E[tokens per call] / (gamma c + 1), with the measured alpha.

With ``--engine`` the same prompts go through the serving engine (``minillm.serve.LLM``),
one request at a time and then all together (max batch 8), with prompt-lookup speculation
in the decode steps and without it: the speedup is over the same engine, and the tokens
per step are output tokens over engine steps (prefill steps included).
"""

from __future__ import annotations

import argparse
import itertools
import time
from functools import partial

import torch

from minillm import Tokenizer, generate, load_model
from minillm.draft import draft_cost
from minillm.sampling import SamplingParams
from minillm.serve import LLM, SchedulerConfig
from minillm.speculative import PromptLookup, expected_tokens_per_call, lookup_ngram
from minillm.speculative_generate import DraftModel, speculative_generate
from minillm.task_prompts import task_prompts


def timed(repeats: int, fn, *args, **kwargs):
    """(best seconds over ``repeats`` calls of ``fn(*args, **kwargs)``, the last result)."""
    best, result = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn(*args, **kwargs)
        best = min(best, time.perf_counter() - start)
    return best, result


def rows_for(args, model, draft, prompt) -> list[tuple[str, int, float, object]]:
    """(drafter, gamma, draft cost c, the proposer) per row."""
    rows = [] if args.no_lookup else [
        (f"prompt lookup, n-gram >= {n}", gamma, 0.0, PromptLookup(min_ngram=n))
        for gamma, n in itertools.product(args.gamma, args.min_ngram)]
    if draft is not None:
        rows += [("learned draft", gamma, draft_cost(draft, model), DraftModel(draft))
                 for gamma in args.gamma]
    return rows


def speculate(model, proposer, prompt, new_tokens, gamma, stop):
    """One speculative generation (the engine starts afresh: a draft's cache is empty)."""
    return speculative_generate(model, proposer, prompt, new_tokens, gamma=gamma,
                                stop_tokens=stop)


def serve(model, tokenizer, prompts, new_tokens, gamma=0, min_ngram=1, max_batch=1):
    """Run ``prompts`` through a fresh engine; returns (outputs, engine steps, samples:
    each request's CompletionOutput, with its speculation counts)."""
    config = SchedulerConfig(max_batch=max_batch, speculative_tokens=gamma,
                             drafter=partial(lookup_ngram, min_ngram=min_ngram))
    llm = LLM(model, tokenizer=tokenizer, scheduler=config, num_blocks=256)
    ids = [llm.add_request(p, SamplingParams(max_tokens=new_tokens)) for p in prompts]
    steps = 0
    while llm.has_work:
        llm.step()
        steps += 1
    samples = [llm.output(i).outputs[0] for i in ids]
    return [sample.tokens for sample in samples], steps, samples


def engine_table(args, model, tokenizer) -> None:
    """Engine rows: each prompt alone, then all of them in one batch."""
    print("| prompt | kind | min n-gram | gamma | alpha | tokens per step | speedup | "
          "plain tok/s | same tokens |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---|")
    tasks = task_prompts(tokenizer)
    groups = [(name, kind, [prompt], 1) for kind, name, prompt in tasks]
    groups.append(("all six together", "mixed", [p for _, _, p in tasks], 8))
    for name, kind, prompts, batch in groups:
        plain_seconds, (plain, _, _) = timed(args.repeats, serve, model, tokenizer, prompts,
                                             args.new_tokens, max_batch=batch)
        generated = sum(len(out) for out in plain)
        for gamma, n in itertools.product(args.gamma, args.min_ngram):
            seconds, (outputs, steps, samples) = timed(args.repeats, serve, model, tokenizer,
                                                       prompts, args.new_tokens, gamma, n, batch)
            drafted = sum(s.drafted for s in samples)
            alpha = sum(s.accepted for s in samples) / drafted if drafted else 0.0
            same = "yes" if outputs == plain else "NO"
            print(f"| {name} | {kind} | {n} | {gamma} | {alpha:.2f} | "
                  f"{generated / steps:.2f} | {plain_seconds / seconds:.2f}x | "
                  f"{generated / plain_seconds:.1f} | {same} ({generated} tokens) |")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--gamma", type=int, nargs="+", default=[4])
    parser.add_argument("--min-ngram", type=int, nargs="+", default=[1, 2],
                        help="shortest context match prompt lookup drafts from")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--draft", default=None, help="a draft checkpoint to add rows for")
    parser.add_argument("--no-lookup", action="store_true", help="only the draft's rows")
    parser.add_argument("--engine", action="store_true",
                        help="the serving engine with and without speculation instead")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    tokenizer, model = Tokenizer("smollm2"), load_model("smollm2")
    if args.engine:
        engine_table(args, model, tokenizer)
        return
    draft = load_model(args.draft) if args.draft else None
    if draft is not None:
        print(f"draft {args.draft}: {draft.config.num_layers} layers, cost c = "
              f"{draft_cost(draft, model):.2f} of a target step (bytes read)")
    stop = tokenizer.stop_tokens
    print("| prompt | kind | drafter | gamma | alpha | tokens per call | predicted speedup "
          "| measured speedup | plain tok/s | same tokens |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---|")
    for kind, name, prompt in task_prompts(tokenizer):
        plain_seconds, (plain,) = timed(args.repeats, generate, model, [prompt],
                                        args.new_tokens, stop_tokens=stop)
        for drafter, gamma, cost, proposer in rows_for(args, model, draft, prompt):
            seconds, (tokens, stats) = timed(args.repeats, speculate, model, proposer,
                                             prompt, args.new_tokens, gamma, stop)
            same = "yes" if tokens == plain else "NO"
            alpha = stats.acceptance_rate
            expected = expected_tokens_per_call(alpha, gamma)
            print(f"| {name} | {kind} | {drafter} | {gamma} | {alpha:.2f} | "
                  f"{stats.tokens_per_call:.2f} | {expected / (gamma * cost + 1):.2f}x | "
                  f"{plain_seconds / seconds:.2f}x | {len(plain) / plain_seconds:.1f} | "
                  f"{same} ({len(plain)} tokens) |")


if __name__ == "__main__":
    main()
