"""Shared fixtures: a tiny random Llama (minillm and Hugging Face, same weights) and SmolLM2."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # Triton kernels run in Triton's interpreter on a CPU
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from minillm.checkpoint import load_model  # noqa: E402
from minillm.config import ModelConfig  # noqa: E402

TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
            num_kv_heads=2, head_dim=16, max_position_embeddings=128, rms_norm_eps=1e-5,
            rope_theta=10000.0, tie_word_embeddings=False)


def make_hf_llama(config: ModelConfig, seed: int = 0):
    """A randomly initialised transformers LlamaForCausalLM in fp32 for this config."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    hf_config = LlamaConfig(**config.to_hf())
    model = LlamaForCausalLM(hf_config).float().eval()
    with torch.no_grad():  # norms start at 1.0; perturb them so a wrong mapping would show
        for name, param in model.named_parameters():
            if "norm" in name:
                param.add_(0.1 * torch.randn_like(param))
    return model


def tiny_pair(tmp_path, seed: int = 0, **overrides):
    """(minillm model, HF model) with identical weights, going through a saved checkpoint."""
    config = ModelConfig(**{**TINY, **overrides})
    hf = make_hf_llama(config, seed)
    hf.save_pretrained(tmp_path)
    return load_model(tmp_path), hf


def varied_random_model(config: ModelConfig, seed: int = 0):
    """A tiny random model with weights large enough that its greedy tokens vary (a default
    initialisation predicts nearly the same token everywhere)."""
    from minillm.model import Transformer

    torch.manual_seed(seed)
    model = Transformer(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" not in name:
                param.normal_(0, 0.5)
    return model


@pytest.fixture
def tiny_models(tmp_path):
    return tiny_pair(tmp_path)


@pytest.fixture(scope="session")
def smollm2():
    torch.manual_seed(0)
    return load_model("smollm2")


@pytest.fixture(scope="session")
def smollm2_hf():
    from transformers import AutoModelForCausalLM

    from minillm.assets import fetch_course_model

    return AutoModelForCausalLM.from_pretrained(fetch_course_model(), dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def tokenizer():
    from minillm.tokenizer import Tokenizer

    return Tokenizer("smollm2")


def pytest_addoption(parser):
    parser.addoption("--impl", default=None, choices=("exercises", "solutions"),
                     help="implementation the graded tests (tests/grading) import: "
                          "$MINILLM_IMPL, else exercises (your code)")


def pytest_configure(config):
    impl = config.getoption("impl")
    if impl:
        os.environ["MINILLM_IMPL"] = impl
