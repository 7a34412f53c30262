"""What several commands share: the model options, and loading the model they name with its
conversions (weight-only decode layout, --int8-activations: a :class:`~minillm.prepare.Plan`
that :func:`~minillm.prepare.prepare_model` applies) and its decode executor."""

from __future__ import annotations

import argparse

from ..checkpoint import load_model
from ..engine.executors import EXECUTORS
from ..engine.executors import resolve_executor as engine_executor
from ..prepare import Plan, prepare_model
from ..quant.int8_activations import Int8ActivationLinear
from ..quant.w4a8 import W4A8Linear
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
    """The model (int8/int4 checkpoints in the weight-only decode layout, or with
    --int8-activations W8A8/W4A8) and its tokenizer."""
    model = load_model(args.model, attn_backend=args.backend)
    return prepared(model, args), Tokenizer(args.model)


def prepared(model, args):
    """``model`` in the weight format the options ask for. --int8-activations runs every
    per-channel int8 linear on int8 activations (W8A8), and every grouped int4 one (W4A8)."""
    weights = "int8-activations" if args.int8_activations else "weight-only"
    model = prepare_model(model, Plan(weights=weights))
    if args.int8_activations and not any(isinstance(m, (Int8ActivationLinear, W4A8Linear))
                                         for m in model.modules()):
        raise ValueError(f"--int8-activations needs per-channel int8 weights (or grouped int4), "
                         f"and {args.model} has none; make them with: minillm quantize OUT "
                         "--method rtn --bits 8 --group-size 0 --symmetric --embedding int8")
    return model


def serving_model(args):
    """The engine's model: the checkpoint's name (each process of a tensor-parallel group
    loads its shard), or the loaded model with int8 activations."""
    if not args.int8_activations:
        return args.model
    if args.tensor_parallel > 1:
        raise ValueError("--int8-activations runs in one process; drop --tensor-parallel")
    return prepared(load_model(args.model), args)


def resolve_executor(args, model) -> str:
    """--executor, with auto resolved to the executor it picks for ``model`` (a choice the
    model cannot run is refused, with the reason)."""
    return engine_executor(model, args.executor)
