"""Rotary position embeddings (RoPE, Su et al. 2021, "RoFormer", eq. 34).

Each pair of channels (i, i + d/2) of a query or key is rotated by the angle
``position * inv_freq[i]``. A dot product between a rotated query at position m and a
rotated key at position n then depends only on m - n: position becomes relative, and
cached keys stay valid forever (they never need to be rotated again).

``inv_freq[i] = theta ** (-2i / d)``. Llama 3 style configs rescale the slow
(long-wavelength) frequencies to stretch the context; ``linear`` scaling divides all of them;
YaRN (Peng et al. 2023, "YaRN", §3.2-3.4: DeepSeek-V3, Qwen long-context configs) blends the
two by how often each channel turns over the original context, and scales cos and sin.
"""

from __future__ import annotations

import math

import torch

from .config import ModelConfig


def inverse_frequencies(config: ModelConfig) -> torch.Tensor:
    """The rotation speed of each channel pair, after any rope scaling: shape [head_dim // 2]."""
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2).float() / dim))
    scaling = config.rope_scaling or {}
    rope_type = scaling.get("rope_type", "default")
    if rope_type == "linear":
        inv_freq = inv_freq / scaling["factor"]
    elif rope_type == "llama3":
        inv_freq = _llama3_scaling(inv_freq, scaling)
    elif rope_type == "yarn":
        inv_freq = _yarn_scaling(inv_freq, scaling, _yarn_factor(config), dim, config.rope_theta)
    return inv_freq


def attention_factor(config: ModelConfig) -> float:
    """What YaRN multiplies cos and sin by (so every attention logit by its square, §3.4:
    ``0.1 ln(s) + 1``, or DeepSeek's ratio of two such terms); 1 for the other ropes."""
    scaling = config.rope_scaling or {}
    if scaling.get("rope_type") != "yarn":
        return 1.0
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    factor = _yarn_factor(config)

    def mscale(k: float = 1.0) -> float:
        return 1.0 if factor <= 1 else 0.1 * k * math.log(factor) + 1.0

    if scaling.get("mscale") and scaling.get("mscale_all_dim"):
        return mscale(scaling["mscale"]) / mscale(scaling["mscale_all_dim"])
    return mscale()


def _yarn_factor(config: ModelConfig) -> float:
    """The context stretch s: the config's factor, or the new context over the old."""
    scaling = config.rope_scaling
    return scaling.get("factor") or \
        config.max_position_embeddings / scaling["original_max_position_embeddings"]


def _yarn_scaling(inv_freq: torch.Tensor, scaling: dict, factor: float, dim: int,
                  base: float) -> torch.Tensor:
    """YaRN's "NTK-by-parts": channels that turn more than ``beta_fast`` times over the
    original context keep their speed, those turning fewer than ``beta_slow`` times are
    divided by the factor, a linear ramp between."""
    old_context = scaling["original_max_position_embeddings"]

    def channel(rotations: float) -> float:  # the pair index that turns `rotations` times
        return dim * math.log(old_context / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = channel(scaling.get("beta_fast") or 32), channel(scaling.get("beta_slow") or 1)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    ramp = ((torch.arange(dim // 2).float() - low) / max(high - low, 0.001)).clamp(0, 1)
    return inv_freq * (1 - ramp) + inv_freq / factor * ramp


def _llama3_scaling(inv_freq: torch.Tensor, scaling: dict) -> torch.Tensor:
    """Llama 3.1's recipe: slow channels divided by ``factor``, fast ones kept, a blend between."""
    factor = scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_context = scaling["original_max_position_embeddings"]
    wavelength = 2 * math.pi / inv_freq
    scaled = torch.where(wavelength > old_context / low, inv_freq / factor, inv_freq)
    blend = (old_context / wavelength - low) / (high - low)
    blended = (1 - blend) * scaled / factor + blend * scaled
    in_between = (wavelength >= old_context / high) & (wavelength <= old_context / low)
    return torch.where(in_between, blended, scaled)


class RotaryEmbedding(torch.nn.Module):
    """Precomputed cos/sin tables for every position up to the model's context length."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        positions = torch.arange(config.max_position_embeddings).float()
        angles = torch.outer(positions, inverse_frequencies(config))  # [max_pos, head_dim/2]
        angles = torch.cat([angles, angles], dim=-1)  # channel i and i + d/2 share an angle
        scale = attention_factor(config)
        self.register_buffer("cos", angles.cos() * scale, persistent=False)
        self.register_buffer("sin", angles.sin() * scale, persistent=False)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin for ``positions`` [batch, seq], shaped [batch, 1, seq, head_dim]."""
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each channel pair of ``x`` [batch, heads, seq, head_dim] by its angle."""
    return x * cos + rotate_half(x) * sin


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) on the two halves of the last dim: a 90-degree turn of each pair."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)
