"""``minillm train-draft-head --out DIR``: train an EAGLE draft head for a model by
self-distillation (:mod:`minillm.draft_head`) and save it; load it with
``LLM(model, draft_head=DIR, scheduler=SchedulerConfig(speculative_tokens=γ))``.

The engine answers chat prompts built from the corpora's train split (batched, W8A8 by
default: the fast format), the target (as loaded) reads prompt + answer once for its
features, the K tokens the answers use most become the head's vocabulary, and the head
trains unrolled over its own guesses. The answers and features are kept in DIR
(``self_distill.pt``), so a second run with other K or steps skips straight to training.
Held-out numbers come from prompts of the eval split.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from ..checkpoint import load_model
from ..draft_head import DraftHead, save_head
from ..draft_head.storage import default_dir, size_on_disk
from ..draft_head.train import TrainConfig, evaluate, train_head
from ..draft_head.vocab import coverage, frequent_tokens, token_counts
from ..experiments.self_distillation import self_distillation_data
from ..experiments.verification import WEIGHTS, weight_format
from ..tokenizer import Tokenizer

CANDIDATE_K = (1024, 2048, 4096, 8192, 16384)


def add_arguments(parser) -> None:
    parser.add_argument("--out", type=Path, default=None,
                        help=f"directory to write (default {default_dir()})")
    parser.add_argument("--model", default="smollm2", help="checkpoint dir, hub id or smollm2")
    parser.add_argument("--prompts", type=int, default=192, help="training prompts")
    parser.add_argument("--eval-prompts", type=int, default=24, help="held-out prompts")
    parser.add_argument("--answer-tokens", type=int, default=128, help="tokens per answer")
    parser.add_argument("--weights", default="W8A8", choices=WEIGHTS,
                        help="the format the engine answers in")
    parser.add_argument("--k", type=int, default=8192, help="tokens the head can propose")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=4, help="answers per step")
    parser.add_argument("--depth", type=int, default=3, help="unrolled guesses trained")
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--seed", type=int, default=0)


def cached_data(args, target, tokenizer, out: Path) -> dict:
    """The self-distillation data, built once and cached in ``out`` (``self_distill.pt``)."""
    cached = out / "self_distill.pt"
    if cached.exists():
        return torch.load(cached, weights_only=False)
    data = self_distillation_data(target, tokenizer, args.prompts, args.eval_prompts,
                                  args.answer_tokens, args.seed,
                                  answering=weight_format(target, args.weights))
    torch.save(data, cached)
    return data


def run(args) -> None:
    out = args.out or default_dir()
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(args.seed)
    target, tokenizer = load_model(args.model).eval(), Tokenizer(args.model)
    for p in target.parameters():
        p.requires_grad_(False)
    started = time.perf_counter()
    data = cached_data(args, target, tokenizer, out)
    data_seconds = time.perf_counter() - started
    counts = token_counts([a.tokens for a in data["train"]], target.config.vocab_size)
    held_out = torch.cat([a.tokens for a in data["eval"]])
    covered = {k: coverage(frequent_tokens(counts, k, data["corpus_counts"]), held_out)
               for k in CANDIDATE_K}
    print("held-out answer tokens inside the top K: " +
          ", ".join(f"K={k}: {c:.3f}" for k, c in covered.items()))
    head = DraftHead.from_target(target, frequent_tokens(counts, args.k, data["corpus_counts"]))
    config = TrainConfig(steps=args.steps, batch_size=args.batch_size, depth=args.depth,
                         lr=args.lr, seed=args.seed)
    before = evaluate(head, target, data["eval"], args.depth)
    started = time.perf_counter()
    losses = train_head(head, target, data["train"], config)
    after = evaluate(head, target, data["eval"], args.depth)
    report = {"model": args.model, "k": args.k, "steps": args.steps, "depth": args.depth,
              "batch_size": args.batch_size, "lr": args.lr, "seed": args.seed,
              "train_answers": len(data["train"]), "eval_answers": len(data["eval"]),
              "answer_weights": args.weights, "held_out_coverage": covered,
              "held_out_before": before, "held_out_after": after,
              "final_loss": sum(losses[-20:]) / len(losses[-20:]),
              "train_seconds": time.perf_counter() - started, "data_seconds": data_seconds}
    save_head(head, out, report)
    (out / "report.json").write_text(json.dumps(report, indent=2))
    print(f"held-out top-1 agreement per guess: "
          f"{' '.join(f'{a:.3f}' for a in before['top1_per_guess'])} -> "
          f"{' '.join(f'{a:.3f}' for a in after['top1_per_guess'])} (loss {before['loss']:.3f}"
          f" -> {after['loss']:.3f}); wrote {out} ({size_on_disk(out) / 1e6:.1f} MB)")
