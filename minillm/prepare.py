"""One place that turns a model into the model an engine runs, from a declared plan.

A model is served in some weight format, on some executor, maybe as one rank of a
tensor-parallel group. Each of those is a transformation, and their order matters: a
tensor-parallel shard is cut from the stored weights (float or ``QuantLinear``), the
decode layouts of int8/int4 weights are built on the shards, sequence parallelism
rewires a sharded model, and the compiled executor's layout comes last (it only changes
how float products are written). :func:`prepare_model` applies what a :class:`Plan` asks
for in that order, and every step returns a new model: the one the caller passed in is
never changed, so it can be given to another engine, sharded, or compared bit for bit.

    model = prepare_model(load_model("smollm2"), Plan(weights="int8-activations",
                                                      executor="native"))
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from .compile import MatVecLinear
from .model import Transformer
from .parallel.sequence import sequence_parallel
from .parallel.tensor import ShardWeight, shard_weight, tensor_parallel
from .quant.int8_activations import to_int8_activations
from .quant.weight_only import to_weight_only
from .transform import copy_modules

WEIGHT_FORMATS = ("as stored", "weight-only", "int8-activations")


@dataclass(frozen=True)
class TensorParallel:
    """Be rank ``rank`` of ``world``: keep this rank's shard of every weight."""

    rank: int
    world: int
    shard_attention: bool = True
    shard: ShardWeight = shard_weight


@dataclass(frozen=True)
class Plan:
    """What to make of a model, in :func:`prepare_model`'s order:

    ``tensor_parallel``: this rank's shard (:mod:`minillm.parallel.tensor`), or None;
    ``weights``: "as stored", "weight-only" (int8/int4 ``QuantLinear`` layers in their
    decode layout, the same numbers) or "int8-activations" (W8A8 / W4A8: the activations
    rounded to int8 too, which changes the numbers a little);
    ``sequence_parallel``: split a sharded model's residual stream along the sequence
    (whole-sequence forwards only: :mod:`minillm.parallel.sequence`);
    ``executor``: the decode executor the model will run on; "compiled" writes its float
    products in the form Inductor compiles well (:class:`~minillm.compile.MatVecLinear`)."""

    tensor_parallel: TensorParallel | None = None
    weights: str = "as stored"
    sequence_parallel: bool = False
    executor: str = "eager"

    def __post_init__(self):
        if self.weights not in WEIGHT_FORMATS:
            raise ValueError(f"weights must be one of {', '.join(WEIGHT_FORMATS)}, got "
                             f"{self.weights!r}")
        if self.sequence_parallel and self.tensor_parallel is None:
            raise ValueError("sequence parallelism splits a tensor-parallel model: give "
                             "tensor_parallel=TensorParallel(rank, world) too")


def prepare_model(model: Transformer, plan: Plan = Plan()) -> nn.Module:
    """``model`` transformed as ``plan`` says (see the module docstring for the order); a
    new model sharing every tensor it did not change, ``model`` itself untouched. With
    nothing to do, ``model`` itself is returned."""
    if plan.tensor_parallel is not None:
        tp = plan.tensor_parallel
        model = tensor_parallel(model, tp.rank, tp.world, shard_attention=tp.shard_attention,
                                shard=tp.shard)
    if plan.weights == "weight-only":
        model = to_weight_only(model)
    elif plan.weights == "int8-activations":
        model = to_int8_activations(model)
    if plan.sequence_parallel:
        model = sequence_parallel(model)
    if plan.executor == "compiled":
        model = compiled_layout(model)
    return model


def compiled_layout(model: Transformer) -> Transformer:
    """A copy of ``model`` whose float ``nn.Linear`` layers are
    :class:`~minillm.compile.MatVecLinear` (the same parameters, shared): their products of
    a few rows compile into one streaming loop per output row."""
    layout = copy_modules(model)
    for name, module in list(layout.named_modules()):
        if type(module) is nn.Linear:
            layout.set_submodule(name, MatVecLinear.from_linear(module))
    return layout
