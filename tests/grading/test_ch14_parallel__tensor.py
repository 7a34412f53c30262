"""Graded tests for chapter 14 (parallelism): tensor parallelism, exercises 14.1 (shards of
a weight) and 14.2 (the tensor-parallel MLP).

Oracles: the library's ``shard_weight`` and ``tensor_parallel`` (a tiny model, one process),
the serving engine on 3 processes against one (SmolLM2, greedy), and the library's SwiGLU
``MLP`` in float64. Communication is in ``test_ch14_parallel__communication.py``, pipelines
in ``test_ch14_parallel__pipeline.py``.
"""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from minillm.config import ModelConfig
from minillm.grading import load_impl
from minillm.model import MLP
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
