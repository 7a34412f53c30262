"""Multi-head latent attention (MLA, DeepSeek-V2 §2.1), and why its decode reads so little.

Every token is compressed to one latent vector c = RMSNorm(W_DKV x) of ``kv_lora_rank``
numbers, plus one shared rotary key k_rot of ``qk_rope_head_dim`` numbers. The cache holds
only those two: 512 + 64 = 576 numbers per token and layer for DeepSeek-V3, where its 128
heads of plain MHA would cache 128 x (192 + 128) = 40,960 (keys of 128 + 64, values of
128). Each head's keys and values are up-projections of the latent (DeepSeek-V2,
eqs. 9-11)::

    k_h = [W_UK,h c ; k_rot]        v_h = W_UV,h c

**Absorption.** The score of query head h against a cached token is
q_nope,h . (W_UK,h c) + q_rot,h . k_rot = (W_UK,h^T q_nope,h) . c + q_rot,h . k_rot, so the
query can be moved into latent space once per step and the keys never expanded. Likewise
sum_t p_t W_UV,h c_t = W_UV,h (sum_t p_t c_t): attend over the latents, project once after.
A decode step then reads the 576 cached numbers per token instead of 128 heads' K and V,
and :meth:`LatentAttention.attend_absorbed` equals :meth:`LatentAttention.attend_expanded`
to rounding (tested against float64 and Hugging Face's ``DeepseekV3Attention``).

Parameter names follow the Hugging Face checkpoints (``q_a_proj``, ``kv_a_proj_with_mqa``,
``kv_b_proj``, ...), so a DeepSeek state dict loads without renaming.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .rope import apply_rotary


@dataclass(frozen=True)
class LatentShape:
    """The sizes that define one MLA layer (field names as in DeepSeek's ``config.json``)."""

    num_heads: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None = None  # None: queries come from one full-rank projection
    rope_interleave: bool = True  # DeepSeek stores rotary channels as adjacent pairs

    @classmethod
    def from_hf(cls, hf: dict) -> LatentShape:
        return cls(num_heads=hf["num_attention_heads"], kv_lora_rank=hf["kv_lora_rank"],
                   qk_nope_head_dim=hf["qk_nope_head_dim"],
                   qk_rope_head_dim=hf["qk_rope_head_dim"], v_head_dim=hf["v_head_dim"],
                   q_lora_rank=hf.get("q_lora_rank"),
                   rope_interleave=hf.get("rope_interleave", True))

    def softmax_scale(self, rope_scaling: dict | None) -> float:
        """1/sqrt(qk_head_dim), times YaRN's mscale^2 when ``rope_scaling`` (a config's
        rope parameters) stretches the context (DeepSeek-V3: 0.1 ln(factor) mscale_all_dim
        + 1, Peng et al. 2023, eq. 22)."""
        rope = rope_scaling or {}
        scale = self.qk_head_dim ** -0.5
        if rope.get("rope_type", rope.get("type")) == "yarn" and rope.get("mscale_all_dim") \
                and rope["factor"] > 1:
            scale *= (0.1 * rope["mscale_all_dim"] * math.log(rope["factor"]) + 1.0) ** 2
        return scale

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def cached_numbers_per_token(self) -> int:
        """What the latent cache holds per token and layer: the latent plus the rotary key."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def expanded_numbers_per_token(self) -> int:
        """What a plain MHA cache of the same heads would hold: every head's K and V."""
        return self.num_heads * (self.qk_head_dim + self.v_head_dim)


def rotate_rope_part(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                     interleaved: bool) -> torch.Tensor:
    """RoPE on the rotary channels. Interleaved pairs (x0, x1), (x2, x3), ... are first laid
    out as halves (evens, odds), the layout :func:`~minillm.rope.apply_rotary` rotates; queries
    and keys move alike, so their dot products are those of the interleaved rotation."""
    if interleaved:
        x = torch.cat([x[..., 0::2], x[..., 1::2]], dim=-1)
    return apply_rotary(x, cos, sin)


class LatentAttention(nn.Module):
    """One MLA layer: ``forward(x, cos, sin, mask, cache)`` like :class:`minillm.model.Attention`.

    cos, sin: rotary tables for the ``qk_rope_head_dim`` channels, [batch, 1, seq, rope_dim].
    mask: bool [batch or 1, 1, queries, keys] (True: may attend), or None for "see all".
    cache: a :class:`LatentCache` (or None): it receives each token's latent and rotary key.
    """

    def __init__(self, hidden_size: int, shape: LatentShape, softmax_scale: float | None = None,
                 bias: bool = False, eps: float = 1e-6):
        super().__init__()
        self.shape = s = shape
        if s.q_lora_rank is None:
            self.q_proj = nn.Linear(hidden_size, s.num_heads * s.qk_head_dim, bias=False)
        else:
            self.q_a_proj = nn.Linear(hidden_size, s.q_lora_rank, bias=bias)
            self.q_a_layernorm = nn.RMSNorm(s.q_lora_rank, eps=eps)
            self.q_b_proj = nn.Linear(s.q_lora_rank, s.num_heads * s.qk_head_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(hidden_size, s.cached_numbers_per_token, bias=bias)
        self.kv_a_layernorm = nn.RMSNorm(s.kv_lora_rank, eps=eps)
        self.kv_b_proj = nn.Linear(s.kv_lora_rank, s.num_heads * (s.qk_nope_head_dim
                                                                 + s.v_head_dim), bias=False)
        self.o_proj = nn.Linear(s.num_heads * s.v_head_dim, hidden_size, bias=bias)
        self.softmax_scale = softmax_scale or 1 / math.sqrt(s.qk_head_dim)
        self.absorbed = True  # decode from the latents; False expands every head's K and V

    def queries(self, x, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
        """(q_nope [batch, heads, seq, nope], q_rot [batch, heads, seq, rope]) for ``x``."""
        s, (batch, seq, _) = self.shape, x.shape
        q = (self.q_proj(x) if s.q_lora_rank is None
             else self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))))
        q = q.view(batch, seq, s.num_heads, s.qk_head_dim).transpose(1, 2)
        q_nope, q_rot = q.split([s.qk_nope_head_dim, s.qk_rope_head_dim], dim=-1)
        return q_nope, rotate_rope_part(q_rot, cos, sin, s.rope_interleave)

    def latents(self, x, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
        """What the cache stores: (c [batch, seq, kv_lora_rank], k_rot [batch, seq, rope])."""
        s = self.shape
        c, k_rot = self.kv_a_proj_with_mqa(x).split([s.kv_lora_rank, s.qk_rope_head_dim], -1)
        k_rot = rotate_rope_part(k_rot[:, None], cos, sin, s.rope_interleave)[:, 0]
        return self.kv_a_layernorm(c), k_rot

    def up_projections(self) -> tuple[torch.Tensor, torch.Tensor]:
        """W_UK [heads, nope, rank] and W_UV [heads, v_dim, rank], views of ``kv_b_proj``."""
        s = self.shape
        w = self.kv_b_proj.weight.view(s.num_heads, s.qk_nope_head_dim + s.v_head_dim, -1)
        return w[:, :s.qk_nope_head_dim], w[:, s.qk_nope_head_dim:]

    def attend_expanded(self, q_nope, q_rot, c, k_rot, mask) -> torch.Tensor:
        """The naive form: expand every head's K and V from the latents, then attend.
        -> [batch, heads, queries, v_dim]."""
        w_uk, w_uv = self.up_projections()
        k_nope = torch.einsum("btr,hdr->bhtd", c, w_uk)
        keys = torch.cat([k_nope, k_rot[:, None].expand(-1, k_nope.shape[1], -1, -1)], -1)
        values = torch.einsum("btr,hvr->bhtv", c, w_uv)
        return F.scaled_dot_product_attention(torch.cat([q_nope, q_rot], -1), keys, values,
                                              attn_mask=mask, scale=self.softmax_scale)

    def attend_absorbed(self, q_nope, q_rot, c, k_rot, mask) -> torch.Tensor:
        """The absorbed form: queries moved into latent space, attention over the latents,
        W_UV applied once to the result. Equal to :meth:`attend_expanded`."""
        w_uk, w_uv = self.up_projections()
        q_latent = torch.einsum("bhsd,hdr->bhsr", q_nope, w_uk)
        scores = (q_latent @ c[:, None].transpose(-1, -2)
                  + q_rot @ k_rot[:, None].transpose(-1, -2)) * self.softmax_scale
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        latent_out = scores.softmax(-1) @ c[:, None]  # [batch, heads, queries, rank]
        return torch.einsum("bhsr,hvr->bhsv", latent_out, w_uv)

    def forward(self, x, cos, sin, mask, cache: LatentCache | None = None) -> torch.Tensor:
        batch, seq, _ = x.shape
        q_nope, q_rot = self.queries(x, cos, sin)
        c, k_rot = self.latents(x, cos, sin)
        if cache is not None:
            c, k_rot = cache.append(c, k_rot)
        attend = self.attend_absorbed if self.absorbed else self.attend_expanded
        out = attend(q_nope, q_rot, c, k_rot, mask)
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq, -1))


class LatentKVCache:
    """A whole model's latent cache for the dense decoding loop: one :class:`LatentCache`
    per layer, and the step bookkeeping of :class:`minillm.kv_cache.KVCache` (every query
    sees every earlier step)."""

    window: int | None = None
    decode_needs_mask = False

    def __init__(self, num_layers: int):
        self.layers = [LatentCache() for _ in range(num_layers)]
        self.length = 0

    def attend_latent(self, attn: LatentAttention, x, cos, sin, mask) -> torch.Tensor:
        """Layer ``attn.layer_index``'s attention over its cached latents and the new ones."""
        return LatentAttention.forward(attn, x, cos, sin, mask, self.layers[attn.layer_index])

    def steps(self, n_new: int) -> tuple[torch.Tensor, torch.Tensor]:
        key_steps = torch.arange(self.length + n_new)
        return key_steps[self.length:], key_steps

    def advance(self, n_new: int) -> None:
        self.length += n_new

    def nbytes(self) -> int:
        return sum(layer.nbytes for layer in self.layers)


class LatentCache:
    """A contiguous per-layer cache of latents and rotary keys (the readable form; the
    engine's paged pool stores the same 576 numbers per token in blocks)."""

    def __init__(self):
        self.c: torch.Tensor | None = None
        self.k_rot: torch.Tensor | None = None

    def append(self, c: torch.Tensor, k_rot: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Add the new tokens' entries; return every cached one, new included."""
        self.c = c if self.c is None else torch.cat([self.c, c], dim=1)
        self.k_rot = k_rot if self.k_rot is None else torch.cat([self.k_rot, k_rot], dim=1)
        return self.c, self.k_rot

    @property
    def nbytes(self) -> int:
        return 0 if self.c is None else (self.c.nbytes + self.k_rot.nbytes)
