"""Shared fixtures: a tiny random Llama (minillm and Hugging Face, same weights) and SmolLM2.

Helpers that tests import live in the library (:mod:`minillm.testing`), never here: a
``from conftest import`` resolves to whichever conftest.py pytest imported last.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # Triton kernels run in Triton's interpreter on a CPU
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from minillm.checkpoint import load_model  # noqa: E402
from minillm.testing import tiny_pair  # noqa: E402


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
