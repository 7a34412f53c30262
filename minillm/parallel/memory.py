"""What tensor parallelism does for memory: each of ``t`` GPUs holds ``1/t`` of the weights
and of the KV heads, which leaves room for a longer KV cache, or makes a model fit at all.

Data parallelism needs no communication at inference: ``r`` replicas serve ``r`` times the
requests. But each replica must hold the whole model, and Llama-2-70B in fp16 (138 GB) does
not fit in one 80 GB GPU: there tensor parallelism is needed for memory, not only speed
(:func:`min_world_to_fit`).
"""

from __future__ import annotations

import math

from ..kv_cache import kv_cache_bytes
from .catalogue import ModelShape
from .collectives import check_world


def model_bytes(shape: ModelShape) -> int:
    """Bytes of all the weights (every parameter, embeddings included)."""
    return shape.config().num_parameters() * shape.bytes_per_value


def weights_per_gpu(shape: ModelShape, world: int) -> float:
    """Bytes of weights each of ``world`` tensor-parallel GPUs holds: ``1/t`` of them (the
    norms, replicated, are negligible)."""
    check_world(world)
    return model_bytes(shape) / world


def kv_bytes_per_token_per_gpu(shape: ModelShape, world: int) -> float:
    """KV-cache bytes one token costs each of ``world`` GPUs: its keys and values in every
    layer, for the KV heads this GPU holds (``1/t`` of them; a KV head is never split, so
    ``t`` beyond the KV heads replicates them)."""
    check_world(world)
    one_token = kv_cache_bytes(shape.config(), 1, bytes_per_value=shape.bytes_per_value)
    return one_token / min(world, shape.num_kv_heads)


def kv_tokens_per_gpu(shape: ModelShape, world: int, memory_bytes: float,
                      usable: float = 0.9) -> int:
    """Tokens of KV cache each GPU can hold once its share of the weights is in: the
    batch headroom tensor parallelism buys. ``usable``: the share of memory the server may
    fill (vLLM's ``gpu_memory_utilization``, 0.9 by default); activations are ignored.
    0 when the weights alone do not fit."""
    free = usable * memory_bytes - weights_per_gpu(shape, world)
    return max(0, int(free // kv_bytes_per_token_per_gpu(shape, world)))


def min_world_to_fit(shape: ModelShape, memory_bytes: float) -> int:
    """The fewest GPUs of ``memory_bytes`` each whose memory holds the weights split ``t``
    ways: ``ceil(weights / memory)``. A lower bound: the KV cache and activations need
    room too, and a real split needs ``t`` to divide the heads (so 3 becomes 4).
    Llama-2-70B in fp16 (138 GB) on 80 GB GPUs: 2."""
    if memory_bytes <= 0:
        raise ValueError(f"memory must be positive, got {memory_bytes} bytes")
    return max(1, math.ceil(model_bytes(shape) / memory_bytes))
