"""The roofline model's counts against PyTorch's FLOP counter and the tensors themselves."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from minillm.config import ModelConfig
from minillm.kv_cache import KVCache
from minillm.model import Transformer
from minillm.quant.qlinear import weight_bytes_per_token
from minillm.roofline import (
    Roofline,
    forward_bytes,
    forward_flops,
    matmul_bytes,
    matmul_flops,
    weight_bytes,
)
from minillm.testing import TINY


def counted_flops(model, ids, cache, last_only=True) -> int:
    """What torch's FLOP counter sees in a forward pass (matmuls and attention)."""
    with FlopCounterMode(display=False) as counter, torch.inference_mode():
        model(ids, cache, last_only=last_only)
    return counter.get_total_flops()


@pytest.mark.parametrize("tied", [True, False])
def test_forward_flops_match_torch_flop_counter(tied):
    config = ModelConfig(**{**TINY, "tie_word_embeddings": tied})
    model = Transformer(config, attn_backend="naive").eval()
    cache = KVCache(config, batch_size=2, max_len=16)
    prompt = torch.randint(0, config.vocab_size, (2, 7))
    prefill = counted_flops(model, prompt, cache, last_only=False)
    # the naive backend computes every score, then masks: the causal count skips the masked half
    masked_pairs = 7 * 7 - 7 * 8 // 2
    masked = 4 * config.num_layers * config.num_heads * config.head_dim * masked_pairs * 2
    assert prefill == forward_flops(config, 7, batch_size=2, last_only=False) + masked
    decode = counted_flops(model, torch.randint(0, config.vocab_size, (2, 1)), cache)
    assert decode == forward_flops(config, 1, batch_size=2, past_tokens=7)


@pytest.mark.parametrize("tied", [True, False])
def test_weight_bytes_match_the_bench_count(tied):
    config = ModelConfig(**{**TINY, "tie_word_embeddings": tied})
    model = Transformer(config)
    assert weight_bytes(config) == weight_bytes_per_token(model)
    cache = KVCache(config, batch_size=3, max_len=10)
    assert forward_bytes(config, 4, batch_size=3, past_tokens=6) == (weight_bytes(config)
                                                                     + cache.nbytes())


def test_matmul_counts_and_roofline():
    a, b = torch.empty(3, 5), torch.empty(5, 7)
    assert matmul_bytes(3, 5, 7) == a.nbytes + b.nbytes + (a @ b).nbytes
    assert matmul_flops(3, 5, 7) == 2 * 3 * 5 * 7
    roof = Roofline(peak_flops=100e9, bandwidth=20e9)
    assert roof.ridge_point == 5
    assert roof.attainable(1.0) == 20e9 and roof.attainable(50.0) == 100e9
    assert roof.time(flops=1e9, nbytes=1e6) == 1e9 / 100e9  # compute-bound
    assert roof.time(flops=1e6, nbytes=1e9) == 1e9 / 20e9  # memory-bound


def test_roofline_measure_returns_plausible_roofs():
    roof = Roofline.measure(matmul_size=256, copy_megabytes=16)
    assert 1e8 < roof.peak_flops < 1e16 and 1e8 < roof.bandwidth < 1e14
