"""Gemma 3 270M's perplexity on the course's Wikipedia slice, minillm beside transformers.

    python benchmarks/gemma_perplexity.py

The slice is :data:`minillm.eval.WIKI_EVAL` (8 windows of 512 tokens, evenly spaced over
the split) tokenized by Gemma's tokenizer. Two readings, both scored on the same 511
tokens per window:

* as the course measures every model: the window's tokens alone, the first one unscored;
* with Gemma's ``<bos>`` before each window (how Gemma was trained to start a document; its
  first token then is scored too, and the window's last is dropped to keep 512 positions).

Each reading is computed by minillm's model (:func:`minillm.eval.perplexity`) and by
transformers' ``Gemma3ForCausalLM`` in float32 from the same checkpoint: the two must
agree to rounding (a parity check of the whole model over 4,096 positions).
"""

from __future__ import annotations

import math

import torch

from minillm import Tokenizer, load_model
from minillm.checkpoint import resolve_checkpoint
from minillm.eval import WIKI_EVAL, eval_tokens, perplexity


def hf_perplexity(model, windows: torch.Tensor) -> float:
    """exp(mean NLL) of ``windows`` [n, L] under transformers' model, every token after
    each window's first scored."""
    total, count = 0.0, 0
    with torch.no_grad():
        for row in windows:
            logits = model(row[None]).logits[0, :-1].float()
            total += torch.nn.functional.cross_entropy(logits, row[1:], reduction="sum").item()
            count += len(row) - 1
    return math.exp(total / count)


def main() -> None:
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(2)
    tokenizer = Tokenizer("gemma3-270m")
    ours = load_model("gemma3-270m")
    theirs = AutoModelForCausalLM.from_pretrained(resolve_checkpoint("gemma3-270m"),
                                                  dtype=torch.float32).eval()
    windows = eval_tokens(tokenizer, WIKI_EVAL).view(WIKI_EVAL.num_windows, WIKI_EVAL.window)
    bos = torch.full((len(windows), 1), tokenizer.prompt("")[0])  # <bos>
    with_bos = torch.cat([bos, windows[:, :-1]], dim=1)
    print(f"{WIKI_EVAL.describe()}, Gemma's tokenizer; float32")
    print("| reading | minillm | transformers |")
    print("|---|---:|---:|")
    for name, rows in (("window alone (the course's rule)", windows),
                       ("<bos> + window", with_bos)):
        mine = perplexity(ours, rows.flatten(), window=WIKI_EVAL.window, progress=False)
        print(f"| {name} | {mine.perplexity:.3f} | {hf_perplexity(theirs, rows):.3f} |")


if __name__ == "__main__":
    main()
