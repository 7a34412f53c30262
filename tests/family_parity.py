"""What every family's parity tests share: tiny random Hugging Face models of each family
(built with transformers' own classes), the prompts, Hugging Face's greedy tokens, a small
eager engine, and :class:`FamilyChecks`, the checks themselves. A test module subclasses
``FamilyChecks`` as ``Test...`` and defines a module-scoped ``pair`` fixture over its
families: (minillm's model loaded from the saved checkpoint, Hugging Face's model)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from engine_driving import preempt_at_random

from minillm.checkpoint import load_model, save_model
from minillm.model import Transformer
from minillm.reference import generate
from minillm.sampling import SamplingParams
from minillm.serve import LLM, SchedulerConfig

WINDOW = 8  # shorter than the prompts, so the window changes what the layers see
SHAPE = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
             num_attention_heads=4, num_key_value_heads=2, head_dim=16,
             max_position_embeddings=128, rms_norm_eps=1e-6, tie_word_embeddings=False,
             bos_token_id=None, eos_token_id=None)  # no token ends a generation early
GEMMA = dict(sliding_window=WINDOW, query_pre_attn_scalar=24, tie_word_embeddings=True,
             layer_types=["sliding_attention", "sliding_attention", "full_attention",
                          "sliding_attention"],
             rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                              "full_attention": {"rope_type": "default", "rope_theta": 1e4}})
DENSE_FAMILIES = {"qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
                  "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {}),
                  "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=WINDOW)),
                  "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM", GEMMA)}
# 3 layers (layer 1 of the Qwens stays dense), 2 of 6 experts per token
EXPERTS = dict(num_hidden_layers=3, num_experts_per_tok=2)
MOE_FAMILIES = {
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM",
                  dict(EXPERTS, num_experts=6, moe_intermediate_size=32, mlp_only_layers=[1],
                       shared_expert_intermediate_size=48)),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                  dict(EXPERTS, num_experts=6, moe_intermediate_size=32, mlp_only_layers=[1],
                       norm_topk_prob=True)),
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM", dict(EXPERTS, num_experts=6,
                                                      intermediate_size=32)),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM",
                dict(EXPERTS, num_local_experts=6, intermediate_size=32,
                     sliding_window=WINDOW)),
}
MLA_FAMILIES = {  # 3 layers, the first dense; latents of 16 + 8 rotary numbers per token
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM",
                    dict(EXPERTS, num_key_value_heads=4, n_routed_experts=6,
                         moe_intermediate_size=32, n_shared_experts=1, n_group=2, topk_group=1,
                         first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=24,
                         qk_rope_head_dim=8, head_dim=8, qk_nope_head_dim=8, v_head_dim=12,
                         rope_scaling=None)),
}
FAMILIES = {**DENSE_FAMILIES, **MOE_FAMILIES, **MLA_FAMILIES}
PROMPTS = [[5, 17, 99, 3, 42, 7, 8, 11, 60, 2, 71, 33], [1, 2], list(range(30, 50)),
           [9] * 13]
MAX_TOKENS = 12


def hf_model(family: str, seed: int = 0, **overrides):
    """transformers' own model of ``family``, randomly initialised in float32, its weights
    (norms and biases too) perturbed so that a wrong mapping shows and greedy tokens vary
    (small embeddings: Gemma's, times sqrt(hidden), would otherwise repeat the last token);
    ``overrides`` change config fields."""
    import transformers

    config_class, model_class, extra = FAMILIES[family]
    torch.manual_seed(seed)
    config = getattr(transformers, config_class)(**{**SHAPE, **extra, **overrides})
    model = getattr(transformers, model_class)(config).float().eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name or "bias" in name:
                param.add_(0.3 * torch.randn_like(param))
            else:
                param.normal_(0, 0.02 if "embed" in name else 0.3)
        for name, buffer in model.named_buffers():  # DeepSeek's load-balancing bias
            if name.endswith("e_score_correction_bias"):
                buffer.normal_(0, 0.3)
    return model


def saved_pair(family: str, directory) -> tuple[Transformer, torch.nn.Module]:
    """(minillm's model loaded from ``family``'s saved checkpoint, Hugging Face's model)."""
    hf = hf_model(family)
    hf.save_pretrained(directory)
    return load_model(directory), hf


def hf_greedy(hf, prompt: list[int]) -> list[int]:
    ids = torch.tensor([prompt])
    out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_TOKENS,
                      do_sample=False, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def engine(model, random_preemption=None, num_blocks=64, on_step=None, **config) -> LLM:
    """An eager engine with blocks of 4; ``random_preemption=(chance, seed)``."""
    llm = LLM(model, block_size=4, num_blocks=num_blocks, executor="eager", on_step=on_step,
              scheduler=SchedulerConfig(**config))
    return llm if random_preemption is None else preempt_at_random(llm, *random_preemption)


MATRIX = {
    "chunked prefill": dict(max_batch=4, max_tokens_per_step=8),
    "random preemption": dict(max_batch=4, max_tokens_per_step=16, random_preemption=(0.3, 1)),
    "short pool": dict(max_batch=4, max_tokens_per_step=64, num_blocks=16),
}


class FamilyChecks:
    """Hugging Face's logits and greedy tokens, in the dense loop and in the engine
    (batched, chunked, preempted, prefix hits, n = 2), a saved model that transformers
    loads back, and the config's parameter count, for the ``pair`` fixture's families."""

    @pytest.fixture(scope="class")
    def expected(self, pair) -> list[list[int]]:
        """Hugging Face's greedy continuation of every prompt."""
        return [hf_greedy(pair[1], prompt) for prompt in PROMPTS]

    def test_teacher_forced_logits_equal_hugging_faces(self, pair):
        ours, hf = pair
        tokens = torch.tensor([PROMPTS[0] + PROMPTS[2], PROMPTS[2] + PROMPTS[0]])  # > WINDOW
        with torch.no_grad():
            expected_logits = hf(tokens).logits
            assert torch.allclose(ours(tokens), expected_logits, atol=1e-4, rtol=0)
            if ours.config.sliding_window is not None:  # the window is what makes them equal
                unwindowed = Transformer(replace(ours.config, sliding_window=None,
                                                 layer_types=None))
                unwindowed.load_state_dict(ours.state_dict())
                assert (unwindowed(tokens) - expected_logits).abs().max() > 1e-2

    def test_greedy_tokens_equal_hugging_faces_in_the_dense_loop_and_the_engine(
            self, pair, expected):
        ours = pair[0]
        assert len({t for tokens in expected for t in tokens}) > 8  # the tokens vary
        params = SamplingParams(max_tokens=MAX_TOKENS)
        assert [generate(ours, p, MAX_TOKENS, params)[0] for p in PROMPTS] == expected
        alone = [engine(ours).generate([p], params, progress=False)[0].tokens for p in PROMPTS]
        assert alone == expected
        batch = engine(ours, max_batch=4).generate(PROMPTS, params, progress=False)
        assert [o.tokens for o in batch] == expected

    @pytest.mark.parametrize("config", MATRIX.values(), ids=MATRIX.keys())
    def test_the_engine_matrix_equals_each_request_alone(self, pair, expected, config):
        llm = engine(pair[0], **config)
        outputs = llm.generate(PROMPTS, SamplingParams(max_tokens=MAX_TOKENS), progress=False)
        assert [o.tokens for o in outputs] == expected
        assert llm.free_blocks() == llm.blocks.num_blocks

    def test_prefix_hits_change_nothing(self, pair):
        ours, hf = pair
        system = list(range(60, 80))  # five full blocks of 4, longer than the window
        prompts = [system + [i, i + 1] for i in range(3)]
        reports = []
        llm = engine(ours, on_step=reports.append, max_batch=1)  # later prompts hit the cache
        outputs = llm.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS), progress=False)
        assert [o.tokens for o in outputs] == [hf_greedy(hf, p) for p in prompts]
        prefills = [(w.start, w.tokens) for report in reports for w in report.work
                    if w.start == 0 or w.tokens > 1]
        assert prefills == [(0, 22), (20, 2), (20, 2)]  # the system prompt is computed once

    def test_two_samples_each_equal_a_single_request_with_its_seed(self, pair):
        ours = pair[0]
        params = SamplingParams(temperature=1.0, seed=5, max_tokens=8, n=2)
        out = engine(ours, max_batch=4, max_tokens_per_step=8).generate(
            [PROMPTS[2]], params, progress=False)[0]
        singles = [generate(ours, PROMPTS[2], 8, replace(params, n=1, seed=5 + i))[0]
                   for i in range(2)]
        assert [s.tokens for s in out.outputs] == singles and singles[0] != singles[1]

    def test_a_saved_model_loads_back_in_transformers(self, pair, tmp_path):
        from transformers import AutoModelForCausalLM

        ours = pair[0]
        save_model(ours, tmp_path)
        theirs = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
        assert type(theirs).__name__ == type(pair[1]).__name__
        tokens = torch.tensor([PROMPTS[2] + PROMPTS[0]])
        with torch.no_grad():
            assert torch.allclose(theirs(tokens).logits, ours(tokens), atol=1e-4, rtol=0)
        assert load_model(tmp_path).config == ours.config

    def test_the_config_counts_the_parameters(self, pair):
        ours = pair[0]
        assert ours.config.num_parameters() == sum(p.numel() for p in ours.parameters())
