"""Transformations return new models, and the caller's model never changes.

A transformation (tensor-parallel sharding, a weight format's decode layout, an executor's
layout) swaps some modules of a model for others. Done in place, it would change the
model its caller still holds: a model once given to the compiled executor could no
longer be sharded, and the order of transformations would matter in ways no one could
see. So each transformation starts from :func:`copy_modules`: a new tree of modules that
shares every tensor with the original (no weight is copied), in which it may swap and
set whatever it likes.
"""

from __future__ import annotations

import copy
import itertools

import torch
from torch import nn


def copy_modules(model: nn.Module) -> nn.Module:
    """A new module tree with the same structure, sharing every parameter, buffer and
    tensor attribute with ``model`` (tied weights stay tied): swapping a module or setting
    an attribute in the copy leaves ``model`` as it was. Writing *into* a shared tensor
    would still change both, so transformations build new tensors instead."""
    memo = {}
    for module in model.modules():
        tensors = itertools.chain(module.parameters(recurse=False),
                                  module.buffers(recurse=False),
                                  (v for v in vars(module).values() if isinstance(v, torch.Tensor)))
        memo.update({id(tensor): tensor for tensor in tensors})
    return copy.deepcopy(model, memo)
