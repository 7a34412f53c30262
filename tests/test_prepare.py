"""Transformations never change the caller's model: an engine on any executor, tensor-parallel
sharding (no process group needed when the rank and world are given) and every weight
format of :func:`~minillm.prepare.prepare_model` leave the model they were given with the
same module types at every name, the same parameters and buffers bit for bit (the same
tensors: their storage is not even copied) and the same config. So a model once given to
the compiled executor can still be sharded, and :func:`~minillm.transform.copy_modules`
shares every tensor and keeps tied weights tied."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
from torch import nn

from minillm import reference
from minillm.config import ModelConfig
from minillm.linear import CompressedLinear
from minillm.parallel.layers import ColumnParallelLinear, RowParallelLinear
from minillm.parallel.tensor import COLUMN_PARALLEL, ROW_PARALLEL, tensor_parallel
from minillm.prepare import WEIGHT_FORMATS, Plan, TensorParallel, prepare_model
from minillm.quant import QuantScheme, quantize_model
from minillm.quant.int8_activations import Int8ActivationLinear
from minillm.quant.qlinear import QuantLinear
from minillm.quant.w4a8 import W4A8Linear
from minillm.quant.weight_only import WeightOnlyLinear
from minillm.sampling import SamplingParams
from minillm.serve import LLM
from minillm.testing import TINY, varied_random_model
from minillm.transform import copy_modules

PROMPT = [5, 17, 99, 3, 42, 7, 8]
SCHEMES = {"int8": QuantScheme(8, symmetric=True, group_size=None),
           "int4": QuantScheme(4, symmetric=False, group_size=32)}
LAYERS = {("int8", "as stored"): QuantLinear, ("int4", "as stored"): QuantLinear,
          ("int8", "weight-only"): WeightOnlyLinear, ("int4", "weight-only"): WeightOnlyLinear,
          ("int8", "int8-activations"): Int8ActivationLinear,
          ("int4", "int8-activations"): W4A8Linear}  # the layers each format makes


def tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter, buffer and plain tensor attribute of ``model``, by name."""
    found = dict(model.named_parameters(remove_duplicate=False))
    found |= dict(model.named_buffers(remove_duplicate=False))
    for name, module in model.named_modules(remove_duplicate=False):
        found |= {f"{name}.{key}": value for key, value in vars(module).items()
                  if isinstance(value, torch.Tensor)}
    return found


def snapshot(model: nn.Module) -> dict:
    """What a transformation must not change: module types, tensors (the objects, their
    storage and a copy of their values), the state dict's values, the config."""
    return {"types": [(name, type(module)) for name, module in model.named_modules()],
            "tensors": {name: (t, t.data_ptr(), t.detach().clone())
                        for name, t in tensors(model).items()},
            "state": {key: value.clone() for key, value in model.state_dict().items()},
            "config": (model.config, copy.deepcopy(model.config))}


def assert_unchanged(model: nn.Module, before: dict) -> None:
    assert [(name, type(module)) for name, module in model.named_modules()] == before["types"]
    now = tensors(model)
    assert now.keys() == before["tensors"].keys()
    for name, (tensor, pointer, values) in before["tensors"].items():
        assert now[name] is tensor and now[name].data_ptr() == pointer, name
        assert now[name].dtype == values.dtype and torch.equal(now[name].detach(), values), name
    state = model.state_dict()
    assert state.keys() == before["state"].keys()
    assert all(torch.equal(state[key], value) for key, value in before["state"].items())
    config, values = before["config"]
    assert model.config is config and model.config == values


@pytest.fixture
def model():
    return varied_random_model(ModelConfig(**{**TINY, "tie_word_embeddings": True}))


@pytest.mark.parametrize("executor", ["eager", "compiled", "native"])
def test_engines_sharding_and_weight_formats_leave_the_model_as_it_was(model, executor):
    assert not dist.is_initialized()  # tensor_parallel below needs no process group
    before = snapshot(model)
    expected = reference.generate(model, PROMPT, 6)[0]
    llm = LLM(model, block_size=4, num_blocks=16, executor=executor)
    assert llm.generate([PROMPT], SamplingParams(max_tokens=6), progress=False)[0].tokens \
        == expected
    ranks = [tensor_parallel(model, rank, 2) for rank in (0, 1)]
    assert all(type(r.layers[0].mlp.down_proj) is RowParallelLinear for r in ranks)
    assert_unchanged(model, before)
    for bits, scheme in SCHEMES.items():
        quantized = quantize_model(copy.deepcopy(model), "rtn", scheme)
        quantized_before = snapshot(quantized)
        for weights in WEIGHT_FORMATS:
            prepared = prepare_model(quantized, Plan(weights=weights, executor=executor))
            kinds = {type(m) for m in prepared.modules() if isinstance(m, CompressedLinear)}
            assert kinds == {LAYERS[bits, weights]}  # the format really was applied
            for rank in (0, 1):
                prepare_model(quantized, Plan(TensorParallel(rank, 2), weights=weights,
                                              executor=executor))
        assert_unchanged(quantized, quantized_before)
    assert_unchanged(model, before)
    # and the model still computes what it did
    assert reference.generate(model, PROMPT, 6)[0] == expected


def test_a_model_given_to_the_compiled_executor_can_be_sharded_afterwards(model):
    llm = LLM(model, block_size=4, num_blocks=16, executor="compiled")
    llm.generate([PROMPT], SamplingParams(max_tokens=4), progress=False)
    assert llm.model is not model  # the engine runs its own layout of the model
    ranks = [tensor_parallel(model, rank, 2) for rank in (0, 1)]
    for i, block in enumerate(model.layers):
        for part, names in ((block.attn, ("q_proj", "k_proj", "v_proj", "o_proj")),
                            (block.mlp, ("gate_proj", "up_proj", "down_proj"))):
            for name in names:
                whole = getattr(part, name).weight
                layers = [getattr(getattr(r.layers[i], "attn" if part is block.attn else
                                          "mlp"), name) for r in ranks]
                if name in COLUMN_PARALLEL:
                    assert all(type(layer) is ColumnParallelLinear for layer in layers)
                    dim = 0
                else:
                    assert name in ROW_PARALLEL
                    assert all(type(layer) is RowParallelLinear for layer in layers)
                    dim = 1
                assert all(type(layer.shard) is nn.Linear for layer in layers)
                shards = [layer.shard.weight for layer in layers]
                assert torch.equal(torch.cat(shards, dim), whole), (i, name)


def test_copy_modules_shares_every_tensor_and_keeps_tied_weights_tied(model):
    assert model.lm_head.weight is model.embed_tokens.weight
    before = snapshot(model)
    copied = copy_modules(model)
    assert not set(map(id, copied.modules())) & set(map(id, model.modules()))
    original = tensors(model)
    for name, tensor in tensors(copied).items():
        assert tensor is original[name] and tensor.data_ptr() == original[name].data_ptr()
    assert copied.lm_head.weight is copied.embed_tokens.weight
    # swapping a module or setting an attribute in the copy leaves the model as it was
    copied.layers[0].mlp.gate_proj = nn.Linear(1, 1)
    copied.layers[0].attn.num_heads = 1
    copied.config = None
    assert_unchanged(model, before)
    assert model.layers[0].attn.num_heads == TINY["num_heads"]
