"""The mixture-of-experts layer against transformers' own sparse MoE blocks (Qwen2-MoE with
its gated shared expert, Qwen3-MoE, OLMoE, Mixtral, DeepSeek-V3 with sigmoid,
bias-corrected, group-limited routing and shared experts), with the weights read from
the safetensors transformers writes: equal within 1e-5 in fp32 (and 1e-12 in fp64) for
1, 3 and 40 tokens, including steps where most experts get no token. The grouped
dispatch runs two products per active expert whatever the token count and never reads
an expert no token chose; ties go to the lower expert; the bytes accounting counts
distinct experts."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from safetensors.torch import load_file
from torch.utils._python_dispatch import TorchDispatchMode

from minillm.moe import MoE, dispatch, expert_bytes_read, softmax_routing, top_k_stable
from minillm.moe_checkpoint import hf_layer_prefix, is_moe_layer, moe_arguments, state_from_hf

HIDDEN, EXPERTS, TOP_K = 16, 8, 2
COMMON = dict(vocab_size=64, hidden_size=HIDDEN, intermediate_size=24, num_hidden_layers=1,
              num_attention_heads=2, num_key_value_heads=2, num_experts_per_tok=TOP_K)
FAMILIES = {  # name: (config class, model class, MoE fields)
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM",
                  dict(num_experts=EXPERTS, moe_intermediate_size=12,
                       shared_expert_intermediate_size=20)),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                  dict(num_experts=EXPERTS, moe_intermediate_size=12, norm_topk_prob=True)),
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM", dict(num_experts=EXPERTS)),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(num_local_experts=EXPERTS)),
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM",
                    dict(n_routed_experts=EXPERTS, moe_intermediate_size=12, n_group=4,
                         topk_group=2, first_k_dense_replace=0, n_shared_experts=2,
                         kv_lora_rank=8, q_lora_rank=8, qk_rope_head_dim=4,
                         qk_nope_head_dim=4, v_head_dim=4)),
}


def saved_hf_block(family: str, tmp_path):
    """A tiny HF model of ``family`` with random MoE weights, saved; returns its MoE block,
    its config.json as a dict and the layer's safetensors tensors."""
    config_class, model_class, fields = FAMILIES[family]
    torch.manual_seed(0)
    config = getattr(transformers, config_class)(**COMMON, **fields)
    model = getattr(transformers, model_class)(config).eval()
    model.set_experts_implementation("eager")  # its reference loop (grouped_mm has no fp64)
    block = model.model.layers[0].mlp
    with torch.no_grad():
        for parameter in block.parameters():
            parameter.copy_(torch.randn_like(parameter) * 0.3)
        if hasattr(block.gate, "e_score_correction_bias"):  # make the bias change choices
            block.gate.e_score_correction_bias.copy_(torch.randn(EXPERTS) * 0.3)
    model.save_pretrained(tmp_path)
    hf_config = json.loads((tmp_path / "config.json").read_text())
    return block, hf_config, load_file(tmp_path / "model.safetensors")


def our_layer(hf_config: dict, tensors: dict) -> MoE:
    layer = MoE.from_hf_config(hf_config)
    experts = moe_arguments(hf_config)["num_experts"]
    layer.load_state_dict(state_from_hf(tensors, hf_layer_prefix(hf_config, 0), experts))
    return layer.eval()


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_equal_to_the_transformers_block_loaded_from_its_safetensors(family, tmp_path):
    block, hf_config, tensors = saved_hf_block(family, tmp_path)
    layer = our_layer(hf_config, tensors)
    for tokens in (1, 3, 40):
        x = torch.randn(1, tokens, HIDDEN)
        with torch.no_grad():
            expected, got = block(x.clone()), layer(x)
            expected64, got64 = block.double()(x.double()), layer.double()(x.double())
        block.float(), layer.float()
        assert (got - expected).abs().max() < 1e-5, (family, tokens)
        assert (got64 - expected64).abs().max() < 1e-12, (family, tokens)


def test_the_families_configs_are_read_with_their_own_field_names():
    qwen3_30b = dict(model_type="qwen3_moe", hidden_size=2048, moe_intermediate_size=768,
                     num_experts=128, num_experts_per_tok=8, norm_topk_prob=True,
                     intermediate_size=6144, hidden_act="silu")
    deepseek_v3 = dict(model_type="deepseek_v3", hidden_size=7168, moe_intermediate_size=2048,
                       n_routed_experts=256, num_experts_per_tok=8, n_group=8, topk_group=4,
                       n_shared_experts=1, routed_scaling_factor=2.5, norm_topk_prob=True,
                       scoring_func="sigmoid", intermediate_size=18432,
                       first_k_dense_replace=3, hidden_act="silu")
    assert moe_arguments(qwen3_30b) == dict(
        hidden_size=2048, expert_intermediate_size=768, num_experts=128, top_k=8,
        norm_topk_prob=True, shared_intermediate_size=None, shared_gate=False, scoring="softmax",
        routed_scaling_factor=1.0, num_groups=1, top_groups=1)
    args = moe_arguments(deepseek_v3)
    assert (args["num_experts"], args["shared_intermediate_size"], args["scoring"],
            args["num_groups"], args["top_groups"]) == (256, 2048, "sigmoid", 8, 4)
    assert [is_moe_layer(deepseek_v3, i) for i in range(5)] == [False] * 3 + [True] * 2
    with pytest.raises(ValueError, match="no MoE mapping for model_type 'llama'"):
        moe_arguments(dict(model_type="llama"))


def test_dispatch_never_reads_an_expert_no_token_chose():
    torch.manual_seed(1)
    gate_up, down = torch.randn(EXPERTS, 24, HIDDEN), torch.randn(EXPERTS, HIDDEN, 12)
    ids = torch.tensor([[3, 5], [5, 0], [3, 0]])  # experts 1, 2, 4, 6, 7 get no token
    weights = torch.rand(3, 2)
    x = torch.randn(3, HIDDEN, dtype=torch.float64)
    expected = dispatch(x, ids, weights, gate_up.double(), down.double())
    unused = torch.tensor([1, 2, 4, 6, 7])
    gate_up[unused], down[unused] = torch.nan, torch.nan
    got = dispatch(x, ids, weights, gate_up.double(), down.double())
    assert torch.equal(got, expected)
    # the oracle: a loop over tokens and their k experts, in float64
    for t in range(3):
        row = sum(weights[t, j] * torch.nn.functional.linear(
            torch.nn.functional.silu(x[t] @ gate_up[ids[t, j], :12].double().T)
            * (x[t] @ gate_up[ids[t, j], 12:].double().T), down[ids[t, j]].double())
            for j in range(2))
        assert torch.allclose(got[t], row, atol=1e-12)


def test_ties_go_to_the_lower_expert_and_weights_renormalise():
    logits = torch.tensor([[1.0, 2.0, 2.0, 2.0, 0.0]])
    assert top_k_stable(logits, 2).tolist() == [[1, 2]]
    ids, weights = softmax_routing(logits, 2, normalize=True)
    assert ids.tolist() == [[1, 2]] and torch.allclose(weights, torch.tensor([[0.5, 0.5]]))
    _, raw = softmax_routing(logits, 2, normalize=False)
    assert torch.allclose(raw, logits.softmax(-1)[:, 1:3])


def test_bytes_read_count_distinct_experts_against_dense_mlps():
    ids = torch.tensor([[0, 1], [1, 2], [0, 2]])  # 3 distinct of 8 experts, k = 2
    traffic = expert_bytes_read(ids, num_experts=8, hidden_size=16, expert_intermediate_size=12,
                                shared_intermediate_size=6, bytes_per_weight=2)
    per_unit = 3 * 16 * 2  # a SwiGLU unit of intermediate width: gate, up, down rows
    assert traffic.experts_used == 3
    assert traffic.moe_bytes == 8 * 16 * 2 + (3 * 12 + 6) * per_unit
    assert traffic.dense_active_bytes == (2 * 12 + 6) * per_unit
    assert traffic.dense_total_bytes == (8 * 12 + 6) * per_unit


class ProductCounter(TorchDispatchMode):
    """Counts the matrix products (ATen mm/addmm/bmm/mv) this thread runs."""

    def __init__(self):
        super().__init__()
        self.products = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.products += func.overloadpacket.__name__ in ("mm", "addmm", "bmm", "mv")
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("tokens", [1, 3, 40])
def test_one_product_per_projection_per_active_expert_whatever_the_tokens(tokens):
    torch.manual_seed(tokens)
    gate_up, down = torch.randn(EXPERTS, 24, HIDDEN), torch.randn(EXPERTS, HIDDEN, 12)
    ids = torch.stack([torch.randperm(EXPERTS)[:TOP_K] for _ in range(tokens)])
    with ProductCounter() as counter:
        dispatch(torch.randn(tokens, HIDDEN), ids, torch.rand(tokens, TOP_K), gate_up, down)
    assert counter.products == 2 * len(torch.unique(ids))  # gate_up and down per expert
