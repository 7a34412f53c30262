"""Chapter 11's draft-head lab on SmolLM2: a fresh head trained by your training step beside
the library's, then drafting inside the engine.

The lab builds its own small self-distillation set in seconds
(:mod:`.self_distillation`: a dozen chat prompts SmolLM2 answers greedily in a few dozen
tokens, and its hidden states over them), so it needs nothing cached and prints the same
on every machine. Two identical fresh heads (:meth:`~minillm.draft_head.DraftHead.from_target`,
over the K tokens SmolLM2's answers and Wikipedia use most) train for a few steps on it,
one with your step and one with the library's, same batches and seeds: the two loss curves
should agree to float rounding. Then the engine decodes a held-out chat prompt greedily
with your head as its draft and without one: the tokens must be equal (speculation is
lossless whatever the head guesses), and τ, the tokens per target pass, says how good the
guesses were. A head this briefly trained guesses little: ``minillm train-draft-head``
trains one for minutes on far more answers (chapter 11's benchmark serves that one).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ..draft_head import DraftHead
from ..draft_head.features import chat_prompts
from ..draft_head.train import TrainConfig, TrainStep, evaluate, train_head, train_step
from ..draft_head.vocab import frequent_tokens, token_counts
from ..model import Transformer
from ..sampling import SamplingParams
from ..serve import LLM, SchedulerConfig
from ..tokenizer import Tokenizer
from .self_distillation import self_distillation_data

LAB_CONFIG = TrainConfig(steps=6, batch_size=2, depth=3, lr=3e-4, max_len=32, seed=0)
LAB_DATA = {"prompts": 12, "eval_prompts": 2, "answer_tokens": 32, "corpus_chars": 200_000}
GAMMA = 2  # guesses per target pass (the faster of 2 and 3 in docs/benchmarks.md)


@dataclass
class Decoded:
    """Greedy answers of the engine with one draft head: tokens per prompt and τ."""

    tokens: list[list[int]]
    tau: float


def fresh_heads(target: Transformer, data: dict, k: int, seed: int = 0) -> list[DraftHead]:
    """Two identical heads started from ``target`` over the K tokens its answers use most."""
    counts = token_counts([a.tokens for a in data["train"]], target.config.vocab_size)
    vocab = frequent_tokens(counts, k, data["corpus_counts"])
    torch.manual_seed(seed)
    head = DraftHead.from_target(target, vocab)
    twin = DraftHead.from_target(target, vocab)
    twin.load_state_dict(head.state_dict())
    return [head, twin]


def decode(target: Transformer, tokenizer: Tokenizer, prompts: list[list[int]], tokens: int,
           head: DraftHead | None = None, gamma: int = GAMMA) -> Decoded:
    """Greedy answers of the engine, with ``head`` drafting ``gamma`` guesses if given."""
    scheduler = SchedulerConfig(max_batch=len(prompts), speculative_tokens=gamma if head else 0)
    llm = LLM(target, tokenizer=tokenizer, num_blocks=128, scheduler=scheduler, draft_head=head)
    outputs = [o.outputs[0] for o in llm.generate(prompts, SamplingParams(max_tokens=tokens),
                                                  progress=False)]
    accepted = sum(o.accepted for o in outputs)
    passes = sum(len(o.tokens) - 1 for o in outputs) - accepted  # the prefill gave token 1
    return Decoded([o.tokens for o in outputs], (accepted + passes) / max(passes, 1))


def train_beside_library(step: TrainStep, target: Transformer, tokenizer: Tokenizer,
                         k: int = 2048, config: TrainConfig = LAB_CONFIG, prompts: int = 1,
                         tokens: int = 24, show_times: bool = False) -> dict:
    """Build a small self-distillation set, train two fresh heads on it, with ``step`` and
    with the library's, print both loss curves and their held-out loss, then :func:`serve`
    yours. Prints only what every machine prints alike (the seconds of each phase too when
    ``show_times``); returns the numbers, seconds included."""
    clock = time.perf_counter()
    data = self_distillation_data(target, tokenizer, **LAB_DATA, seed=config.seed,
                                  progress=False)
    seconds = {"data": time.perf_counter() - clock}
    print(f"self-distillation data: {len(data['train'])} answers to train on, "
          f"{len(data['eval'])} held out, at most {LAB_DATA['answer_tokens']} tokens each")
    heads = dict(zip(("yours", "library"), fresh_heads(target, data, k, config.seed),
                     strict=True))
    before = evaluate(heads["yours"], target, data["eval"], config.depth, config.max_len)["loss"]
    losses = {}
    for (name, head), chosen in zip(heads.items(), (step, train_step), strict=True):
        clock = time.perf_counter()
        losses[name] = train_head(head, target, data["train"], config, progress=False,
                                  step=chosen)
        seconds[name] = time.perf_counter() - clock
    print(f"{config.steps} steps, {config.batch_size} answers of at most {config.max_len} "
          f"tokens per step, {config.depth} passes, K = {k}")
    gap = print_curves(losses)
    after = [evaluate(head, target, data["eval"], config.depth, config.max_len)["loss"]
             for head in heads.values()]
    print(f"held-out loss ({len(data['eval'])} answers): {before:.3f} before, after "
          f"{after[0]:.3f} (yours) {after[1]:.3f} (library)")
    clock = time.perf_counter()
    tau = serve(target, tokenizer, heads["yours"], prompts, tokens)
    seconds["serving"] = time.perf_counter() - clock
    if show_times:
        print("seconds: " + ", ".join(f"{name} {s:.1f}" for name, s in seconds.items()))
    return {**losses, "gap": gap, "held_out": [before, *after], "tau": tau, "seconds": seconds}


def print_curves(losses: dict[str, list[float]], tolerance: float = 1e-4) -> float:
    """Both loss curves side by side (to 3 decimals: what every machine prints alike) and
    whether they agree within ``tolerance``; returns their largest difference."""
    print(f"{'step':>4} {'your loss':>10} {'library':>10}")
    for i, (mine, theirs) in enumerate(zip(*losses.values(), strict=True), 1):
        print(f"{i:>4} {mine:10.3f} {theirs:10.3f}")
    gap = max(abs(a - b) for a, b in zip(*losses.values(), strict=True))
    print(f"the curves agree within {tolerance:.0e}: {gap <= tolerance}")
    return gap


def serve(target: Transformer, tokenizer: Tokenizer, head: DraftHead, prompts: int,
          tokens: int) -> float:
    """Greedy decoding of held-out chat prompts without a head and with ``head``: prints
    whether the tokens are the same and τ; returns τ."""
    ids = chat_prompts(tokenizer, prompts, "eval", seed=1)
    plain = decode(target, tokenizer, ids, tokens)
    drafted = decode(target, tokenizer, ids, tokens, head)
    print(f"greedy, {prompts} held-out prompt(s) x {tokens} tokens, γ = {GAMMA}: your head "
          f"gives the same tokens as plain decoding: {drafted.tokens == plain.tokens}, "
          f"τ = {drafted.tau:.2f} tokens per target pass")
    return drafted.tau
