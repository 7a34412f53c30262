"""Graded tests for chapter 14's lab: tensor-parallel layers.

Oracles: the unsharded float64 layer (``nn.Linear``, ``F.embedding``, the model's own
``Block``) on random shapes and seeds, computed in this process; the layers under test run
on 2 or 3 real processes joined in a gloo group (forked from this one, so they start in a
fraction of a second and run exactly the implementation loaded here), each counting the
collectives it issues with :class:`~minillm.parallel.counting.CollectiveCounter`. Then the
engine: a tiny model served on 2 processes built from your layers gives the one-process
engine's greedy tokens, with the collectives per step the split predicts.
"""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from minillm.config import ModelConfig
from minillm.grading import load_impl
from minillm.parallel.counting import CollectiveCounter
from minillm.parallel.launch import run_ranks
from minillm.sampling import SamplingParams
from minillm.testing import TINY, saved_varied_model, varied_random_model

impl = load_impl("ch14_tensor_parallel")
LAB = ("ColumnParallelLinear", "RowParallelLinear", "VocabParallelEmbedding", "ParallelLMHead",
       "parallel_block")
EXACT = dict(rtol=0, atol=1e-10)  # float64: only the order of a few additions differs


def on_ranks(program, world: int, *args) -> list:
    """``program(rank, world, *args)`` on ``world`` forked processes in a gloo group; each
    returns (its result, the collectives it issued)."""
    return run_ranks(_counted, world, program, *args, timeout=15, start_method="fork")


def _counted(rank, world, program, *args):
    with CollectiveCounter() as counter, torch.no_grad():
        result = program(rank, world, *args)
    return result, dict(counter.counts)


def random_linear(generator, inputs: int, outputs: int, bias: bool) -> nn.Linear:
    linear = nn.Linear(inputs, outputs, bias=bias, dtype=torch.float64)
    with torch.no_grad():
        for p in linear.parameters():
            p.copy_(torch.randn(p.shape, generator=generator, dtype=torch.float64))
    return linear


def linear_cases(seed: int, count: int, world: int, dim: str):
    """Random linears whose ``dim`` ("out" or "in") divides by ``world``, and inputs."""
    rng, g = random.Random(seed), torch.Generator().manual_seed(seed)
    cases = []
    for _ in range(count):
        inputs, outputs = rng.randint(1, 9), rng.randint(1, 9)
        if dim == "out":
            outputs *= world
        else:
            inputs *= world
        linear = random_linear(g, inputs, outputs, bias=rng.random() < 0.7)
        shape = [rng.randint(1, 3) for _ in range(rng.randint(0, 2))] + [inputs]
        cases.append((linear, torch.randn(shape, generator=g, dtype=torch.float64)))
    return cases


# -- 14.7 column- and row-parallel linears ---------------------------------------------------

@pytest.mark.exercise("14.7", points=2)
def test_column_parallel_computes_its_block_of_the_outputs():
    """One process is enough: a column-parallel layer sends nothing (a collective here,
    outside any process group, fails)."""
    for world in (1, 2, 3, 4):
        for linear, x in linear_cases(world, 12, world, "out"):
            expected, part = linear(x).detach(), linear.out_features // world
            for rank in range(world):
                got = impl.ColumnParallelLinear(linear, rank, world)(x)
                assert got.dtype == torch.float64 and got.shape == (*x.shape[:-1], part), \
                    (world, rank, tuple(got.shape))
                torch.testing.assert_close(got, expected[..., rank * part:(rank + 1) * part],
                                           **EXACT, msg=f"rank {rank} of {world}")


@pytest.mark.exercise("14.7", points=1)
def test_a_shard_holds_only_its_part_in_memory_of_its_own():
    linear = random_linear(torch.Generator().manual_seed(1), 6, 8, bias=True)
    before = {name: p.clone() for name, p in linear.named_parameters()}
    whole = {p.untyped_storage().data_ptr() for p in linear.parameters()}
    for kind, kept in (("ColumnParallelLinear", 8 // 2 * (6 + 1)),
                       ("RowParallelLinear", 8 * 6 // 2 + 8)):
        for rank in range(2):
            layer = getattr(impl, kind)(linear, rank, 2)
            tensors = list(layer.parameters()) + list(layer.buffers())
            assert not {t.untyped_storage().data_ptr() for t in tensors} & whole, \
                f"{kind}: a view of the whole weight keeps all of it alive on every rank"
            held = sum(t.untyped_storage().nbytes() for t in tensors) // 8
            assert held == kept, f"{kind} holds {held} values; its part has {kept}"
    for name, p in linear.named_parameters():
        assert torch.equal(p, before[name]), f"the given layer's {name} changed"


@pytest.mark.exercise("14.7", points=1)
def test_a_linear_that_does_not_divide_is_refused():
    linear = nn.Linear(10, 6)
    with pytest.raises(ValueError):
        impl.ColumnParallelLinear(nn.Linear(6, 10), 0, 4)
    with pytest.raises(ValueError):
        impl.RowParallelLinear(linear, 1, 4)


def row_parallel_outputs(rank, world, cases):
    outputs = []
    for linear, x in cases:
        part = linear.in_features // world
        outputs.append(impl.RowParallelLinear(linear, rank, world)(
            x[..., rank * part:(rank + 1) * part]))
    return outputs


@pytest.mark.exercise("14.7", points=3)
@pytest.mark.parametrize("world", [2, 3])
def test_row_parallel_gives_every_rank_the_whole_output(world):
    cases = linear_cases(10 + world, 10, world, "in")
    for outputs, counts in on_ranks(row_parallel_outputs, world, cases):
        for (linear, x), got in zip(cases, outputs, strict=True):
            torch.testing.assert_close(got, linear(x).detach(), **EXACT)
        assert sum(counts.values()) == len(cases), f"{counts} for {len(cases)} forwards: " \
            "one collective per forward"


def column_then_row(rank, world, first, second, x):
    hidden = impl.ColumnParallelLinear(first, rank, world)(x)
    return impl.RowParallelLinear(second, rank, world)(torch.tanh(hidden))


@pytest.mark.exercise("14.7", points=1)
def test_a_column_parallel_output_feeds_a_row_parallel_layer():
    """Megatron's pair: the column-parallel block of outputs is the row-parallel slice of
    inputs, an elementwise function between them needs no communication, and one
    collective finishes the pair."""
    g = torch.Generator().manual_seed(7)
    first, second = random_linear(g, 5, 12, bias=True), random_linear(g, 12, 3, bias=True)
    x = torch.randn(2, 4, 5, generator=g, dtype=torch.float64)
    expected = second(torch.tanh(first(x))).detach()
    for got, counts in on_ranks(column_then_row, 2, first, second, x):
        torch.testing.assert_close(got, expected, **EXACT)
        assert sum(counts.values()) == 1, counts


# -- 14.8 the vocabulary-parallel embedding and LM head ---------------------------------------

def embedding_outputs(rank, world, weight, token_ids):
    embedding = impl.VocabParallelEmbedding(weight, rank, world)
    return embedding(token_ids), embedding.weight.detach().clone()


@pytest.mark.exercise("14.8", points=3)
@pytest.mark.parametrize("world, vocab", [(2, 10), (3, 12)])
def test_every_rank_gets_every_token_s_embedding(world, vocab):
    """Every id of the vocabulary (each range's first and last included), in a random
    order and a batch shape: most belong to another rank."""
    g = torch.Generator().manual_seed(vocab)
    weight = torch.randn(vocab, 5, generator=g, dtype=torch.float64)
    ids = torch.cat([torch.randperm(vocab, generator=g), torch.randperm(vocab, generator=g)])
    token_ids = ids.view(2, vocab)
    rows = vocab // world
    for rank, ((got, kept), counts) in enumerate(on_ranks(embedding_outputs, world, weight,
                                                          token_ids)):
        torch.testing.assert_close(got, F.embedding(token_ids, weight), **EXACT)
        assert torch.equal(kept, weight[rank * rows:(rank + 1) * rows]), \
            f"rank {rank}'s weight is not rows [{rank * rows}, {(rank + 1) * rows})"
        assert sum(counts.values()) == 1, counts


@pytest.mark.exercise("14.8", points=1)
def test_a_vocabulary_that_does_not_divide_is_refused():
    with pytest.raises(ValueError):
        impl.VocabParallelEmbedding(torch.randn(10, 4), 0, 3)


def head_outputs(rank, world, weight, x):
    rows = weight.shape[0] // world
    embedding = impl.VocabParallelEmbedding(weight, rank, world)
    tied = impl.ParallelLMHead(embedding.weight)
    shared = all(t.untyped_storage().data_ptr() == embedding.weight.untyped_storage().data_ptr()
                 for t in [*tied.parameters(), *tied.buffers()])
    untied = impl.ParallelLMHead(nn.Parameter(weight[rank * rows:(rank + 1) * rows].clone(),
                                              requires_grad=False))
    return untied(x), tied(x), shared


@pytest.mark.exercise("14.8", points=2)
@pytest.mark.parametrize("world", [2, 3])
def test_every_rank_gets_the_whole_vocabulary_s_logits(world):
    g = torch.Generator().manual_seed(world)
    weight = torch.randn(6 * world, 4, generator=g, dtype=torch.float64)
    x = torch.randn(2, 3, 4, generator=g, dtype=torch.float64)
    for (untied, tied, shared), counts in on_ranks(head_outputs, world, weight, x):
        for got in (untied, tied):
            torch.testing.assert_close(got, x @ weight.T, **EXACT)
        assert shared, "a tied head must hold the embedding's own shard, not a copy"
        assert sum(counts.values()) == 2, f"{counts} for 2 forwards: one collective each"


# -- 14.9 the decoder layer -------------------------------------------------------------------

def block_model(**overrides) -> nn.Module:
    """A random float64 model of the TINY shape with attention biases."""
    config = ModelConfig(**{**TINY, "attention_bias": True, **overrides})
    return varied_random_model(config, seed=3).double()


def block_outputs(rank, world, model, x, shard_attention):
    cos, sin, mask = model.attention_inputs(x.shape[1], x.device)
    ranked = impl.parallel_block(model.layers[0], rank, world, shard_attention)
    return ranked(x, cos, sin, mask), (ranked.attn.num_heads, ranked.attn.num_kv_heads)


@pytest.mark.exercise("14.9", points=3)
@pytest.mark.parametrize("heads, kv_heads, world, shard_attention",
                         [(4, 2, 2, True), (8, 4, 2, True), (4, 2, 2, False), (6, 3, 3, True)])
def test_every_rank_computes_the_whole_block(heads, kv_heads, world, shard_attention):
    model = block_model(num_heads=heads, num_kv_heads=kv_heads,
                        intermediate_size=24 * world)
    x = torch.randn(2, 5, model.config.hidden_size, generator=torch.Generator().manual_seed(5),
                    dtype=torch.float64)
    cos, sin, mask = model.attention_inputs(5, x.device)
    with torch.no_grad():
        expected = model.layers[0](x, cos, sin, mask)
    own = (heads // world, kv_heads // world) if shard_attention else (heads, kv_heads)
    for (got, rank_heads), counts in on_ranks(block_outputs, world, model, x, shard_attention):
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-9)
        assert rank_heads == own, f"attn.num_heads, num_kv_heads {rank_heads}, not {own}"
        assert counts == {"all_reduce": 2 if shard_attention else 1}, counts


@pytest.mark.exercise("14.9", points=1)
def test_the_given_block_stays_as_it_was():
    model = block_model()
    block = model.layers[0]
    modules = dict(block.named_modules())
    heads = (block.attn.num_heads, block.attn.num_kv_heads)
    tensors = {name: (t, t.detach().clone())
               for name, t in block.state_dict(keep_vars=True).items()}
    for rank in range(2):
        ranked = impl.parallel_block(block, rank, 2)
        assert ranked is not block and isinstance(ranked, type(block))
    assert dict(block.named_modules()) == modules, "a module of the block was swapped"
    assert (block.attn.num_heads, block.attn.num_kv_heads) == heads, "the block's heads changed"
    for name, (tensor, values) in tensors.items():
        current = block.state_dict(keep_vars=True)[name]
        assert current is tensor and torch.equal(current, values), f"{name} changed"


@pytest.mark.exercise("14.9", points=1)
def test_heads_that_do_not_divide_are_refused():
    model = block_model(num_heads=6, num_kv_heads=3, intermediate_size=64)
    with pytest.raises(ValueError):
        impl.parallel_block(model.layers[0], 0, 2)
    ranked = impl.parallel_block(model.layers[0], 0, 2, shard_attention=False)
    assert ranked.attn.num_kv_heads == 3  # attention kept whole splits nothing


def loaded_from_a_mutant_file() -> bool:
    """A mutant is loaded from a file the engine's worker processes cannot import."""
    return any(getattr(impl, name).__module__.startswith("minillm_mutants") for name in LAB)


@pytest.mark.exercise("14.9", points=3)
@pytest.mark.slow
@pytest.mark.timeout(240)  # a worker process starts: tens of seconds on a busy machine
def test_your_layers_in_the_engine(tmp_path):
    """A tiny model served on 2 processes, every rank built from your layers: the
    one-process engine's greedy tokens, and per step 2 all-reduces per block, the
    embedding's all-reduce and the head's all-gather (counted on rank 0; about 10-30 s)."""
    from minillm.serve import LLM

    if loaded_from_a_mutant_file():
        pytest.skip("a mutant is loaded from a file that the worker processes cannot import")
    checkpoint = saved_varied_model(tmp_path, attention_bias=True)
    model = varied_random_model(ModelConfig(**{**TINY, "attention_bias": True}))
    impl.parallel_block(model.layers[0], 0, 2)  # fail here, before starting processes
    prompts, params = [[5, 17, 99, 3, 42], [1, 2, 3]], SamplingParams(max_tokens=8)
    with LLM(checkpoint, num_blocks=64, block_size=4, executor="eager") as llm:
        expected = [out.tokens for out in llm.generate(prompts, params, progress=False)]
    steps = []
    with LLM(checkpoint, num_blocks=64, block_size=4, tensor_parallel_size=2,
             parallel_layers=impl, on_step=steps.append) as llm, CollectiveCounter() as counter:
        got = [out.tokens for out in llm.generate(prompts, params, progress=False)]
    assert got == expected
    layers = TINY["num_layers"]
    assert counter.counts["all_reduce"] == (2 * layers + 1) * len(steps), \
        f"{counter.counts} in {len(steps)} steps"
    assert counter.counts["all_gather"] == len(steps), f"{counter.counts} in {len(steps)} steps"
