"""Graded tests for chapter 14 (parallelism): communication, exercises 14.4 (the bytes an
all-reduce sends) and 14.5 (the ring all-reduce).

Oracle: the communication cost model (``minillm.parallel.cost``).
"""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from minillm.grading import load_impl
from minillm.parallel import cost

impl = load_impl("ch14_parallel")


# -- 14.4 communication --------------------------------------------------------------------

@pytest.mark.exercise("14.4", points=1)
@pytest.mark.parametrize("message, world, expected", [
    (1000, 1, 0.0),  # one rank sends nothing
    (1000, 2, 1000.0),
    (1000, 4, 1500.0),
    (8192, 8, 14336.0),
])
def test_all_reduce_bytes_examples(message, world, expected):
    assert impl.all_reduce_bytes(message, world) == pytest.approx(expected)


@pytest.mark.exercise("14.4", points=1)
def test_all_reduce_bytes_matches_the_library():
    rng = random.Random(0)
    for _ in range(200):
        message, world = rng.randint(0, 10**7), rng.randint(1, 64)
        assert impl.all_reduce_bytes(message, world) == \
            pytest.approx(cost.ring_all_reduce_bytes(message, world)), (message, world)


@pytest.mark.exercise("14.4", points=1)
def test_tp_bytes_per_token_of_llama2_7b():
    assert impl.tp_bytes_per_token(4096, 32, 2) == pytest.approx(524_288)  # fp16 by default
    assert impl.tp_bytes_per_token(4096, 32, 1) == 0
    assert impl.tp_bytes_per_token(4096, 32, 8, bytes_per_value=4) == pytest.approx(1_835_008)


@pytest.mark.exercise("14.4", points=2)
def test_tp_bytes_per_token_matches_the_library():
    for preset in cost.MODELS.values():
        for bytes_per_value in (1, 2, 4):
            shape = dataclasses.replace(preset, bytes_per_value=bytes_per_value)
            for world in (1, 2, 3, 4, 8):
                expected = cost.tp_bytes_per_token(shape, world)
                got = impl.tp_bytes_per_token(shape.hidden_size, shape.num_layers, world,
                                              bytes_per_value=bytes_per_value)
                assert got == pytest.approx(expected), (shape.name, bytes_per_value, world)


@pytest.mark.exercise("14.4", points=1)
@pytest.mark.parametrize("world", [0, -2])
def test_a_world_without_ranks_is_refused(world):
    with pytest.raises(ValueError):
        impl.all_reduce_bytes(1000, world)
    with pytest.raises(ValueError):
        impl.tp_bytes_per_token(4096, 32, world)


# -- 14.5 the ring all-reduce ---------------------------------------------------------------

def ring_inputs(world, shape=(4, 6), dtype=torch.float64, seed=0):
    generator = torch.Generator().manual_seed(seed)
    if dtype == torch.int64:
        return [torch.randint(-50, 50, shape, generator=generator) for _ in range(world)]
    return [torch.randn(shape, generator=generator, dtype=dtype) for _ in range(world)]


@pytest.mark.exercise("14.5", points=2)
@pytest.mark.parametrize("world", [1, 2, 3, 4, 5])
def test_every_rank_ends_with_the_sum(world):
    tensors = ring_inputs(world, dtype=torch.int64)  # integers: the sum is exact in any order
    results, _ = impl.ring_all_reduce(tensors)
    assert len(results) == world
    for result in results:
        assert result.shape == tensors[0].shape and result.dtype == torch.int64
        assert torch.equal(result, torch.stack(tensors).sum(0))


@pytest.mark.exercise("14.5", points=1)
def test_uneven_chunks_and_floats():
    """10 values over 4 ranks: chunks of 3, 3, 2, 2."""
    tensors = ring_inputs(4, shape=(10,))
    results, _ = impl.ring_all_reduce(tensors)
    for result in results:
        torch.testing.assert_close(result, torch.stack(tensors).sum(0), rtol=1e-12, atol=1e-12)


@pytest.mark.exercise("14.5", points=1)
def test_the_inputs_are_left_as_they_are():
    tensors = ring_inputs(3)
    before = [t.clone() for t in tensors]
    impl.ring_all_reduce(tensors)
    assert all(torch.equal(t, b) for t, b in zip(tensors, before, strict=True))


@pytest.mark.exercise("14.5", points=2)
@pytest.mark.parametrize("world", [2, 3, 4])
def test_messages_go_round_the_ring_one_chunk_per_rank_per_step(world):
    _, messages = impl.ring_all_reduce(ring_inputs(world))
    assert len(messages) == 2 * (world - 1) * world
    for step in range(2 * (world - 1)):
        round_ = messages[step * world:(step + 1) * world]
        assert sorted(sender for sender, _, _ in round_) == list(range(world)), round_
        assert all(receiver == (sender + 1) % world for sender, receiver, _ in round_)
        assert all(0 <= chunk < world for _, _, chunk in round_)


@pytest.mark.exercise("14.5", points=2)
@pytest.mark.parametrize("world", [2, 3, 4])
def test_the_chunks_follow_reduce_scatter_then_all_gather(world):
    _, messages = impl.ring_all_reduce(ring_inputs(world))
    for step in range(2 * (world - 1)):
        shift = -step if step < world - 1 else 1 - (step - (world - 1))
        for sender, _, chunk in messages[step * world:(step + 1) * world]:
            assert chunk == (sender + shift) % world, (step, sender, chunk)


@pytest.mark.exercise("14.5", points=1)
def test_the_values_sent_are_the_library_s_ring_bytes():
    world, tensors = 4, ring_inputs(4, shape=(8, 6))
    _, messages = impl.ring_all_reduce(tensors)
    chunk_values = tensors[0].numel() // world
    sent_by_rank0 = sum(chunk_values for sender, _, _ in messages if sender == 0)
    assert sent_by_rank0 * 8 == cost.ring_all_reduce_bytes(tensors[0].numel() * 8, world)
