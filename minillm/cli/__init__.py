"""The ``minillm`` command: fetch the course assets, generate text, measure perplexity, bench.

    minillm fetch                       # SmolLM2 + corpora into $MINILLM_HOME (once)
    minillm fetch gemma3-270m           # Gemma 3 270M, the second real model (once)
    minillm generate "Once upon a time" --max-new-tokens 40
    minillm generate "What is a KV cache?" --chat --temperature 0.7 --top-p 0.9 --stream
    minillm perplexity --corpus wikipedia --window 512
    minillm quantize out/smollm2-gptq4 --method gptq --bits 4 --group-size 128
    minillm generate "Hello" --model out/smollm2-gptq4
    minillm distill out/draft-4l --layers 0,10,20,29 --steps 2000   # a speculative draft
    minillm bench                       # quick decode-speed table (benchmarks/decode.py has more)
    minillm grade 3                     # score your chapter-3 exercises

Each command is a module of this package with ``add_arguments(parser)`` and ``run(args)``.
A command's module, with its imports, loads only when that command is asked for, so
``minillm --help`` lists the commands from :data:`COMMANDS` without loading any of them.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Iterable
from types import ModuleType

from ..assets import AssetError
from ..grading.grade import GradingError

COMMANDS = {  # name (the module in this package): the line ``minillm --help`` shows
    "fetch": "prepare the course model and text corpora, or gemma3-270m (once)",
    "generate": "continue a prompt, or answer it with --chat",
    "perplexity": "perplexity on a fixed corpus split",
    "grade": "run the graded tests and print your score",
    "quantize": "compress a model's linear layers and save it",
    "distill": "distil a layer-dropped draft of a model and save it",
    "train-draft-head": "train an EAGLE draft head on a model's own answers and save it",
    "serve": "an OpenAI-compatible HTTP server over the engine",
    "bench": "quick decode-speed comparison with Hugging Face",
}


def command_module(name: str) -> ModuleType:
    """The module that implements command ``name`` (dashes as underscores), imported now."""
    return importlib.import_module(f"{__name__}.{name.replace('-', '_')}")


def build_parser(commands: Iterable[str] = COMMANDS) -> argparse.ArgumentParser:
    """The parser of every command; the others of :data:`COMMANDS` get only their help line
    (enough for ``minillm --help``, and their modules are not imported)."""
    parser = argparse.ArgumentParser(prog="minillm", description="LLM inference from the ground up")
    sub = parser.add_subparsers(dest="command", required=True)
    commands = set(commands)
    for name, help_line in COMMANDS.items():
        command = sub.add_parser(name, help=help_line)
        if name in commands:
            command_module(name).add_arguments(command)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv[:1]).parse_args(argv)  # the command, if any, comes first
    try:
        return command_module(args.command).run(args) or 0
    except (ValueError, AssetError, GradingError) as error:
        print(f"minillm {args.command}: error: {error}", file=sys.stderr)
        return 2
