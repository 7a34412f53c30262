"""What several commands share: the model options, and loading the model they name with its
conversions (weight-only decode layout, --int8-activations) and its decode executor."""

from __future__ import annotations

import argparse

from ..checkpoint import load_model
from ..quant.int8_activations import Int8ActivationLinear, to_int8_activations
from ..quant.w4a8 import W4A8Linear
from ..quant.weight_only import to_weight_only
from ..serve.executors import EXECUTORS, auto_executor
from ..tokenizer import Tokenizer


def add_model_options(parser: argparse.ArgumentParser) -> None:
    """--model, --backend and --int8-activations, as :func:`load` reads them."""
    parser.add_argument("--model", default="smollm2",
                        help="checkpoint dir, hub id, or smollm2 (default)")
    parser.add_argument("--backend", default="sdpa", help="attention backend: sdpa, naive, ...")
    parser.add_argument("--int8-activations", action="store_true",
                        help="with per-channel int8 weights: round activations to int8 too and "
                             "multiply in integers (W8A8; grouped int4 weights: W4A8), "
                             "slightly less accurate")


def add_executor_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--executor", default="auto", choices=EXECUTORS,
                        help="how decode steps are computed: native (C++; float32, W8A8, "
                             "W4A8), compiled (torch.compile per batch bucket: the "
                             "weight-only int8/int4 layouts; the first steps take a minute "
                             "or two to compile), eager, or auto (the fastest the model "
                             "allows)")


def load(args):
    """The model (int8/int4 checkpoints in the weight-only decode layout) and its tokenizer."""
    model = load_model(args.model, attn_backend=args.backend)
    if args.int8_activations:
        use_int8_activations(model, args.model)
    return to_weight_only(model), Tokenizer(args.model)


def use_int8_activations(model, source: str) -> None:
    """--int8-activations: run every per-channel int8 linear on int8 activations (W8A8), and
    every grouped int4 one (W4A8)."""
    to_int8_activations(model)
    if not any(isinstance(m, (Int8ActivationLinear, W4A8Linear)) for m in model.modules()):
        raise ValueError(f"--int8-activations needs per-channel int8 weights (or grouped int4), "
                         f"and {source} has none; make them with: minillm quantize OUT "
                         "--method rtn --bits 8 --group-size 0 --symmetric --embedding int8")


def serving_model(args):
    """The engine's model: the checkpoint's name (each process of a tensor-parallel group
    loads its shard), or the loaded model with int8 activations."""
    if not args.int8_activations:
        return args.model
    if args.tensor_parallel > 1:
        raise ValueError("--int8-activations runs in one process; drop --tensor-parallel")
    model = load_model(args.model)
    use_int8_activations(model, args.model)
    return model


def resolve_executor(args, model) -> str:
    """--executor, with auto resolved to the executor it picks for ``model``."""
    return auto_executor(model) if args.executor == "auto" else args.executor
