"""``minillm generate PROMPT``: continue a prompt, or answer it with --chat."""

from __future__ import annotations

import itertools
import os
import sys
import time

from .. import reference
from ..assets import minillm_home
from ..generate import generate_tokens
from ..sampling import SamplingParams
from .loading import add_executor_option, add_model_options, load, resolve_executor


def add_arguments(parser) -> None:
    parser.add_argument("prompt")
    add_model_options(parser)
    parser.add_argument("--chat", action="store_true",
                        help="wrap the prompt in the chat template")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--repetition-penalty", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--stream", action="store_true", help="print tokens as they come")
    parser.add_argument("--no-cache", action="store_true",
                        help="recompute the prefix every step")
    parser.add_argument("--window", type=int, default=None, help="sliding-window KV cache size")
    add_executor_option(parser)


def check_options(args) -> None:
    """Bad options are reported before anything is loaded or printed."""
    if not args.prompt.strip():
        raise ValueError("the prompt is empty; give some text to continue "
                         "(or a question, with --chat)")
    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be at least 1, got {args.max_new_tokens}")
    if args.window is not None and args.window < 1:
        raise ValueError(f"--window must be at least 1, got {args.window}")


def token_stream(args, model, tokenizer, prompt: list[int]):
    """The new tokens, one [1] tensor per step: the engine, or with --no-cache or --window
    the course's dense loop (:mod:`minillm.reference`), which alone has those caches."""
    sampling = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                              repetition_penalty=args.repetition_penalty, seed=args.seed)
    if args.no_cache or args.window is not None:
        return reference.generate_tokens(model, prompt, args.max_new_tokens, sampling,
                                         use_cache=not args.no_cache, window=args.window,
                                         stop_tokens=tokenizer.stop_tokens,
                                         pad_id=tokenizer.pad_id)
    return generate_tokens(model, prompt, args.max_new_tokens, sampling,
                           stop_tokens=tokenizer.stop_tokens, pad_id=tokenizer.pad_id,
                           executor=resolve_executor(args, model))


def run(args) -> None:
    check_options(args)
    # Inductor's compiled steps go to minillm's home; set before anything imports Inductor,
    # which fixes its cache directory on import (transformers' tokenizer loading does).
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(minillm_home() / "inductor"))
    model, tokenizer = load(args)
    prompt = tokenizer.chat_prompt(args.prompt) if args.chat else tokenizer.prompt(args.prompt)
    room = model.config.max_position_embeddings - len(prompt)
    if args.max_new_tokens > room:
        raise ValueError(f"the prompt takes {len(prompt)} of the model's "
                         f"{model.config.max_position_embeddings} tokens of context; "
                         f"use --max-new-tokens {max(room, 0)} or less")
    stream = token_stream(args, model, tokenizer, prompt)
    first = next(stream)  # any error of the request comes before the prompt is printed
    if not args.chat:
        print(args.prompt, end="", flush=True)
    new_tokens: list[int] = []
    printed = ""
    step_started = time.perf_counter()
    for token in itertools.chain([first], stream):
        if len(new_tokens) == 1:  # the first decode step, which compiles when compiling
            first_step = time.perf_counter() - step_started
        if token.item() in tokenizer.stop_tokens:
            break
        new_tokens.append(token.item())
        if args.stream:  # decode everything so far: a token can be part of a multi-byte char
            text = tokenizer.decode(new_tokens)
            print(text[len(printed):], end="", flush=True)
            printed = text
    if not args.stream:
        print(tokenizer.decode(new_tokens), end="")
    print()
    compiled = not (args.no_cache or args.window) and resolve_executor(args, model) == "compiled"
    if compiled and len(new_tokens) > 1:
        print(f"(decode step compiled in {first_step:.0f} s; Inductor caches it in "
              f"{os.environ['TORCHINDUCTOR_CACHE_DIR']})", file=sys.stderr)
