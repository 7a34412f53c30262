"""Compiled decoding: ``torch.compile`` the one-token step, over a cache of fixed shape.

An optimization written as a transformation of the plain model (the gpt-fast recipe):

1. decode steps use a :class:`~minillm.kv_cache.StaticKVCache`, so every step has the same
   shapes and one compiled graph serves the whole generation;
2. the step is compiled with Inductor's ``max-autotune`` and *freezing*: weights become
   constants, pre-packed for a C++ matrix-vector kernel that Inductor generates and times
   against MKL. At batch 1 that kernel streams weights at close to the machine's memory
   bandwidth with both cores, where eager PyTorch's matrix-vector product uses one
   (see ``benchmarks/decode.py``); the small element-wise ops fuse too.

The prompt (prefill) and padded batches still run eagerly. Compiling takes a few minutes
on a 2-core CPU, so this pays off for long generations and benchmarks, not for tests.
"""

from __future__ import annotations

import torch

from .kv_cache import StaticKVCache
from .model import Transformer


def compile_decode(model: Transformer, mode: str = "max-autotune-no-cudagraphs") -> Transformer:
    """Make ``model`` run single-token, unpadded steps through a compiled graph (in place)."""
    import torch._inductor.config as inductor_config

    inductor_config.freezing = True  # weights are constants: lets Inductor pre-pack them
    eager_forward = model.forward
    compiled_forward = torch.compile(eager_forward, mode=mode, fullgraph=True, dynamic=False)

    def forward(input_ids, cache=None, attention_mask=None, last_only=False):
        if input_ids.shape[1] == 1 and attention_mask is None and isinstance(cache, StaticKVCache):
            return compiled_forward(input_ids, cache, None, last_only)
        return eager_forward(input_ids, cache, attention_mask, last_only)

    model.forward = forward
    model.cache_class = StaticKVCache
    return model
