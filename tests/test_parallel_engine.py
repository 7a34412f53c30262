"""Tensor parallelism beyond one forward: each rank loading only its shard of the file,
quantized linears split with their groups, and the serving engine on several processes
(``LLM(..., tensor_parallel_size=N)``) producing the one-process engine's tokens."""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist
from test_tensor_parallel import changes, model_state

from minillm.checkpoint import load_model
from minillm.parallel import tensor_parallel
from minillm.parallel.launch import run_ranks
from minillm.parallel.layers import ColumnParallelLinear, RowParallelLinear
from minillm.parallel.loading import load_shard
from minillm.quant.basic import QuantScheme
from minillm.quant.qlinear import QuantLinear, quantize_model_rtn
from minillm.sampling import SamplingParams
from minillm.serve import LLM, SchedulerConfig
from minillm.testing import saved_varied_model

PROMPTS = [[5, 17, 99, 3, 42], [1, 2, 3], [200, 100, 50, 25, 12, 6]]


@pytest.fixture(scope="module")
def varied_checkpoint(tmp_path_factory):
    """A tiny model (4 query heads, 2 KV heads) whose greedy tokens vary, saved to disk."""
    return saved_varied_model(tmp_path_factory.mktemp("varied"))


def engine_tokens(checkpoint, params, **engine_options) -> list[list[int]]:
    with LLM(checkpoint, num_blocks=64, block_size=4, **engine_options) as llm:
        return [out.tokens for out in llm.generate(PROMPTS, params, progress=False)]


def assert_same_weights(read, cut):
    assert read.state_dict().keys() == cut.state_dict().keys()
    for name, tensor in cut.state_dict().items():
        assert torch.equal(read.state_dict()[name], tensor), name
    assert read.config == cut.config


@pytest.mark.parametrize("shard_attention", [True, False])
def test_a_rank_loaded_from_its_shard_equals_the_cut_model(varied_checkpoint, shard_attention):
    for rank in range(2):
        assert_same_weights(
            load_shard(varied_checkpoint, rank, 2, shard_attention=shard_attention),
            tensor_parallel(load_model(varied_checkpoint), rank, 2,
                            shard_attention=shard_attention))


@pytest.mark.smollm2
def test_smollm2_rank_loaded_from_its_shard_equals_the_cut_model():
    read = load_shard("smollm2", 1, 3)
    assert_same_weights(read, tensor_parallel(load_model("smollm2"), 1, 3))
    assert read.lm_head.weight is read.embed_tokens.weight  # the tied head is the shard
    assert read.embed_tokens.weight.shape == (49152 // 3, 576)


def quantized_forward(rank, world, checkpoint, group_size, tokens):
    """On each rank: the same round-to-nearest model, then this rank's slice of it."""
    model = quantize_model_rtn(load_model(checkpoint), QuantScheme(4, group_size=group_size))
    with torch.no_grad():
        return tensor_parallel(model)(torch.tensor(tokens))


@pytest.mark.parametrize("group_size", [16, None])
def test_quantized_linears_split_with_whole_groups(varied_checkpoint, group_size):
    model = quantize_model_rtn(load_model(varied_checkpoint), QuantScheme(4, group_size=group_size))
    with torch.no_grad():
        expected = model(torch.tensor([PROMPTS[0]]))
    for logits in run_ranks(quantized_forward, 2, varied_checkpoint, group_size, [PROMPTS[0]],
                            timeout=120):
        assert torch.allclose(logits, expected, atol=1e-5)


def test_a_quantized_model_splits_into_parallel_layers_and_stays_as_it_was(varied_checkpoint):
    model = quantize_model_rtn(load_model(varied_checkpoint), QuantScheme(4, group_size=16))
    before = model_state(model)
    ranked = tensor_parallel(model, 1, 2)
    assert changes(model, before) == []
    attn, mlp = ranked.layers[0].attn, ranked.layers[0].mlp
    for layer in (attn.q_proj, attn.k_proj, attn.v_proj, mlp.gate_proj, mlp.up_proj):
        assert type(layer) is ColumnParallelLinear and type(layer.shard) is QuantLinear
    for layer in (attn.o_proj, mlp.down_proj):
        assert type(layer) is RowParallelLinear and type(layer.shard) is QuantLinear
    assert mlp.down_proj.shard.in_features == model.layers[0].mlp.down_proj.in_features // 2


def test_a_quantization_group_cut_in_two_is_refused(varied_checkpoint):
    # o_proj reads 4 heads x 16 = 64 columns, 32 per rank: a group of 48 would be cut
    model = quantize_model_rtn(load_model(varied_checkpoint), QuantScheme(4, group_size=48))
    before = model_state(model)
    with pytest.raises(ValueError, match="whole quantization groups of 48.*group size"):
        tensor_parallel(model, 0, 2)
    assert changes(model, before) == []  # refused halfway: the model is as it was


def test_a_bad_rank_or_world_is_refused(varied_checkpoint):
    with pytest.raises(ValueError, match="rank 2 is not one of the 2 ranks"):
        tensor_parallel(load_model(varied_checkpoint), 2, 2)
    with pytest.raises(ValueError, match="KV heads \\(2\\).*shard_attention=False"):
        tensor_parallel(load_model(varied_checkpoint), 0, 4)


@pytest.mark.parametrize("shard_attention", [True, False])
def test_the_engine_under_tensor_parallelism_gives_the_one_process_tokens(varied_checkpoint,
                                                                         shard_attention):
    greedy = SamplingParams(max_tokens=12)
    sampled = SamplingParams(max_tokens=12, temperature=0.8, top_p=0.9, seed=7)
    for params in (greedy, sampled):
        expected = engine_tokens(varied_checkpoint, params)
        assert len({tuple(t) for t in expected}) > 1  # the prompts get different tokens
        assert engine_tokens(varied_checkpoint, params, tensor_parallel_size=2,
                             shard_attention=shard_attention) == expected
    assert not dist.is_initialized()  # closing the engine left the group


def test_speculation_runs_under_tensor_parallelism(varied_checkpoint):
    params = SamplingParams(max_tokens=16)
    speculative = SchedulerConfig(speculative_tokens=3)
    assert engine_tokens(varied_checkpoint, params, tensor_parallel_size=2,
                         scheduler=speculative) == engine_tokens(varied_checkpoint, params)


@pytest.mark.smollm2
@pytest.mark.parametrize("world, shard_attention", [(3, True), (2, False)])
def test_smollm2_served_on_several_processes_gives_the_one_process_tokens(world,
                                                                         shard_attention):
    prompts = ["The capital of France is", "def fibonacci(n):"]
    params = SamplingParams(max_tokens=12)
    with LLM("smollm2", num_blocks=64) as llm:
        expected = [out.tokens for out in llm.generate(prompts, params, progress=False)]
    with LLM("smollm2", num_blocks=64, tensor_parallel_size=world,
             shard_attention=shard_attention) as llm:
        assert [out.tokens for out in llm.generate(prompts, params, progress=False)] == expected


def test_bad_engine_configurations_fail_before_any_process_starts(varied_checkpoint):
    with pytest.raises(ValueError, match="KV heads \\(3\\)"):
        LLM("smollm2", tensor_parallel_size=2)
    with pytest.raises(ValueError, match="pass the checkpoint's name or path"):
        LLM(load_model(varied_checkpoint), tensor_parallel_size=2)
    assert not dist.is_initialized()


SHARD_MODULE = '''
from minillm.parallel.tensor import shard_weight as library_shard


def my_shard(weight, dim, rank, world):
    return library_shard(weight, dim, rank, world)


def failing_shard(weight, dim, rank, world):
    if rank > 0:
        raise RuntimeError("this rank cannot cut its weights")
    return library_shard(weight, dim, rank, world)
'''


@pytest.fixture
def shard_module(tmp_path, monkeypatch):
    """A module importable only through this process's sys.path (as the course's
    ``solutions`` folder is from a notebook), not from the workers' working directory."""
    (tmp_path / "course_shards.py").write_text(SHARD_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    import course_shards
    yield course_shards
    del __import__("sys").modules["course_shards"]


def test_a_shard_function_rank_0_imports_is_imported_by_the_workers(varied_checkpoint,
                                                                   shard_module):
    params = SamplingParams(max_tokens=8)
    assert engine_tokens(varied_checkpoint, params, tensor_parallel_size=2,
                         shard_weight=shard_module.my_shard) == engine_tokens(varied_checkpoint,
                                                                             params)


def test_a_worker_that_fails_while_loading_fails_the_start_in_seconds(varied_checkpoint,
                                                                      shard_module):
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="worker 1 \\(code 1\\)"):
        LLM(varied_checkpoint, num_blocks=64, block_size=4, tensor_parallel_size=2,
            shard_weight=shard_module.failing_shard)
    assert time.monotonic() - start < 60  # not the loading barrier's ten minutes
    assert not dist.is_initialized()
