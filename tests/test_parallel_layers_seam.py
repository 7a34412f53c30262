"""The seam through which other tensor-parallel layers (chapter 14's lab) build a rank's
model: ``tensor_parallel(..., layers=...)`` gives one process's logits on forked gloo
ranks with the collectives Megatron predicts, counted by a dispatch mode that sees any
code's collectives (and agrees with the library's own counter); the layers reach the
engine's worker processes by name; the engine refuses what they cannot run."""

from __future__ import annotations

import types

import pytest
import torch

from minillm.config import ModelConfig
from minillm.engine.config import EngineConfig
from minillm.engine.ranks import layers_spec, parallel_layers
from minillm.grading import load_impl
from minillm.parallel import COLLECTIVES, tensor_parallel
from minillm.parallel.counting import CollectiveCounter
from minillm.parallel.launch import run_ranks
from minillm.testing import TINY, varied_random_model

lab = load_impl("ch14_tensor_parallel", "solutions")
TOKENS = torch.tensor([[5, 17, 99, 3, 42, 7], [1, 2, 3, 4, 200, 255]])


def rank_forward(rank, world, model, layers, shard_attention):
    ranked = tensor_parallel(model, rank, world, shard_attention=shard_attention, layers=layers)
    COLLECTIVES.clear()
    with CollectiveCounter() as counter, torch.no_grad():
        logits = ranked(TOKENS)
    return logits, dict(counter.counts), dict(COLLECTIVES), ranked.config, \
        ranked.lm_head.weight is ranked.embed_tokens.weight


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("shard_attention", [True, False])
def test_a_rank_model_from_other_layers_computes_the_model(tied, shard_attention):
    model = varied_random_model(ModelConfig(**{**TINY, "tie_word_embeddings": tied}))
    with torch.no_grad():
        expected = model(TOKENS)
    library = run_ranks(rank_forward, 2, model, None, shard_attention, start_method="fork")
    others = run_ranks(rank_forward, 2, model, lab, shard_attention, start_method="fork")
    per_block = 2 if shard_attention else 1
    predicted = {"all_reduce": per_block * TINY["num_layers"] + 1, "all_gather": 1}
    for (logits, counted, _, config, is_tied), theirs in zip(others, library, strict=True):
        assert torch.allclose(logits, expected, atol=1e-5)
        assert counted == predicted
        assert config == theirs[3]  # the rank's heads and MLP width, as the library's
        assert is_tied == tied  # a tied head keeps the embedding's shard
    for _, counted, counted_by_the_library, _, _ in library:
        assert counted == counted_by_the_library == predicted


def test_the_model_given_stays_as_it_was():
    model = varied_random_model(ModelConfig(**TINY))
    before = {name: (t, t.detach().clone()) for name, t in model.state_dict(keep_vars=True).items()}
    modules, config = dict(model.named_modules()), model.config
    ranked = tensor_parallel(model, 1, 2, layers=lab)
    assert ranked is not model and dict(model.named_modules()) == modules
    assert model.config is config and ranked.config.num_kv_heads == config.num_kv_heads // 2
    for name, (tensor, values) in before.items():
        now = model.state_dict(keep_vars=True)[name]
        assert now is tensor and torch.equal(now, values), name


def test_the_layers_reach_the_workers_by_name():
    spec = layers_spec(lab)
    assert parallel_layers(spec).parallel_block is lab.parallel_block
    assert parallel_layers(spec).ParallelLMHead is lab.ParallelLMHead
    namespace = types.SimpleNamespace(parallel_block=lambda *args: None,
                                      VocabParallelEmbedding=lab.VocabParallelEmbedding,
                                      ParallelLMHead=lab.ParallelLMHead)
    with pytest.raises(ValueError, match="must be importable"):
        layers_spec(namespace)
    assert parallel_layers(None) is None


def test_the_engine_refuses_parallel_layers_it_cannot_run():
    with pytest.raises(ValueError, match="tensor_parallel_size >= 2"):
        EngineConfig(parallel_layers=lab)
    with pytest.raises(ValueError, match="eager executor"):
        EngineConfig(parallel_layers=lab, tensor_parallel_size=2, executor="native")
    EngineConfig(parallel_layers=lab, tensor_parallel_size=2)  # auto: eager
