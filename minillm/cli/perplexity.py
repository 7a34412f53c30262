"""``minillm perplexity``: a model's perplexity on a fixed corpus split."""

from __future__ import annotations

from ..data import load_text
from ..eval import perplexity
from .loading import add_model_options, load


def add_arguments(parser) -> None:
    add_model_options(parser)
    parser.add_argument("--corpus", default="wikipedia")
    parser.add_argument("--split", default="eval")
    parser.add_argument("--window", type=int, default=512)
    parser.add_argument("--stride", type=int, default=None)
    parser.add_argument("--max-windows", type=int, default=None)


def run(args) -> None:
    model, tokenizer = load(args)
    tokens = tokenizer.encode(load_text(args.corpus, args.split))
    result = perplexity(model, tokens, window=args.window, stride=args.stride,
                        max_windows=args.max_windows)
    print(f"{args.corpus}/{args.split}: perplexity {result.perplexity:.3f} "
          f"({result.num_tokens} tokens scored in {result.num_windows} windows of {args.window})")
