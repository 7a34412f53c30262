"""Tensor parallelism over gloo processes on this CPU: the sharded model's logits equal one
process's (1e-5 on tiny models; SmolLM2 to fp32 rounding), greedy tokens are identical,
every rank runs exactly 2 all-reduces per block plus the embedding's and one all-gather
for the head, and bad splits are refused before any process starts. ``tensor_parallel``
is a transformation: it returns a new rank model built of explicit parallel layers and
leaves the model it was given exactly as it was."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from minillm.checkpoint import load_model
from minillm.config import ModelConfig
from minillm.generate import generate
from minillm.parallel import COLLECTIVES, tensor_parallel
from minillm.parallel.launch import run_ranks
from minillm.parallel.layers import (
    ColumnParallelLinear,
    ParallelLMHead,
    RowParallelLinear,
    VocabParallelEmbedding,
    all_reduce,
)
from minillm.parallel.tensor import COLUMN_PARALLEL, ROW_PARALLEL, check_split
from minillm.testing import TINY, tiny_pair, varied_random_model

TOKENS = [[5, 17, 99, 3, 42, 7, 8, 5], [1, 2, 3, 4, 5, 6, 7, 8]]
ATTENTION_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_LINEARS = ("gate_proj", "up_proj", "down_proj")


def split_in_memory_forward(rank, world, checkpoint, tokens):
    """On each rank: load, keep this rank's shard, run a forward and a greedy generation."""
    model = tensor_parallel(load_model(checkpoint))
    COLLECTIVES.clear()
    with torch.no_grad():
        logits = model(torch.tensor(tokens))
    counts = dict(COLLECTIVES)
    return {"logits": logits, "collectives": counts, "heads": model.config.num_kv_heads,
            "greedy": generate(model, tokens[0], 10)[0], "hooks": hooked(model)}


@pytest.mark.parametrize("world, kv_heads", [(2, 2), (4, 4), (2, 4)])
def test_tiny_model_under_tensor_parallelism_equals_one_process(tmp_path, world, kv_heads):
    tiny_pair(tmp_path, num_heads=8, num_kv_heads=kv_heads, head_dim=8, attention_bias=True)
    model = load_model(tmp_path)
    with torch.no_grad():
        expected = model(torch.tensor(TOKENS))
    results = run_ranks(split_in_memory_forward, world, str(tmp_path), TOKENS, timeout=120)
    for rank in results:
        assert torch.allclose(rank["logits"], expected, atol=1e-5)
        assert rank["greedy"] == generate(model, TOKENS[0], 10)[0]
        assert rank["heads"] == kv_heads // world  # KV caches sized from the rank's heads
        layers = model.config.num_layers
        assert rank["collectives"] == {"all_reduce": 2 * layers + 1, "all_gather": 1}
        assert rank["hooks"] == []  # the layers call their collectives, no hooks do


def test_smollm2_splits_three_ways_by_kv_group(smollm2):
    with torch.no_grad():
        expected = smollm2(torch.tensor(TOKENS))
    results = run_ranks(split_in_memory_forward, 3, "smollm2", TOKENS, timeout=300)
    for rank in results:
        # 1.1e-3 measured on logits of ~20: fp32 partial sums added in another order, over
        # 30 layers whose activations reach ~1e3 (chapter 06's outlier features)
        assert (rank["logits"] - expected).abs().max() < 5e-3
        assert torch.equal(rank["logits"].argmax(-1), expected.argmax(-1))
        assert rank["greedy"] == generate(smollm2, TOKENS[0], 10)[0]
        assert rank["collectives"] == {"all_reduce": 61, "all_gather": 1}


@pytest.mark.parametrize("world, message", [(2, "KV heads \\(3\\)"), (4, "KV heads"),
                                            (5, "KV heads")])
def test_uneven_splits_are_refused_before_any_process_starts(world, message):
    with pytest.raises(ValueError, match=message):
        check_split(9, 3, 1536, 49152, world)


def test_a_failing_rank_takes_the_group_down(tmp_path):
    with pytest.raises(Exception, match="needs the KV heads"):
        run_ranks(split_in_memory_forward, 2, "smollm2", TOKENS, timeout=120)


# --- a transformation: the model it was given stays as it was --------------------------------


def model_state(model: nn.Module) -> dict:
    """Everything a transformation could change in place: the module object at every name
    with a copy of its plain attributes (heads, config, the reduce function...), and every
    parameter and buffer (the tensor object, its storage and a copy of its values)."""
    modules = {name: (module, copy.deepcopy({key: value for key, value in vars(module).items()
                                             if not key.startswith("_")}))
               for name, module in model.named_modules(remove_duplicate=False)}
    tensors = {name: (tensor, tensor.data_ptr(), tensor.detach().clone())
               for named in (model.named_parameters(remove_duplicate=False),
                             model.named_buffers(remove_duplicate=False))
               for name, tensor in named}
    return {"modules": modules, "tensors": tensors}


def changes(model: nn.Module, before: dict) -> list[str]:
    """What differs in ``model`` from :func:`model_state`'s ``before`` (empty: bit for bit
    the same model). A list, so that a rank process can return it to the test."""
    now, found = model_state(model), []
    if now["modules"].keys() != before["modules"].keys():
        found.append(f"module names {sorted(now['modules'].keys() ^ before['modules'].keys())}")
    for name, (module, attributes) in before["modules"].items():
        if name in now["modules"]:
            if now["modules"][name][0] is not module:
                found.append(f"module {name!r}: {type(module).__name__} replaced by "
                             f"{type(now['modules'][name][0]).__name__}")
            elif now["modules"][name][1] != attributes:
                found.append(f"module {name!r}: attributes {attributes} became "
                             f"{now['modules'][name][1]}")
    if now["tensors"].keys() != before["tensors"].keys():
        found.append(f"tensor names {sorted(now['tensors'].keys() ^ before['tensors'].keys())}")
    for name, (tensor, pointer, values) in before["tensors"].items():
        if name in now["tensors"]:
            current, current_pointer, _ = now["tensors"][name]
            if current is not tensor or current_pointer != pointer:
                found.append(f"tensor {name!r} replaced")
            elif current.dtype != values.dtype or not torch.equal(current.detach(), values):
                found.append(f"tensor {name!r}: values changed")
    return found


def hooked(model: nn.Module) -> list[str]:
    """The modules of ``model`` that carry a hook of any kind (and global module hooks)."""
    kinds = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks",
             "_state_dict_hooks", "_load_state_dict_pre_hooks")
    found = [f"{name or 'the model'}.{kind}" for name, module in model.named_modules()
             for kind in kinds if getattr(module, kind, None)]
    module_globals = nn.modules.module
    return found + [kind for kind in ("_global_forward_hooks", "_global_forward_pre_hooks",
                                      "_global_backward_hooks", "_global_backward_pre_hooks")
                    if getattr(module_globals, kind, None)]


@pytest.mark.parametrize("shard_attention", [True, False])
@pytest.mark.parametrize("tied", [False, True])
def test_tensor_parallel_returns_a_rank_model_and_leaves_the_model_as_it_was(shard_attention,
                                                                            tied):
    model = varied_random_model(ModelConfig(**{**TINY, "tie_word_embeddings": tied}))
    config = model.config
    before = model_state(model)
    tokens = torch.tensor(TOKENS)
    with torch.no_grad():
        logits = model(tokens)
    world = 2
    ranks = [tensor_parallel(model, rank, world, shard_attention=shard_attention)
             for rank in range(world)]
    assert changes(model, before) == []
    assert model.config is config and model.config == ModelConfig(
        **{**TINY, "tie_word_embeddings": tied})
    with torch.no_grad():  # and it still computes what it did
        assert torch.equal(model(tokens), logits)
    for ranked in ranks:
        assert ranked is not model and hooked(ranked) == []
        assert not set(map(id, ranked.modules())) & set(map(id, model.modules()))
        for block, original in zip(ranked.layers, model.layers, strict=True):
            for module, whole, names in ((block.attn, original.attn, ATTENTION_LINEARS),
                                         (block.mlp, original.mlp, MLP_LINEARS)):
                for name in names:
                    layer = getattr(module, name)
                    if module is block.attn and not shard_attention:
                        # attention kept whole: a plain linear holding the model's weight
                        assert type(layer) is nn.Linear, name
                        assert layer.weight is getattr(whole, name).weight, name
                    elif name in COLUMN_PARALLEL:
                        assert type(layer) is ColumnParallelLinear, name
                        assert type(layer.shard) is nn.Linear, name
                    else:
                        assert name in ROW_PARALLEL
                        assert type(layer) is RowParallelLinear, name
                        assert type(layer.shard) is nn.Linear and layer.reduce is all_reduce
            heads = (config.num_heads // world, config.num_kv_heads // world) \
                if shard_attention else (config.num_heads, config.num_kv_heads)
            assert (block.attn.num_heads, block.attn.num_kv_heads) == heads
        assert (ranked.config.num_heads, ranked.config.num_kv_heads) == heads
        assert ranked.config.intermediate_size == config.intermediate_size // world
        assert type(ranked.embed_tokens) is VocabParallelEmbedding
        assert type(ranked.lm_head) is ParallelLMHead
        assert (ranked.lm_head.weight is ranked.embed_tokens.weight) == tied


def test_a_rank_model_is_not_sharded_again():
    ranked = tensor_parallel(varied_random_model(ModelConfig(**TINY)), 0, 2)
    before = model_state(ranked)
    with pytest.raises(ValueError, match="already a tensor-parallel"):
        tensor_parallel(ranked, 0, 2)
    assert changes(ranked, before) == []
