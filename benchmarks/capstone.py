"""The course's techniques switched on one at a time, on one 64-request trace (SmolLM2, CPU).

    python benchmarks/capstone.py                  # the table in docs/benchmarks.md
    python benchmarks/capstone.py --requests 16    # quicker

The trace is :func:`minillm.experiments.workload.make_trace` (chat questions and passages to
summarise, long-tailed lengths around ``--median-tokens``), all submitted at once; the rows
and what each column means are in :mod:`minillm.experiments.capstone`.
"""

from __future__ import annotations

import argparse

import torch

from minillm import Tokenizer, load_model
from minillm.checkpoint import resolve_checkpoint
from minillm.data import load_documents
from minillm.eval import WIKI_EVAL, evaluate
from minillm.experiments.capstone import PLAIN, capstone_rows, format_table
from minillm.experiments.workload import make_trace


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--median-tokens", type=int, default=32)
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    from transformers import AutoModelForCausalLM

    tokenizer = Tokenizer("smollm2")
    trace = make_trace(tokenizer, args.requests, rate=0, median_tokens=args.median_tokens,
                       passages=load_documents("sotu", "train")[:200])
    hf = AutoModelForCausalLM.from_pretrained(resolve_checkpoint("smollm2"),
                                              dtype=torch.float32).eval()
    def perplexity(model) -> float:
        return evaluate(model, tokenizer, WIKI_EVAL, progress=False).perplexity

    rows = []
    for name, run in capstone_rows(trace, load_model("smollm2"), tokenizer, hf_model=hf,
                                   perplexity=perplexity):
        rows.append(run())
        print(f"{name}: {rows[-1].throughput:.1f} tokens/s", flush=True)
    plain = next(row for row in rows if row.name == PLAIN)
    print(f"\n{args.requests} requests, greedy, {sum(r.max_tokens for r in trace)} tokens at "
          f"most, {sum(map(len, plain.tokens))} generated\n")
    print(format_table(rows, plain))


if __name__ == "__main__":
    main()
