"""Fused projections: q, k and v in one product, gate and up in another.

The three attention projections read the same input, and so do the MLP's gate and up.
Stacking their weights row after row gives one layer whose output is theirs side by side:
the same numbers, in two calls per block instead of five. That saves nothing a roofline
counts (every weight is still read once), but each call of a kernel has a fixed cost
(starting threads, quantizing the input row; for FBGEMM's int8 product ~13 µs before it
touches a weight, more than the whole 192 x 576 key projection takes,
``docs/benchmarks.md``). gpt-fast and vLLM store
these weights fused from the start; here it is a transformation of the plain model, like
:func:`minillm.compile.compile_decode`, applied for decoding.
"""

from __future__ import annotations

import torch
from torch import nn

from .model import MLP, Attention
from .quant.int8_activations import Int8ActivationLinear
from .quant.w4a8 import W4A8Linear
from .quant.weight_only import WeightOnlyLinear


def _stacked(tensors: list[torch.Tensor | None]) -> torch.Tensor | None:
    if all(t is None for t in tensors):
        return None
    if any(t is None for t in tensors):
        raise ValueError("cannot fuse layers of which only some have a bias (or zero points)")
    return torch.cat(tensors)


def concat_outputs(layers: list[nn.Module]) -> nn.Module:
    """One layer whose output is the outputs of ``layers`` (which share an input) side by side.

    Every format here keeps one row of numbers per output (a weight row, or codes with their
    scales and zero points), so joining the layers is stacking those rows.
    """
    first = layers[0]
    if len({type(layer) for layer in layers}) != 1:
        names = [type(layer).__name__ for layer in layers]
        raise TypeError(f"cannot fuse layers of different formats: {names}")
    if type(first) is not nn.Linear and not isinstance(first, (WeightOnlyLinear,
                                                                Int8ActivationLinear, W4A8Linear)):
        raise TypeError(f"cannot fuse {type(first).__name__} layers (fusing supports nn.Linear, "
                        "WeightOnlyLinear, Int8ActivationLinear and W4A8Linear)")
    bias = _stacked([layer.bias for layer in layers])
    if type(first) is nn.Linear:
        weight = torch.cat([layer.weight for layer in layers])
        fused = nn.Linear(first.in_features, weight.shape[0], bias=bias is not None, device="meta")
        fused.weight = nn.Parameter(weight, requires_grad=False)
        fused.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        return fused
    if isinstance(first, WeightOnlyLinear):
        return WeightOnlyLinear(torch.cat([layer.codes for layer in layers]),
                                torch.cat([layer.scales for layer in layers]),
                                _stacked([layer.zeros for layer in layers]), first.bits, bias)
    if isinstance(first, W4A8Linear):
        return W4A8Linear(*(torch.cat([getattr(layer, name) for layer in layers])
                            for name in ("codes", "scales", "zeros")), bias)
    return Int8ActivationLinear(torch.cat([layer.codes for layer in layers]),
                                torch.cat([layer.scales for layer in layers]), bias)


def fuse_projections(model: nn.Module) -> nn.Module:
    """Join every block's q/k/v and gate/up projections into one layer each, in place."""
    for module in model.modules():
        if isinstance(module, Attention) and module.qkv_proj is None:
            module.qkv_proj = concat_outputs([module.q_proj, module.k_proj, module.v_proj])
            module.q_proj = module.k_proj = module.v_proj = None
        elif isinstance(module, MLP) and module.gate_up_proj is None:
            module.gate_up_proj = concat_outputs([module.gate_proj, module.up_proj])
            module.gate_proj = module.up_proj = None
    return model
