"""The roofline model: is a computation limited by arithmetic or by memory traffic?

A kernel that performs ``F`` floating-point operations and moves ``B`` bytes between
memory and the processor needs at least ``F / peak_flops`` seconds to compute and at
least ``B / bandwidth`` seconds to move its data. Whichever is larger bounds its time.
Its *arithmetic intensity* ``I = F / B`` (FLOPs per byte) decides which: below the
*ridge point* ``peak_flops / bandwidth`` it is memory-bound, above it compute-bound.
Williams, Waterman & Patterson (2009) draw this as

    attainable FLOP/s = min(peak FLOP/s, bandwidth x I)

on log-log axes: a slanted roof (memory) meeting a flat one (compute).

For a transformer forward pass this module counts ``F`` and ``B`` from the config alone:

* FLOPs: 2 per multiply-add of every matrix product (the linear layers: about
  ``2 x parameters x tokens``), plus attention's ``q kᵀ`` and ``p v``;
* bytes: every weight read once (shared by all tokens of the pass), plus the KV cache read.

Activations are assumed to stay in the processor's caches, so the byte count is the
minimum traffic: exact enough for decode (which reads little else), optimistic for
long prefills. The machine's two roofs are measured by :meth:`Roofline.measure` with
:func:`matmul_flops_per_second` (a large fp32 matmul: high intensity, so its speed is the
compute roof) and :func:`copy_bandwidth` (STREAM's copy).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from .config import ModelConfig
from .kv_cache import kv_cache_bytes


def copy_bandwidth(megabytes: int = 256, repeats: int = 10) -> float:
    """Bytes moved per second (read + write) by copying a tensor much larger than the caches."""
    src = torch.randn(megabytes * (1 << 20) // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - start)
    return 2 * src.nbytes / best


def matmul_flops_per_second(n: int = 2048, repeats: int = 5) -> float:
    """Best FLOP/s of an [n, n] @ [n, n] fp32 matmul: this machine's compute roof."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


def matmul_flops(m: int, k: int, n: int) -> int:
    """FLOPs of [m, k] @ [k, n]: m x n outputs, each k multiply-adds of 2 FLOPs."""
    return 2 * m * k * n


def matmul_bytes(m: int, k: int, n: int, bytes_per_value: int = 4) -> int:
    """Minimum memory traffic of [m, k] @ [k, n]: read both inputs once, write the output once."""
    return (m * k + k * n + m * n) * bytes_per_value


@dataclass(frozen=True)
class Roofline:
    """A machine's two roofs: ``peak_flops`` (FLOP/s) and memory ``bandwidth`` (bytes/s)."""

    peak_flops: float
    bandwidth: float

    @classmethod
    def measure(cls, matmul_size: int = 2048, copy_megabytes: int = 256) -> Roofline:
        """Measure both roofs on this machine (a few seconds), with torch's current threads."""
        return cls(matmul_flops_per_second(matmul_size), copy_bandwidth(copy_megabytes))

    @property
    def ridge_point(self) -> float:
        """The arithmetic intensity (FLOPs/byte) where memory-bound turns into compute-bound."""
        return self.peak_flops / self.bandwidth

    def attainable(self, intensity):
        """Attainable FLOP/s at an arithmetic intensity (a number or an array of them)."""
        return np.minimum(self.peak_flops, self.bandwidth * np.asarray(intensity, dtype=float))

    def time(self, flops: float, nbytes: float) -> float:
        """Lower bound on the seconds to do ``flops`` FLOPs while moving ``nbytes`` bytes."""
        return max(flops / self.peak_flops, nbytes / self.bandwidth)


def layer_matmul_parameters(config: ModelConfig) -> int:
    """Weights of one layer's linear maps: q, k, v, o projections and the SwiGLU MLP."""
    d, h = config.hidden_size, config.head_dim
    attention = d * h * (config.num_heads + 2 * config.num_kv_heads) + config.num_heads * h * d
    return attention + 3 * d * config.intermediate_size


def forward_flops(config: ModelConfig, new_tokens: int, batch_size: int = 1,
                  past_tokens: int = 0, last_only: bool = True) -> int:
    """FLOPs of one forward pass over ``new_tokens`` per sequence after ``past_tokens`` cached.

    * layers' linear maps: 2 x their weights x every new token;
    * lm_head: 2 x vocab x hidden for each position that gets logits (only the last one
      with ``last_only``, as in generation);
    * attention, causal: query i (0-based among the new ones) sees past + i + 1 keys; per
      query-key pair and head, ``q·k`` and ``p·v`` cost 2 x head_dim FLOPs each.

    Norms, RoPE and the softmax are elementwise: negligible next to these.
    """
    tokens = batch_size * new_tokens
    linear = 2 * config.num_layers * layer_matmul_parameters(config) * tokens
    logits_positions = batch_size * (1 if last_only else new_tokens)
    head = 2 * config.vocab_size * config.hidden_size * logits_positions
    pairs = new_tokens * past_tokens + new_tokens * (new_tokens + 1) // 2
    attention = 4 * config.num_layers * config.num_heads * config.head_dim * pairs * batch_size
    return linear + head + attention


def weight_bytes(config: ModelConfig, bytes_per_value: int = 4) -> int:
    """Bytes of weights one forward pass reads: all of them, except an untied embedding table
    (of which a pass reads only a few rows). Equals
    :func:`minillm.quant.qlinear.weight_bytes_per_token` for a float model."""
    params = config.num_parameters()
    if not config.tie_word_embeddings:
        params -= config.vocab_size * config.hidden_size
    return params * bytes_per_value


def forward_bytes(config: ModelConfig, new_tokens: int, batch_size: int = 1,
                  past_tokens: int = 0, bytes_per_value: int = 4) -> int:
    """Minimum bytes one forward pass moves: the weights once, and the KV cache of
    ``past_tokens + new_tokens`` steps (read by attention) for every sequence."""
    kv = kv_cache_bytes(config, past_tokens + new_tokens, batch_size, bytes_per_value)
    return weight_bytes(config, bytes_per_value) + kv
