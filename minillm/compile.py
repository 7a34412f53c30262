"""Compiled decoding: ``torch.compile`` the one-token step, over a cache of fixed shape.

An optimization written as a transformation of the plain model (the gpt-fast recipe):

1. decode steps use a :class:`~minillm.kv_cache.StaticKVCache`, so every step has the same
   shapes and one compiled graph serves the whole generation;
2. the step is compiled with Inductor's ``max-autotune`` and *freezing*: weights become
   constants, pre-packed for a C++ matrix-vector kernel that Inductor generates and times
   against MKL. At batch 1 that kernel streams weights at close to the machine's memory
   bandwidth with both cores, where eager PyTorch's matrix-vector product uses one
   (see ``benchmarks/decode.py``); the small element-wise ops fuse too. Compressed
   weights (int8/int4, :mod:`minillm.quant.weight_only`) are not frozen: their layers
   are written as one reduction per output row that Inductor turns into a loop reading
   each code byte once.

The prompt (prefill) and padded batches still run eagerly. Compiling takes a few minutes
on a 2-core CPU, so this pays off for long generations and benchmarks, not for tests.
"""

from __future__ import annotations

import torch

from .kv_cache import StaticKVCache
from .linear import CompressedLinear
from .model import Transformer


def compile_decode(model: Transformer, freezing: bool | None = None,
                   autotune: bool = True) -> Transformer:
    """Make ``model`` run single-token, unpadded steps through a compiled graph (in place).

    ``autotune`` times Inductor's matrix-vector kernel against MKL (slower to compile).
    ``freezing`` (default: only for models without compressed weights) lets Inductor treat
    weights as constants and pre-pack fp32 ones for its matrix-vector kernel; on compressed
    weights it would fold the dequantization back into fp32 constants and lose the point.
    """
    if freezing is None:
        freezing = not any(isinstance(m, CompressedLinear) for m in model.modules())
    eager_forward = model.forward
    compiled_forward = torch.compile(eager_forward, fullgraph=True, dynamic=False,
                                     options={"max_autotune": autotune, "freezing": freezing})

    def forward(input_ids, cache=None, attention_mask=None, last_only=False):
        if input_ids.shape[1] == 1 and attention_mask is None and isinstance(cache, StaticKVCache):
            return compiled_forward(input_ids, cache, None, last_only)
        return eager_forward(input_ids, cache, attention_mask, last_only)

    model.forward = forward
    model.cache_class = StaticKVCache
    return model
