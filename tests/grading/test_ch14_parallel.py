"""Graded tests for chapter 14 (parallelism).

Oracles: the library's ``shard_weight`` and ``tensor_parallel`` (a tiny model, one process),
the serving engine on 3 processes against one (SmolLM2, greedy), the library's SwiGLU
``MLP`` in float64, the pipeline simulator (``schedule`` / ``bubble_fraction``), and the
communication cost model (``minillm.parallel.cost``).
"""

from __future__ import annotations

import copy
import dataclasses
import random

import pytest
import torch
import torch.nn.functional as F

from minillm.config import ModelConfig
from minillm.grading import load_impl
from minillm.model import MLP
from minillm.parallel import cost
from minillm.parallel import pipeline as library_pipeline
from minillm.parallel.tensor import shard_weight as library_shard_weight
from minillm.parallel.tensor import tensor_parallel
from minillm.sampling import SamplingParams
from minillm.testing import TINY, varied_random_model

impl = load_impl("ch14_parallel")


# -- 14.1 shards of a weight --------------------------------------------------------------

W43 = torch.arange(12.0).reshape(4, 3)  # 4 output rows, 3 input columns
W26 = torch.arange(12.0).reshape(2, 6)


@pytest.mark.exercise("14.1", points=2)
@pytest.mark.parametrize("weight, dim, rank, world, expected", [
    (W43, 0, 0, 2, [[0.0, 1, 2], [3, 4, 5]]),  # column-parallel: output rows
    (W43, 0, 1, 2, [[6.0, 7, 8], [9, 10, 11]]),
    (W43, 0, 3, 4, [[9.0, 10, 11]]),
    (W26, 1, 0, 3, [[0.0, 1], [6, 7]]),  # row-parallel: input columns
    (W26, 1, 2, 3, [[4.0, 5], [10, 11]]),
    (W26, 1, 1, 2, [[3.0, 4, 5], [9, 10, 11]]),
    (torch.tensor([1.0, 2, 3, 4, 5, 6]), 0, 1, 3, [3.0, 4]),  # a 1-D bias
    (torch.tensor([[0.0, 0], [0, 0], [1, 1], [1, 1]]), 0, 1, 2, [[1.0, 1], [1, 1]]),  # ties
    (W43, 1, 0, 1, W43.tolist()),  # one rank keeps everything
])
def test_shard_weight_examples(weight, dim, rank, world, expected):
    got = impl.shard_weight(weight, dim, rank, world)
    assert torch.equal(got, torch.tensor(expected)), got


@pytest.mark.exercise("14.1", points=1)
def test_shard_weight_matches_the_library_on_random_shapes():
    rng = random.Random(0)
    g = torch.Generator().manual_seed(0)
    for _ in range(100):
        world = rng.randint(1, 5)
        shape = [rng.randint(1, 4) * world, rng.randint(1, 4) * world]
        weight = torch.randn(*shape, generator=g)
        dim, rank = rng.randint(0, 1), rng.randint(0, world - 1)
        expected = library_shard_weight(weight, dim, rank, world)
        got = impl.shard_weight(weight, dim, rank, world)
        assert got.shape == expected.shape and torch.equal(got, expected), \
            (shape, dim, rank, world)


@pytest.mark.exercise("14.1", points=1)
@pytest.mark.parametrize("shape, dim, world", [((10, 4), 0, 4), ((4, 3), 1, 2), ((5,), 0, 3)])
def test_a_size_that_does_not_divide_is_refused(shape, dim, world):
    with pytest.raises(ValueError) as error:
        impl.shard_weight(torch.ones(shape), dim, 0, world)
    assert str(error.value), "say why the weight cannot be split"


@pytest.mark.exercise("14.1", points=1)
@pytest.mark.parametrize("dim", [0, 1])
def test_a_shard_owns_its_memory(dim):
    """A rank keeps only its slice: no view into the whole weight, no copy of all of it."""
    weight = torch.randn(8, 12)
    before = weight.clone()
    for rank in range(4):
        shard = impl.shard_weight(weight, dim, rank, 4)
        storage = shard.untyped_storage()
        assert storage.data_ptr() != weight.untyped_storage().data_ptr(), \
            "the shard is a view of the weight: the rank could not free the rest"
        assert storage.nbytes() == shard.numel() * shard.element_size(), \
            f"the shard's storage holds {storage.nbytes()} bytes for a " \
            f"{shard.numel() * shard.element_size()}-byte slice"
        shard.add_(1.0)
        assert torch.equal(weight, before), "changing the shard changed the weight"


@pytest.mark.exercise("14.1", points=1)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.int8])
def test_a_shard_keeps_the_dtype(dtype):
    weight = torch.arange(-12, 12).reshape(6, 4).to(dtype)
    for dim in (0, 1):
        got = impl.shard_weight(weight, dim, 1, 2)
        assert got.dtype == dtype
        assert torch.equal(got, library_shard_weight(weight, dim, 1, 2))


@pytest.mark.exercise("14.1", points=1)
@pytest.mark.parametrize("dim", [0, 1])
def test_unshard_joins_the_shards(dim):
    weight = torch.randn(6, 12)
    for world in (1, 2, 3, 6):
        shards = [library_shard_weight(weight, dim, rank, world) for rank in range(world)]
        got = impl.unshard(shards, dim)
        assert got.shape == weight.shape and torch.equal(got, weight), world


@pytest.mark.exercise("14.1", points=1)
def test_shard_then_unshard_is_the_weight():
    g = torch.Generator().manual_seed(1)
    for world in (1, 2, 3, 4):
        for weight in (torch.randn(12, 24, generator=g), torch.randn(24, generator=g)):
            for dim in range(weight.dim()):
                shards = [impl.shard_weight(weight, dim, rank, world) for rank in range(world)]
                assert torch.equal(impl.unshard(shards, dim), weight), (world, dim)


@pytest.mark.exercise("14.1", points=1)
def test_tensor_parallel_with_your_shard_weight():
    """The library's tensor_parallel cuts a tiny model (one process per rank, simulated):
    with your function every rank keeps exactly the library's weights."""
    model = varied_random_model(ModelConfig(**TINY))
    world = 2
    for rank in range(world):
        mine = tensor_parallel(model, rank, world, shard=impl.shard_weight)
        theirs = tensor_parallel(model, rank, world)
        mine, theirs = mine.state_dict(), theirs.state_dict()
        assert mine.keys() == theirs.keys()
        for name, tensor in theirs.items():
            assert torch.equal(mine[name], tensor), f"rank {rank}: {name}"
    # a rank's gate_proj is a ColumnParallelLinear holding its rows as an ordinary layer
    gate = [tensor_parallel(model, rank, world, shard=impl.shard_weight)
            .layers[0].mlp.gate_proj.shard.weight for rank in range(world)]
    assert torch.equal(torch.cat(gate, dim=0), model.layers[0].mlp.gate_proj.weight)


@pytest.mark.exercise("14.1", points=2)
@pytest.mark.smollm2
@pytest.mark.slow
@pytest.mark.timeout(240)  # two worker processes start: tens of seconds on a busy machine
def test_your_shard_weight_in_the_engine():
    """SmolLM2 on 3 processes, each cutting its weights with your shard_weight: the same
    greedy tokens as one process (about 10-20 s)."""
    from minillm.serve import LLM

    if impl.shard_weight.__module__.startswith("minillm_mutants"):
        pytest.skip("a mutant is loaded from a file that spawned processes cannot import")
    impl.shard_weight(torch.zeros(6), 0, 1, 3)  # fail here, before starting processes
    prompts = ["The capital of France is", "Once upon a time"]
    params = SamplingParams(max_tokens=8)
    expected = [o.tokens for o in LLM("smollm2").generate(prompts, params, progress=False)]
    with LLM("smollm2", tensor_parallel_size=3, shard_weight=impl.shard_weight) as llm:
        got = [o.tokens for o in llm.generate(prompts, params, progress=False)]
    assert got == expected


# -- 14.2 the tensor-parallel MLP ---------------------------------------------------------

HIDDEN, INTERMEDIATE = 8, 12


def mlp_weights(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 3, HIDDEN, generator=g, dtype=torch.float64)
    gate = torch.randn(INTERMEDIATE, HIDDEN, generator=g, dtype=torch.float64)
    up = torch.randn(INTERMEDIATE, HIDDEN, generator=g, dtype=torch.float64)
    down = torch.randn(HIDDEN, INTERMEDIATE, generator=g, dtype=torch.float64)
    return x, gate, up, down


def library_mlp(x, gate, up, down) -> torch.Tensor:
    """The model's own SwiGLU MLP module, in float64, with these weights."""
    config = ModelConfig(hidden_size=gate.shape[1], intermediate_size=gate.shape[0])
    mlp = MLP(config).double()
    with torch.no_grad():
        mlp.gate_proj.weight.copy_(gate)
        mlp.up_proj.weight.copy_(up)
        mlp.down_proj.weight.copy_(down)
        return mlp(x)


@pytest.mark.exercise("14.2", points=2)
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_the_partials_sum_to_the_mlp(world):
    x, gate, up, down = mlp_weights(world)
    partials = impl.parallel_mlp(x, gate, up, down, world)
    assert len(partials) == world
    total = torch.stack(list(partials)).sum(0)
    assert total.shape == x.shape
    assert torch.allclose(total, library_mlp(x, gate, up, down), rtol=0, atol=1e-10), \
        "the sum of the partials (the all-reduce) is not the MLP's output"


@pytest.mark.exercise("14.2", points=1)
@pytest.mark.parametrize("world", [2, 3, 4])
def test_each_rank_computes_only_its_share(world):
    """Rank r uses rows r of gate and up and the same columns of down (as shard_weight
    cuts them); its partial alone is not the answer."""
    x, gate, up, down = mlp_weights(10 + world)
    partials = impl.parallel_mlp(x, gate, up, down, world)
    full = library_mlp(x, gate, up, down)
    for rank, partial in enumerate(partials):
        assert partial.shape == x.shape, f"rank {rank}: shape {tuple(partial.shape)}"
        g, u, d = (library_shard_weight(w, dim, rank, world)
                   for w, dim in ((gate, 0), (up, 0), (down, 1)))
        expected = (F.silu(x @ g.T) * (x @ u.T)) @ d.T
        assert torch.allclose(partial, expected, rtol=0, atol=1e-10), f"rank {rank}"
        assert not torch.allclose(partial, full, atol=1e-3), f"rank {rank} has the whole sum"


@pytest.mark.exercise("14.2", points=1)
def test_all_reduce_sums_the_partials():
    partials = [torch.tensor([[1.0, 2.0]]), torch.tensor([[3.0, 4.0]]),
                torch.tensor([[5.0, -6.0]])]
    before = [p.clone() for p in partials]
    got = impl.all_reduce(partials)
    assert torch.equal(got, torch.tensor([[9.0, 0.0]])), got
    assert all(torch.equal(p, b) for p, b in zip(partials, before, strict=True)), \
        "the partials changed: return a new tensor"
    assert torch.equal(impl.all_reduce([torch.tensor([2.5, -1.0])]), torch.tensor([2.5, -1.0]))


@pytest.mark.exercise("14.2", points=1)
@pytest.mark.parametrize("world", [2, 4])
def test_all_reduce_of_the_partials_is_the_mlp(world):
    x, gate, up, down = mlp_weights(20 + world)
    got = impl.all_reduce(impl.parallel_mlp(x, gate, up, down, world))
    assert torch.allclose(got, library_mlp(x, gate, up, down), rtol=0, atol=1e-10), \
        "all_reduce(parallel_mlp(...)) is not the MLP's output"


# -- 14.3 the pipeline bubble -------------------------------------------------------------

@pytest.mark.exercise("14.3", points=1)
@pytest.mark.parametrize("stages, microbatches, expected", [
    (1, 8, 0.0),  # one stage never waits
    (2, 1, 0.5),  # one micro-batch: (p - 1)/p
    (4, 1, 0.75),
    (2, 8, 1 / 9),
    (4, 4, 3 / 7),
])
def test_gpipe_bubble_examples(stages, microbatches, expected):
    assert impl.gpipe_bubble(stages, microbatches) == pytest.approx(expected, abs=1e-12)


@pytest.mark.exercise("14.3", points=1)
def test_gpipe_bubble_matches_the_simulated_pipeline():
    for stages in range(1, 7):
        for microbatches in range(1, 11):
            events = library_pipeline.schedule("gpipe", stages, microbatches)
            simulated = library_pipeline.bubble_fraction(events)
            got = impl.gpipe_bubble(stages, microbatches)
            assert got == pytest.approx(simulated, abs=1e-12), (stages, microbatches)
            assert got == pytest.approx(library_pipeline.gpipe_bubble(stages, microbatches))


@pytest.mark.exercise("14.3", points=1)
def test_pipeline_time_matches_the_simulated_makespan():
    for stage_time in (1.0, 2.5):
        for stages in range(1, 6):
            for microbatches in range(1, 9):
                events = library_pipeline.schedule("gpipe", stages, microbatches,
                                                   forward_time=stage_time)
                makespan = max(e.end for e in events)
                got = impl.pipeline_time(stage_time, stages, microbatches)
                assert got == pytest.approx(makespan), (stage_time, stages, microbatches)


@pytest.mark.exercise("14.3", points=1)
@pytest.mark.parametrize("stages, microbatches", [(0, 4), (3, 0), (-1, 2)])
def test_an_empty_pipeline_is_refused(stages, microbatches):
    with pytest.raises(ValueError):
        impl.gpipe_bubble(stages, microbatches)
    with pytest.raises(ValueError):
        impl.pipeline_time(1.0, stages, microbatches)


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


# -- 14.6 a pipeline schedule builder --------------------------------------------------------

Event = library_pipeline.Event


def library_orders(kind, stages, microbatches, backward=True):
    return [library_pipeline.stage_order(kind, s, stages, microbatches, backward)
            for s in range(stages)]


def orders_of(text):
    """'F0 F1 B0' -> [("F", 0), ("F", 1), ("B", 0)]."""
    return [(op[0], int(op[1:])) for op in text.split()]


@pytest.mark.exercise("14.6", points=2)
@pytest.mark.parametrize("kind, stage, stages, microbatches, expected", [
    ("gpipe", 0, 2, 3, "F0 F1 F2 B0 B1 B2"),
    ("gpipe", 3, 4, 2, "F0 F1 B0 B1"),
    ("1f1b", 0, 4, 6, "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5"),  # 3 warm-up forwards
    ("1f1b", 1, 4, 6, "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 B4 B5"),  # 2
    ("1f1b", 3, 4, 6, "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5"),  # the last stage: none
    ("1f1b", 0, 4, 2, "F0 F1 B0 B1"),  # fewer micro-batches than warm-up forwards
    ("1f1b", 1, 4, 2, "F0 F1 B0 B1"),
    ("1f1b", 0, 1, 3, "F0 B0 F1 B1 F2 B2"),  # one stage
])
def test_stage_order_examples(kind, stage, stages, microbatches, expected):
    assert impl.stage_order(kind, stage, stages, microbatches) == orders_of(expected)


@pytest.mark.exercise("14.6", points=1)
@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
def test_inference_runs_only_the_forwards(kind):
    for stage in range(4):
        assert impl.stage_order(kind, stage, 4, 5, backward=False) == orders_of("F0 F1 F2 F3 F4")


@pytest.mark.exercise("14.6", points=1)
def test_an_unknown_schedule_is_refused():
    with pytest.raises(ValueError):
        impl.stage_order("interleaved", 0, 4, 8)


@pytest.mark.exercise("14.6", points=2)
def test_stage_order_matches_the_library():
    for kind in library_pipeline.SCHEDULES:
        for stages in range(1, 8):
            for microbatches in range(1, 11):
                for stage in range(stages):
                    for backward in (True, False):
                        args = (kind, stage, stages, microbatches, backward)
                        assert impl.stage_order(*args) == \
                            library_pipeline.stage_order(*args), args


@pytest.mark.exercise("14.6", points=2)
def test_simulate_pipeline_1f1b_by_hand():
    """2 stages, 2 micro-batches, forward 1, backward 2 (worked out by hand)."""
    orders = [orders_of("F0 F1 B0 B1"), orders_of("F0 B0 F1 B1")]
    expected = [Event(0, 0, "F", 0, 1), Event(0, 1, "F", 1, 2),
                Event(1, 0, "F", 1, 2),  # needs stage 0's F0
                Event(1, 0, "B", 2, 4),  # the last stage: needs its own F0
                Event(0, 0, "B", 4, 6),  # needs stage 1's B0
                Event(1, 1, "F", 4, 5),  # stage 1 is busy with B0 until 4
                Event(1, 1, "B", 5, 7),
                Event(0, 1, "B", 7, 9)]
    assert impl.simulate_pipeline(orders, [1.0, 1.0], [2.0, 2.0]) == expected


@pytest.mark.exercise("14.6", points=2)
def test_a_slow_stage_sets_the_pace():
    """Inference over 3 stages, the middle one 3 times slower: stage 2 waits for it."""
    orders = [orders_of("F0 F1 F2")] * 3
    expected = [Event(0, 0, "F", 0, 1), Event(0, 1, "F", 1, 2), Event(1, 0, "F", 1, 4),
                Event(0, 2, "F", 2, 3), Event(1, 1, "F", 4, 7), Event(2, 0, "F", 4, 5),
                Event(1, 2, "F", 7, 10), Event(2, 1, "F", 7, 8), Event(2, 2, "F", 10, 11)]
    assert impl.simulate_pipeline(orders, [1.0, 3.0, 1.0], [0.0, 0.0, 0.0]) == expected


@pytest.mark.exercise("14.6", points=3)
def test_simulate_pipeline_matches_the_library_on_random_pipelines():
    """Random stage counts, micro-batches and per-stage times (multiples of 1/4, so every
    sum is exact): the same events as ``schedule``, in the same order."""
    rng = random.Random(14)
    for _ in range(200):
        kind = rng.choice(library_pipeline.SCHEDULES)
        stages, microbatches = rng.randint(1, 6), rng.randint(1, 9)
        forward = [rng.randint(1, 8) / 4 for _ in range(stages)]
        training = rng.random() < 0.7
        backward = [rng.randint(1, 12) / 4 if training else 0.0 for _ in range(stages)]
        orders = library_orders(kind, stages, microbatches, training)
        before = copy.deepcopy(orders)
        got = impl.simulate_pipeline(orders, forward, backward)
        expected = library_pipeline.schedule(kind, stages, microbatches, forward, backward)
        assert orders == before, "simulate_pipeline changed the orders it was given"
        assert all(isinstance(e, Event) for e in got), "return pipeline.Event objects"
        assert got == expected, (kind, stages, microbatches, forward, backward)


@pytest.mark.exercise("14.6", points=1)
def test_orders_that_wait_for_each_other_are_refused():
    """The last stage's B0 before its own F0 can never run (and the first stage waits)."""
    orders = [orders_of("F0 B0"), orders_of("B0 F0")]
    with pytest.raises(ValueError):
        impl.simulate_pipeline(orders, [1.0, 1.0], [2.0, 2.0])


@pytest.mark.exercise("14.6", points=2)
@pytest.mark.parametrize("stages, microbatches", [(2, 1), (2, 8), (4, 6), (4, 16), (6, 3)])
def test_your_schedules_hold_what_1f1b_promises(stages, microbatches):
    """Your builder end to end: GPipe holds all m micro-batches' activations on every
    stage, 1F1B at most p (p − s on stage s); with equal stage times both have GPipe's
    bubble (p − 1)/(m + p − 1), in training and in inference."""
    p, m = stages, microbatches
    for kind in library_pipeline.SCHEDULES:
        orders = [impl.stage_order(kind, s, p, m) for s in range(p)]
        events = impl.simulate_pipeline(orders, [1.0] * p, [2.0] * p)
        peaks = [library_pipeline.peak_in_flight(events, s) for s in range(p)]
        assert peaks == ([m] * p if kind == "gpipe" else [min(p - s, m) for s in range(p)]), \
            (kind, peaks)
        bubble = library_pipeline.bubble_fraction(events)
        assert bubble == pytest.approx(library_pipeline.gpipe_bubble(p, m)), kind
        orders = [impl.stage_order(kind, s, p, m, backward=False) for s in range(p)]
        events = impl.simulate_pipeline(orders, [1.0] * p, [0.0] * p)
        assert library_pipeline.bubble_fraction(events) == \
            pytest.approx(library_pipeline.gpipe_bubble(p, m)), kind
