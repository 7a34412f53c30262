"""Chapter 11's draft-head lab on SmolLM2: a fresh head trained by your training step beside
the library's, then drafting inside the engine.

Two identical fresh heads (:meth:`~minillm.draft_head.DraftHead.from_target`, over the K
tokens SmolLM2's answers use most) train for a few steps on the self-distillation data
``minillm train-draft-head`` cached (``self_distill.pt``: SmolLM2's answers and its hidden
states over them), one with your step and one with the library's, same batches and seeds:
the two loss curves should agree to float rounding. Then the engine decodes held-out chat
prompts greedily with your head as its draft and without one: the tokens must be equal
(speculation is lossless whatever the head guesses), and τ, the tokens per target pass,
says how good the guesses were. A head this briefly trained guesses little; the cached head
(``minillm train-draft-head``'s, trained for minutes) is run beside it for comparison.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..draft_head import DraftHead, load_head
from ..draft_head.features import chat_prompts
from ..draft_head.storage import default_dir
from ..draft_head.train import TrainConfig, TrainStep, evaluate, train_head, train_step
from ..draft_head.vocab import frequent_tokens, token_counts
from ..model import Transformer
from ..sampling import SamplingParams
from ..serve import LLM, SchedulerConfig
from ..tokenizer import Tokenizer

LAB_CONFIG = TrainConfig(steps=6, batch_size=2, depth=3, lr=3e-4, max_len=32, seed=0)
GAMMA = 2  # guesses per target pass (the faster of 2 and 3 in docs/benchmarks.md)


@dataclass
class Decoded:
    """Greedy answers of the engine with one draft head: tokens per prompt, τ, seconds."""

    tokens: list[list[int]]
    tau: float
    seconds: float


def self_distillation_data(directory: str | Path | None = None) -> dict:
    """The answers and features ``minillm train-draft-head`` cached in ``directory``."""
    path = Path(directory or default_dir()) / "self_distill.pt"
    if not path.exists():
        raise FileNotFoundError(f"no self-distillation data at {path}: run "
                                "`minillm train-draft-head` once (it caches it there)")
    return torch.load(path, weights_only=False)


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
    started = time.perf_counter()
    outputs = [o.outputs[0] for o in llm.generate(prompts, SamplingParams(max_tokens=tokens),
                                                  progress=False)]
    seconds = time.perf_counter() - started
    accepted = sum(o.accepted for o in outputs)
    passes = sum(len(o.tokens) - 1 for o in outputs) - accepted  # the prefill gave token 1
    return Decoded([o.tokens for o in outputs], (accepted + passes) / max(passes, 1), seconds)


def train_beside_library(step: TrainStep, target: Transformer, tokenizer: Tokenizer,
                         k: int = 2048, config: TrainConfig = LAB_CONFIG, prompts: int = 1,
                         tokens: int = 24) -> dict:
    """Train two fresh heads, with ``step`` and with the library's, print both loss curves
    and their held-out loss, then :func:`serve` yours. Returns the numbers."""
    data = self_distillation_data()
    heads = dict(zip(("yours", "library"), fresh_heads(target, data, k, config.seed),
                     strict=True))
    held_out = data["eval"][:2]
    before = evaluate(heads["yours"], target, held_out, config.depth, config.max_len)["loss"]
    losses = {}
    for (name, head), chosen in zip(heads.items(), (step, train_step), strict=True):
        started = time.perf_counter()
        losses[name] = train_head(head, target, data["train"], config, progress=False,
                                  step=chosen)
        print(f"{name}: {config.steps} steps in {time.perf_counter() - started:.1f} s", end="; ")
    print(f"{config.batch_size} answers of at most {config.max_len} tokens per step, "
          f"{config.depth} passes, K = {k}")
    gap = print_curves(losses)
    after = [evaluate(head, target, held_out, config.depth, config.max_len)["loss"]
             for head in heads.values()]
    print(f"held-out loss ({len(held_out)} answers): {before:.3f} before, after "
          f"{after[0]:.3f} (yours) {after[1]:.3f} (library)")
    tau = serve(target, tokenizer, heads["yours"], prompts, tokens)
    return {**losses, "gap": gap, "held_out": [before, *after], "tau": tau}


def print_curves(losses: dict[str, list[float]]) -> float:
    """Both loss curves side by side; returns their largest difference."""
    print(f"{'step':>4} {'your loss':>10} {'library':>10}")
    for i, (mine, theirs) in enumerate(zip(*losses.values(), strict=True), 1):
        print(f"{i:>4} {mine:10.5f} {theirs:10.5f}")
    gap = max(abs(a - b) for a, b in zip(*losses.values(), strict=True))
    print(f"largest difference: {gap:.1e}")
    return gap


def serve(target: Transformer, tokenizer: Tokenizer, head: DraftHead, prompts: int,
          tokens: int) -> dict[str, float]:
    """Greedy decoding of held-out chat prompts without a head, with ``head`` and with the
    cached head: prints equality with plain decoding and τ; returns τ per head."""
    ids = chat_prompts(tokenizer, prompts, "eval", seed=1)
    plain = decode(target, tokenizer, ids, tokens)
    runs = {"your head": decode(target, tokenizer, ids, tokens, head),
            "cached head": decode(target, tokenizer, ids, tokens, load_head(default_dir()))}
    print(f"greedy, {prompts} held-out prompt(s) x {tokens} tokens, γ = {GAMMA}; plain decoding "
          f"{plain.seconds:.1f} s")
    for name, run in runs.items():
        print(f"{name:<12} same tokens as plain: {run.tokens == plain.tokens}, "
              f"τ = {run.tau:.2f} tokens per target pass, {run.seconds:.1f} s")
    return {name: run.tau for name, run in runs.items()}
