"""Every method of the quantizer registry, one test: quantize the tiny model, compare its
perplexity with the float model's, save, load, and get the same logits back."""

from __future__ import annotations

import copy

import pytest
import torch

from minillm.checkpoint import load_model
from minillm.eval import perplexity
from minillm.generate import generate
from minillm.linear import CompressedLinear
from minillm.quant import QUANTIZERS, QuantScheme, quantize_model
from minillm.quant.checkpoint import save_quantized
from minillm.sampling import SamplingParams
from minillm.testing import tiny_pair

SCHEME = QuantScheme(bits=4, group_size=16)
# name: (method, scheme, options, the largest perplexity ratio to the float model allowed)
# (measured: 1.000, 0.998, 0.991, 1.000, 1.007, 1.000, 1.000, 1.106, 1.081; 2-bit RTN 1.073)
CASES = {
    "rtn int8": ("rtn", QuantScheme(8, True, None), {}, 1.005),
    "rtn int4 g16": ("rtn", SCHEME, {}, 1.03),
    "gptq": ("gptq", SCHEME, {"block_size": 16}, 1.03),
    "awq": ("awq", SCHEME, {"grid": 5}, 1.03),
    "nf4": ("nf4", None, {"block_size": 16}, 1.03),
    "llm_int8": ("llm_int8", None, {"threshold": 6.0}, 1.005),
    "fp8": ("fp8", None, {}, 1.01),
    "sparse24 magnitude": ("sparse24", None, {"prune": "magnitude"}, 1.2),
    "sparse24 wanda int4": ("sparse24", SCHEME, {"prune": "wanda"}, 1.2),
}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The tiny float model, made confident (a random model's predictions are nearly uniform,
    which no quantization error could change), and text it generated itself."""
    model, _ = tiny_pair(tmp_path_factory.mktemp("float"))
    with torch.no_grad():
        model.lm_head.weight.mul_(8)
    text = generate(model, [1], 127, SamplingParams(temperature=1.0, seed=0))[0]
    return model, torch.tensor([1, *text])


def test_every_registered_method_is_tested():
    assert {method for method, *_ in CASES.values()} == set(QUANTIZERS)


def perplexity_ratio(model, quantized, text) -> float:
    return (perplexity(quantized, text, window=64, progress=False).perplexity
            / perplexity(model, text, window=64, progress=False).perplexity)


def test_the_perplexity_check_notices_a_broken_quantizer(reference):
    model, text = reference
    two_bits = quantize_model(copy.deepcopy(model), "rtn", QuantScheme(2, False, 16))
    assert perplexity_ratio(model, two_bits, text) > 1.03


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_quantize_evaluate_save_load(reference, tmp_path, case):
    method, scheme, options, max_ratio = case
    model, text = reference
    windows = text[:96].reshape(3, 32) if QUANTIZERS[method].windows != "none" else None
    quantized = quantize_model(copy.deepcopy(model), method, scheme, windows=windows, **options)
    assert any(isinstance(m, CompressedLinear) for m in quantized.modules())
    assert perplexity_ratio(model, quantized, text) < max_ratio

    save_quantized(quantized, tmp_path / method)
    reloaded = load_model(tmp_path / method)
    assert [type(m) for m in reloaded.modules()] == [type(m) for m in quantized.modules()]
    with torch.no_grad():
        torch.testing.assert_close(reloaded(text[None, :40]), quantized(text[None, :40]),
                                   rtol=0, atol=0)


@pytest.mark.parametrize("call, message", [
    (lambda m: quantize_model(m, "int3"), "unknown quantization method"),
    (lambda m: quantize_model(m, "rtn"), "needs a QuantScheme"),
    (lambda m: quantize_model(m, "gptq", SCHEME), "needs calibration inputs"),
    (lambda m: quantize_model(m, "nf4", SCHEME), "takes no QuantScheme"),
    (lambda m: quantize_model(m, "fp8", windows=torch.zeros(2, 8, dtype=torch.long)),
     "needs no calibration"),
    (lambda m: quantize_model(m, "nf4", damp=0.1), "nf4 has no option damp"),
])
def test_bad_requests_say_what_to_do(reference, call, message):
    with pytest.raises(ValueError, match=message):
        call(copy.deepcopy(reference[0]))
