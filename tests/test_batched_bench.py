"""benchmarks/batched.py's pieces that decide what is measured: the prompts, the weight
formats and the llama.cpp GGUFs each model is compared with (nothing is timed here)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from minillm.config import ModelConfig
from minillm.quant.int8_activations import Int8ActivationLinear
from minillm.testing import TINY, varied_random_model

BENCHMARKS = Path(__file__).parent.parent / "benchmarks"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_benchmark", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


batched, llama_cpp = _load("batched"), _load("llama_cpp")


class StubTokenizer:
    """Token ids 0, 1, 2, ... for any text; ``start`` is what a document begins with."""

    def __init__(self, start: list[int]):
        self.start = start

    def prompt(self, text: str) -> list[int]:
        return self.start + self.encode(text)

    def encode(self, text: str) -> list[int]:
        return list(range(1000, 1000 + 5000)) if text else []


@pytest.fixture(autouse=True)
def no_corpus(monkeypatch):
    monkeypatch.setattr(batched, "load_text", lambda name, split: "some text")


def test_gemma_prompts_start_with_bos_and_keep_their_length():
    prompts = batched.prompts_of(StubTokenizer([2]), count=3, length=8)
    assert [len(p) for p in prompts] == [8, 8, 8]
    assert all(p[0] == 2 for p in prompts)
    assert [p[1:] for p in prompts] == [list(range(1000 + 7 * i, 1000 + 7 * (i + 1)))
                                        for i in range(3)]  # different text, no overlap


def test_smollm2_prompts_are_plain_text_slices():
    prompts = batched.prompts_of(StubTokenizer([]), count=2, length=4)
    assert prompts == [[1000, 1001, 1002, 1003], [1004, 1005, 1006, 1007]]


def test_formats_quantize_into_a_new_model_and_keep_fp32_as_is():
    plain = varied_random_model(ModelConfig(**TINY))
    before = {name: tensor.clone() for name, tensor in plain.state_dict().items()}
    assert batched.in_format(plain, "fp32") is plain
    w8a8 = batched.in_format(plain, "W8A8")
    assert isinstance(w8a8.layers[0].mlp.down_proj, Int8ActivationLinear)
    assert all(torch.equal(before[name], tensor) for name, tensor in plain.state_dict().items())
    ids = torch.tensor([[1, 5, 9, 13, 17]])
    with torch.no_grad():
        exact, rounded = plain(ids), w8a8(ids)
    # the same model, rounded (int8 error on these large random weights is ~9% of the peak
    # logit; another model's logits would be off by ~100%)
    assert (exact - rounded).abs().max() < 0.2 * exact.abs().max()


def test_every_format_has_a_gguf_peer():
    """Converted GGUFs for every model; Q4_1 (W4A8's peer) only as SmolLM2's course file."""
    for model, (_, formats) in batched.MODELS.items():
        assert model in llama_cpp.GGUF_STEMS
        peers = {batched.PEERS[fmt] for fmt in formats}
        assert peers <= {*llama_cpp.CONVERTED, *(("Q4_1",) if model == "smollm2" else ())}


def test_gguf_names_and_an_unknown_model():
    assert llama_cpp.gguf_path("Q8_0", "gemma3-270m").name == "gemma-3-270m-Q8_0.gguf"
    assert llama_cpp.gguf_path("F32").name == "SmolLM2-135M-Instruct-F32.gguf"
    with pytest.raises(ValueError, match="pick one of"):
        llama_cpp.make_ggufs("qwen3-0.6b")

