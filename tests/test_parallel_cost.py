"""Tensor parallelism's communication arithmetic against numbers worked out by hand."""

from __future__ import annotations

import importlib.util
import io
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from minillm.config import ModelConfig
from minillm.parallel.cost import (
    ETHERNET_10G,
    H100,
    INTERCONNECTS,
    LLAMA2_7B,
    LLAMA2_70B,
    NVLINK4,
    PCIE4,
    SMOLLM2_135M,
    Accelerator,
    Interconnect,
    ModelShape,
    all_gather_time,
    all_reduce_time,
    communication_table,
    compute_time,
    decode_time,
    kv_bytes_per_token_per_gpu,
    kv_tokens_per_gpu,
    layers_communication_time,
    min_world_to_fit,
    model_bytes,
    ring_all_gather_bytes,
    ring_all_reduce_bytes,
    ring_reduce_scatter_bytes,
    sequence_parallel_layer_bytes_per_token,
    throughput,
    tp_bytes_per_pass,
    tp_bytes_per_token,
    tp_layer_bytes_per_token,
    tp_speedup,
    tp_stops_paying,
    vocab_bytes_per_token,
    weights_per_gpu,
)

# A link with round numbers, so times can be worked out by hand: 10 µs per step, 1 GB/s.
SLOW = Interconnect("test", bandwidth=1e9, latency=1e-5)
FREE = Interconnect("free", bandwidth=1e30, latency=0.0)
# Llama-2-7B's weights one decode step reads: all but the (untied) embedding table, fp16.
READ_7B = (6_738_415_616 - 32000 * 4096) * 2


def test_ring_collectives_bytes():
    assert ring_all_reduce_bytes(1000, 4) == 1500  # 2 x 3/4 x 1000
    assert ring_all_reduce_bytes(1000, 2) == 1000
    assert ring_all_reduce_bytes(1000, 1) == 0
    assert ring_all_gather_bytes(1000, 4) == 750
    assert ring_reduce_scatter_bytes(1000, 4) == 750
    assert ring_all_gather_bytes(1000, 1) == ring_reduce_scatter_bytes(1000, 1) == 0
    for world in (2, 3, 8, 64):  # reduce-scatter + all-gather = all-reduce; bounded by 2n
        n = 7 * world
        assert ring_reduce_scatter_bytes(n, world) + ring_all_gather_bytes(n, world) \
            == ring_all_reduce_bytes(n, world) < 2 * n


@pytest.mark.parametrize("world", [0, -1, 1.5, True, "2"])
def test_invalid_world_raises(world):
    for call in (lambda: ring_all_reduce_bytes(1000, world),
                 lambda: ring_all_gather_bytes(1000, world),
                 lambda: tp_layer_bytes_per_token(LLAMA2_7B, world),
                 lambda: weights_per_gpu(LLAMA2_7B, world),
                 lambda: all_reduce_time(1000, world, NVLINK4),
                 lambda: decode_time(LLAMA2_7B, world, NVLINK4, H100),
                 lambda: tp_stops_paying(LLAMA2_7B, NVLINK4, H100, worlds=(1, world))):
        with pytest.raises(ValueError, match="world size"):
            call()


def test_negative_message_and_memory_raise():
    with pytest.raises(ValueError, match="negative"):
        ring_all_reduce_bytes(-1, 2)
    with pytest.raises(ValueError, match="positive"):
        min_world_to_fit(LLAMA2_7B, 0)


def test_parameter_counts():
    assert LLAMA2_7B.config().num_parameters() == 6_738_415_616
    assert LLAMA2_70B.config().num_parameters() == 68_976_648_192
    assert SMOLLM2_135M.config().num_parameters() == 134_515_008
    assert model_bytes(LLAMA2_70B) == 2 * 68_976_648_192
    # ModelConfig's defaults are SmolLM2-135M's: the preset is the same shape.
    assert ModelShape.from_config("SmolLM2-135M", ModelConfig()) == SMOLLM2_135M


def test_tp_bytes_per_token_by_hand():
    assert tp_layer_bytes_per_token(LLAMA2_7B, 2) == 2 * 2 * (1 / 2) * 4096 * 2 == 16384
    assert tp_layer_bytes_per_token(LLAMA2_7B, 4) == 24576  # 2 x 2·3/4 x 8192
    assert tp_layer_bytes_per_token(LLAMA2_7B, 8) == 28672  # 2 x 2·7/8 x 8192
    assert tp_layer_bytes_per_token(LLAMA2_70B, 8) == 57344  # 2 x 2·7/8 x 16384
    assert tp_layer_bytes_per_token(SMOLLM2_135M, 3) == 2 * 2 * (2 / 3) * 576 * 4
    assert tp_bytes_per_token(LLAMA2_7B, 2) == 32 * 16384
    assert tp_bytes_per_token(LLAMA2_70B, 8) == 80 * 57344
    # embedding all-reduce of h (8192 B) + logits all-gather of V (64,000 B, half sent)
    assert vocab_bytes_per_token(LLAMA2_7B, 2) == 8192 + 32000
    assert tp_bytes_per_pass(LLAMA2_7B, 2, batch=4, seq_len=128) == 512 * 32 * 16384
    for shape in (LLAMA2_7B, LLAMA2_70B, SMOLLM2_135M):
        assert tp_bytes_per_token(shape, 1) == vocab_bytes_per_token(shape, 1) == 0


def test_bytes_grow_with_world_toward_twice_the_message():
    for shape in (LLAMA2_7B, LLAMA2_70B):
        per_layer = [tp_layer_bytes_per_token(shape, t) for t in (1, 2, 4, 8, 16, 1024)]
        assert per_layer == sorted(per_layer) and len(set(per_layer)) == len(per_layer)
        assert per_layer[-1] < 4 * shape.hidden_size * shape.bytes_per_value


def test_sequence_parallelism_sends_the_same_bytes():
    for shape in (LLAMA2_7B, LLAMA2_70B, SMOLLM2_135M):
        for world in range(1, 17):
            assert sequence_parallel_layer_bytes_per_token(shape, world) \
                == pytest.approx(tp_layer_bytes_per_token(shape, world), rel=1e-12)


def test_collective_times_by_hand():
    # t = 4, 4 MB: 6 steps x 10 µs + 2·3/4 x 4e6 B / 1e9 B/s = 60 µs + 6 ms
    assert all_reduce_time(4e6, 4, SLOW) == pytest.approx(6e-5 + 6e-3)
    # all-gather: 3 steps x 10 µs + 3/4 x 4e6 / 1e9
    assert all_gather_time(4e6, 4, SLOW) == pytest.approx(3e-5 + 3e-3)
    assert all_reduce_time(4e6, 1, SLOW) == all_gather_time(4e6, 1, SLOW) == 0
    # 7B, batch 8, t = 2: 64 all-reduces of 8 x 4096 x 2 B, each 2 x 10 µs + 65,536 / 1e9
    assert layers_communication_time(LLAMA2_7B, 2, SLOW, batch=8) \
        == pytest.approx(64 * (2e-5 + 65536 / 1e9))


def test_decode_time_by_hand():
    assert compute_time(LLAMA2_7B, 1, H100) == pytest.approx(READ_7B / 3.35e12)
    assert decode_time(LLAMA2_7B, 1, SLOW, H100) == pytest.approx(READ_7B / 3.35e12)
    expected = (READ_7B / 2 / 3.35e12          # half the weights each
                + 65 * (2e-5 + 8192 / 1e9)     # 2L + 1 (embedding) all-reduces of h
                + (1e-5 + 32000 / 1e9))        # the logits' all-gather (half of 64 KB sent)
    assert decode_time(LLAMA2_7B, 2, SLOW, H100) == pytest.approx(expected)
    assert tp_speedup(LLAMA2_7B, 2, SLOW, H100) == pytest.approx(READ_7B / 3.35e12 / expected)
    # A free link: the ideal speedup t (memory-bound, every rank reads 1/t).
    assert tp_speedup(LLAMA2_70B, 8, FREE, H100) == pytest.approx(8)


def test_compute_bound_at_large_batch():
    """At a batch far past the ridge point the FLOPs set the time, not the bytes."""
    slow_flops = Accelerator("slow", memory_bandwidth=3.35e12, memory_bytes=80e9,
                             peak_flops=100e12)
    small, large = (compute_time(LLAMA2_7B, 1, slow_flops, b) for b in (1, 4096))
    assert small == pytest.approx(READ_7B / 3.35e12)
    assert large > 100 * small


def test_times_are_monotonic():
    for shape in (LLAMA2_7B, LLAMA2_70B):
        for link in INTERCONNECTS:
            comm = [layers_communication_time(shape, t, link) for t in (1, 2, 4, 8, 16)]
            assert comm == sorted(comm) and comm[0] == 0 < comm[1]
            assert layers_communication_time(shape, 4, link, batch=8) > comm[2]
        compute = [compute_time(shape, t, H100) for t in (1, 2, 4, 8, 16)]
        assert compute == sorted(compute, reverse=True)
        # slower links, slower steps
        steps = [decode_time(shape, 4, link, H100) for link in (NVLINK4, PCIE4, ETHERNET_10G)]
        assert steps == sorted(steps)


def test_memory():
    assert min_world_to_fit(LLAMA2_70B, 80e9) == 2  # 138 GB of fp16 weights
    assert min_world_to_fit(LLAMA2_7B, 80e9) == 1
    assert min_world_to_fit(LLAMA2_70B, 24e9) == 6  # ceil(137.95 / 24)
    assert weights_per_gpu(LLAMA2_70B, 2) == pytest.approx(68.98e9, rel=1e-3)


def test_tp_stops_paying():
    for shape in (LLAMA2_7B, LLAMA2_70B):
        for batch in (1, 8):
            ethernet = tp_stops_paying(shape, ETHERNET_10G, H100, batch)
            nvlink = tp_stops_paying(shape, NVLINK4, H100, batch)
            assert ethernet is not None and (nvlink is None or ethernet < nvlink)
            assert tp_stops_paying(shape, FREE, H100, batch) is None
    # 7B on 10 GbE: already two GPUs are slower than one.
    assert tp_stops_paying(LLAMA2_7B, ETHERNET_10G, H100) == 2
    assert decode_time(LLAMA2_7B, 2, ETHERNET_10G, H100) > decode_time(LLAMA2_7B, 1,
                                                                       ETHERNET_10G, H100)
    # 70B does not fit in one GPU: the comparison starts at 2, even when 2 is slower than
    # a hypothetical single GPU (10 GbE, batch 8).
    assert tp_speedup(LLAMA2_70B, 2, ETHERNET_10G, H100, batch=8) < 1
    assert tp_stops_paying(LLAMA2_70B, ETHERNET_10G, H100, batch=8) == 4
    # an order-independent list of worlds
    assert tp_stops_paying(LLAMA2_7B, PCIE4, H100, worlds=(8, 1, 4, 2)) \
        == tp_stops_paying(LLAMA2_7B, PCIE4, H100, worlds=(1, 2, 4, 8))


def test_throughput_replicas_versus_tensor_parallelism():
    one = decode_time(LLAMA2_7B, 1, NVLINK4, H100, batch=4)
    assert throughput(LLAMA2_7B, 8, 1, NVLINK4, H100, batch=4) == pytest.approx(8 * 4 / one)
    # Replicas need no communication: more total tokens/s than one TP-8 group.
    assert throughput(LLAMA2_7B, 8, 1, NVLINK4, H100) > throughput(LLAMA2_7B, 8, 8, NVLINK4,
                                                                   H100)
    with pytest.raises(ValueError, match="does not fit"):
        throughput(LLAMA2_70B, 8, 1, NVLINK4, H100)
    with pytest.raises(ValueError, match="do not split"):
        throughput(LLAMA2_7B, 8, 3, NVLINK4, H100)


def test_communication_table():
    links = (NVLINK4, PCIE4, ETHERNET_10G)
    rows = communication_table(worlds=(1, 2, 4, 8), links=links, batch=8)
    assert len(rows) == 2 * (1 + 3 * 3)  # world 1 once per model
    base = [r for r in rows if r.world == 1]
    assert [(r.model, r.link, r.fits, r.speedup) for r in base] == [
        ("Llama-2-7B", None, True, 1.0), ("Llama-2-70B", None, False, 1.0)]
    row = next(r for r in rows if (r.model, r.link, r.world) == ("Llama-2-7B", "PCIe 4 x16", 2))
    assert row.layer_bytes == 16384 and row.model_bytes == 32 * 16384
    assert row.all_reduce_seconds == pytest.approx(all_reduce_time(8 * 8192, 2, PCIE4))
    assert row.step_seconds == pytest.approx(row.compute_seconds + row.communication_seconds)
    assert row.step_seconds == pytest.approx(decode_time(LLAMA2_7B, 2, PCIE4, H100, 8))
    assert row.speedup == pytest.approx(tp_speedup(LLAMA2_7B, 2, PCIE4, H100, 8))
    assert all(r.fits for r in rows if r.world > 1)


def test_benchmark_prints_narrow_tables():
    path = Path(__file__).parent.parent / "benchmarks" / "parallel_cost.py"
    spec = importlib.util.spec_from_file_location("parallel_cost_benchmark", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = io.StringIO()
    with redirect_stdout(out):
        module.main([])
    lines = out.getvalue().splitlines()
    assert max(len(line) for line in lines) <= 83
    assert "| Llama-2-7B | NVLink 4 | 2 | 2.0 | 0.13 | 1.97 | 2.10 | 1.87x |" in lines


def test_the_kv_cache_per_gpu_is_the_full_cache_split_by_kv_heads():
    """Against kv_cache_bytes (the chapter 03 formula) on the full config."""
    from minillm.kv_cache import kv_cache_bytes

    whole = kv_cache_bytes(LLAMA2_70B.config(), 1, bytes_per_value=2)
    assert kv_bytes_per_token_per_gpu(LLAMA2_70B, 1) == whole == 327_680
    assert kv_bytes_per_token_per_gpu(LLAMA2_70B, 8) == whole / 8
    assert kv_bytes_per_token_per_gpu(SMOLLM2_135M, 3) == \
        kv_cache_bytes(SMOLLM2_135M.config(), 1, bytes_per_value=4) / 3


def test_tensor_parallelism_buys_kv_headroom_beyond_the_weights():
    """Llama-2-70B in fp16 on 80 GB: two GPUs hold the weights with little room left;
    each doubling of t halves the weights and the KV bytes per token on every GPU."""
    tokens = {t: kv_tokens_per_gpu(LLAMA2_70B, t, H100.memory_bytes) for t in (1, 2, 4, 8)}
    assert tokens[1] == 0  # 138 GB of weights do not fit in 72 GB
    free = 0.9 * 80e9 - model_bytes(LLAMA2_70B) / 2
    assert tokens[2] == int(free // (327_680 / 2))
    assert tokens[2] < tokens[4] < tokens[8]
    assert tokens[8] > 20 * tokens[2]
