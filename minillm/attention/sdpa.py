"""PyTorch's fused ``scaled_dot_product_attention``: the same math in one optimised call.

On CPU it picks a flash-style kernel when it can; ``enable_gqa`` lets query heads share
key/value heads without copying them.
"""

from __future__ import annotations

import torch.nn.functional as F


def sdpa_attention(q, k, v, mask=None):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                          enable_gqa=k.shape[1] != q.shape[1])
