"""``minillm distill OUT``: distil a layer-dropped draft of the teacher on corpus text
(chapter 10) and save it as a checkpoint; report held-out greedy agreement before and after."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

import torch

from ..checkpoint import load_model, resolve_checkpoint, save_model
from ..distill import DistillConfig, distill, teacher_targets, top1_agreement
from ..draft import layer_dropped
from ..quant.calibration import calibration_windows
from ..quant.checkpoint import copy_tokenizer_files
from ..tokenizer import Tokenizer


def add_arguments(parser) -> None:
    parser.add_argument("out", help="directory to write (loads with load_model(OUT)); a run "
                                    "that finds its state there resumes")
    parser.add_argument("--teacher", default="smollm2", help="checkpoint dir, hub id or smollm2")
    parser.add_argument("--layers", default="0,10,20,29",
                        help="the teacher's blocks the draft keeps, comma-separated")
    parser.add_argument("--corpus", default="wikipedia", help="training text (train split)")
    parser.add_argument("--windows", type=int, default=1024, help="training windows")
    parser.add_argument("--seq-len", type=int, default=256, help="tokens per window")
    parser.add_argument("--eval-windows", type=int, default=32,
                        help="held-out windows (eval split) for the agreement")
    parser.add_argument("--top-k", type=int, default=64, help="teacher logits kept per position")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--alpha", type=float, default=0.9, help="weight of the soft (KD) term")
    parser.add_argument("--temperature", type=float, default=2.0)
    parser.add_argument("--kind", default="forward", choices=("forward", "tv"),
                        help="divergence of the soft term")
    parser.add_argument("--seed", type=int, default=0)


def run(args) -> None:
    torch.manual_seed(args.seed)
    teacher, tokenizer = load_model(args.teacher).eval(), Tokenizer(args.teacher)
    keep = [int(i) for i in args.layers.split(",")]
    student = layer_dropped(teacher, keep)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    targets_file = out / "teacher_targets.pt"  # the teacher runs once, even across resumes
    if targets_file.exists():
        data = torch.load(targets_file, weights_only=False)
    else:
        windows = calibration_windows(tokenizer, args.windows, args.seq_len, args.corpus,
                                      args.seed)
        data = teacher_targets(teacher, windows, k=args.top_k)
        torch.save(data, targets_file)
    held_out = calibration_windows(tokenizer, args.eval_windows, args.seq_len, args.corpus,
                                   args.seed, split="eval")
    best = teacher_targets(teacher, held_out, k=1, progress=False).indices
    before = top1_agreement(layer_dropped(teacher, keep), best, held_out)
    config = DistillConfig(steps=args.steps, batch_size=args.batch_size, lr=args.lr,
                           alpha=args.alpha, temperature=args.temperature, kind=args.kind,
                           seed=args.seed)
    start = time.perf_counter()
    losses = distill(student, data, config, resume_file=out / "distill_state.pt")
    after = top1_agreement(student, best, held_out)
    save_model(student, out)
    copy_tokenizer_files(resolve_checkpoint(args.teacher), out)
    report = {"layers": keep, **asdict(config), "train_tokens": args.steps * args.batch_size
              * (args.seq_len - 1), "held_out_agreement_before": before,
              "held_out_agreement_after": after, "final_loss": losses[-1] if losses else None,
              "seconds_this_run": time.perf_counter() - start}
    (out / "distill_report.json").write_text(json.dumps(report, indent=2))
    print(f"held-out greedy agreement with the teacher ({args.corpus} eval split): "
          f"{before:.3f} -> {after:.3f}; wrote {out} (try: minillm generate --model {out} "
          "\"Hello\")")
