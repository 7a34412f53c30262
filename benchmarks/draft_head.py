"""An EAGLE draft head inside the engine vs plain decoding, SmolLM2, held-out chat prompts.

    python benchmarks/draft_head.py                       # the head minillm train-draft-head saved
    python benchmarks/draft_head.py --head DIR --gamma 2 3 4 5 --batch 1 4 --weights fp32 W8A8

For each weight format and batch size B, the same held-out prompts (chat and creative ones
of :mod:`minillm.task_prompts`, then eval-split prompts of :mod:`minillm.draft_head.features`:
none was trained on) are decoded greedily, B at a time, by a plain engine and by engines
whose draft head guesses γ tokens per target pass, alternating plain and speculative runs
(``--repeats``, best time each). Every speculative output is checked equal to the plain one.

Columns: τ (tokens per target pass, the accepted guesses plus the target's own token),
c (the head's cost per guess: B head steps over one token each, timed alone, as the
proposer runs sequence by sequence, over one plain decode step of B rows), tokens/s and
the speedup over plain decoding. Wall time includes the prompts' prefill (the same in
both). The speedup model: τ / (r(γ+1) + γ·c).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from minillm.checkpoint import load_model
from minillm.draft_head import load_head
from minillm.draft_head.features import chat_prompts
from minillm.draft_head.storage import default_dir
from minillm.experiments.verification import weight_format
from minillm.sampling import SamplingParams
from minillm.serve import LLM, SchedulerConfig
from minillm.task_prompts import task_prompts
from minillm.tokenizer import Tokenizer


def held_out_prompts(tokenizer, count: int) -> list[list[int]]:
    chat = [ids for kind, _, ids in task_prompts(tokenizer) if kind != "input-grounded"]
    return (chat + chat_prompts(tokenizer, count, "eval", seed=12345))[:count]


def decode(model, prompts, tokens, batch, head=None, gamma=0, stop=()):
    """Seconds, outputs (token lists), accepted and target passes."""
    scheduler = SchedulerConfig(max_batch=batch, speculative_tokens=gamma)
    llm = LLM(model, num_blocks=512, scheduler=scheduler, draft_head=head)
    params = SamplingParams(max_tokens=tokens, stop_token_ids=tuple(stop))
    started = time.perf_counter()
    outputs = [o.outputs[0] for o in llm.generate(prompts, params, progress=False)]
    seconds = time.perf_counter() - started
    accepted = sum(o.accepted for o in outputs)
    passes = sum(len(o.tokens) - 1 for o in outputs) - accepted
    return seconds, [o.tokens for o in outputs], accepted, passes


@torch.inference_mode()
def head_step_seconds(head, target, history: int = 100, repeats: int = 50) -> float:
    """One guess: a head step over one token after ``history`` positions, its logits and
    the proposal distribution (greedy)."""
    hidden = target.config.hidden_size
    _, past = head.extend(torch.randn(history, hidden), torch.randn(history, hidden),
                          torch.arange(history), None)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        g, _ = head.extend(torch.randn(1, hidden), target.embed_tokens(torch.tensor([5])).float(),
                           torch.tensor([history]), past)
        head.proposal(head.logits(g[-1]), SamplingParams())
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head", default=None, help=f"draft head dir (default {default_dir()})")
    parser.add_argument("--gamma", type=int, nargs="+", default=[2, 3, 4, 5])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--weights", nargs="+", default=["fp32", "W8A8"])
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    plain_model, tokenizer = load_model("smollm2").eval(), Tokenizer("smollm2")
    head = load_head(args.head or default_dir())
    prompts = held_out_prompts(tokenizer, args.prompts)
    print(f"head: K = {head.num_tokens}; {len(prompts)} held-out prompts, "
          f"{args.new_tokens} new tokens each, greedy; {torch.get_num_threads()} threads")
    print("| weights | B | γ | τ | c | tokens/s | plain tokens/s | speedup | lossless |")
    print("|---|---|---|---|---|---|---|---|---|")
    for weights in args.weights:
        model = weight_format(plain_model, weights)
        for batch in args.batch:
            rows(args, model, head, prompts, batch, weights, tokenizer.stop_tokens)


def rows(args, model, head, prompts, batch, weights, stop) -> None:
    """The table's rows of one weight format and batch size, γ by γ."""
    decode(model, prompts, args.new_tokens, batch, stop=stop)  # warm-up (kernels, allocator)
    plain_best, plain = float("inf"), None
    for gamma in args.gamma:
        best = float("inf")
        for _ in range(args.repeats):  # interleaved: plain, speculative, ...
            seconds, plain, *_ = decode(model, prompts, args.new_tokens, batch, stop=stop)
            plain_best = min(plain_best, seconds)
            seconds, outputs, accepted, passes = decode(model, prompts, args.new_tokens, batch,
                                                        head, gamma, stop)
            best = min(best, seconds)
        tokens = sum(len(t) for t in plain)
        step = plain_best / max(1, tokens / batch)  # ~ one plain step (B rows)
        cost = batch * head_step_seconds(head, model) / step  # the head runs row by row
        print(f"| {weights} | {batch} | {gamma} | {(accepted + passes) / passes:.2f} "
              f"| {cost:.3f} | {tokens / best:.1f} | {tokens / plain_best:.1f} "
              f"| {plain_best / best:.2f}x | {outputs == plain} |", flush=True)

if __name__ == "__main__":
    main()
