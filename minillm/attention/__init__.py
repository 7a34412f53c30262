"""Attention backends: interchangeable implementations of one function.

Every backend computes ``softmax(q kᵀ / sqrt(d) + mask) v`` with the same signature::

    backend(q, k, v, mask) -> out
    q:    [batch, num_heads,    q_len,  head_dim]
    k, v: [batch, num_kv_heads, kv_len, head_dim]   (num_heads % num_kv_heads == 0)
    mask: bool [batch or 1, 1, q_len, kv_len], True where a query may look, or None (all allowed)
    out:  [batch, num_heads, q_len, head_dim]

Query head ``h`` reads key/value head ``h // (num_heads // num_kv_heads)``, so MHA, GQA
and MQA are one code path. The model picks a backend by name (``attn_backend=...``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .naive import naive_attention
from .sdpa import sdpa_attention
from .tiled import tiled_attention

AttentionBackend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None],
                            torch.Tensor]

BACKENDS: dict[str, AttentionBackend] = {
    "naive": naive_attention,
    "sdpa": sdpa_attention,
    "tiled": tiled_attention,
}


def get_backend(name: str) -> AttentionBackend:
    """Look up a backend by name, with an error that lists the choices.

    ``triton`` is imported on first use: it needs Triton, and on a CPU the environment
    variable ``TRITON_INTERPRET=1`` set before the import.
    """
    if name == "triton" and name not in BACKENDS:
        from minillm.kernels.flash_attention import triton_attention  # Triton: only here

        BACKENDS["triton"] = triton_attention
    try:
        return BACKENDS[name]
    except KeyError:
        raise ValueError(
            f"unknown attention backend {name!r}; choose one of "
            f"{', '.join(sorted([*BACKENDS, 'triton']))}"
        ) from None
