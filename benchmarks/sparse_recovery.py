"""Recovering a 2:4-pruned SmolLM2 by distillation from the dense model (chapters 09 + 10).

    python benchmarks/sparse_recovery.py                  # 2:4 Wanda, 300 steps
    python benchmarks/sparse_recovery.py --steps 100 --windows 256

Chapter 09 prunes SmolLM2 to 2:4 with Wanda and loses most of its quality (perplexity far
above the dense model's). Compression papers pair pruning with a short fine-tune that
transfers knowledge back from the dense model; this runs chapter 10's trainer
(:func:`minillm.distill.distill`, top-64 soft targets + the text, forward KL) with the
pruned model as the student and the dense model as the teacher, keeping the 2:4 pattern
after every step (:func:`minillm.quant.sparsity.zeros_keeper`).

Data: ``--windows`` windows of ``--window`` tokens from the Wikipedia *train* split (seed 0);
Wanda calibrates on 16 windows of 512 tokens of the State of the Union train split, as in
chapter 09. Perplexity: the course's short Wikipedia eval slice (``WIKI_EVAL_SHORT``), never
trained on. The budget is stated as optimizer steps and wall time on this machine.
"""

from __future__ import annotations

import argparse
import copy
import time

import torch

from minillm import Tokenizer, load_model
from minillm.distill import DistillConfig, distill, teacher_targets
from minillm.eval import WIKI_EVAL_SHORT, eval_tokens, perplexity
from minillm.machine import describe
from minillm.quant.calibration import calibration_windows
from minillm.quant.sparsity import sparsify_model, weight_sparsity, zeros_keeper


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--windows", type=int, default=512)
    parser.add_argument("--window", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--alpha", type=float, default=0.5, help="weight of the soft targets")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    tokenizer = Tokenizer("smollm2")
    teacher = load_model("smollm2")
    eval_ids = eval_tokens(tokenizer, WIKI_EVAL_SHORT)

    def ppl(model) -> float:
        return perplexity(model, eval_ids, window=WIKI_EVAL_SHORT.window,
                          progress=False).perplexity

    calibration = calibration_windows(tokenizer, 16, 512)
    student = sparsify_model(copy.deepcopy(teacher), pattern="2:4", method="wanda",
                             windows=calibration, progress=False)
    train = calibration_windows(tokenizer, args.windows, args.window, "wikipedia", seed=0)
    start = time.perf_counter()
    targets = teacher_targets(teacher, train, k=64, batch_size=16, progress=False)
    targets_seconds = time.perf_counter() - start
    put_zeros_back = zeros_keeper(student)

    print(f"{describe()}; {WIKI_EVAL_SHORT.describe()}")
    print(f"training text: {train.numel():,} Wikipedia train tokens; teacher targets "
          f"{targets_seconds:.0f} s")
    print(f"dense: perplexity {ppl(teacher):.2f}")
    print()
    print("| steps | tokens seen | train time (s) | perplexity | 2:4 sparsity |")
    print("|---:|---:|---:|---:|---:|")
    print(f"| 0 | 0 | 0 | {ppl(student):.2f} | {weight_sparsity(student):.3f} |", flush=True)
    config = DistillConfig(steps=args.steps, batch_size=args.batch_size, lr=args.lr,
                           alpha=args.alpha, temperature=1.0, seed=0)
    start = time.perf_counter()
    distill(student, targets, config, progress=False, after_step=put_zeros_back)
    seconds = time.perf_counter() - start
    print(f"| {args.steps} | {args.steps * args.batch_size * (args.window - 1):,} | "
          f"{seconds:.0f} | {ppl(student):.2f} | {weight_sparsity(student):.3f} |")

if __name__ == "__main__":
    main()
