"""Graded tests for chapter 12, section 9: int8 (12.6) and int4 (12.7) KV rounding.

Oracles: the library's rounding (``minillm.attention.kv_quant``, ``kv_int4``), bit for bit,
on hidden random tensors drawn by Hypothesis (outlier channels, zero and constant rows,
tiny magnitudes, exact ties, bf16 and fp16 inputs) and on edge cases; the rounding error
bound (half a scale) on your own output; and the engine, attending through your rounding
(``minillm.experiments.kv_rounding``) with the library's tokens and errors. KIVI's block
(12.8) is graded in ``test_ch12_kv_quant__kivi_block.py``.
"""

from __future__ import annotations

import pytest
import torch
from ch12_engine_case import CONFIG, PARAMS, PROMPTS
from ch12_kv_cases import EPS, HIDDEN, assert_same, tensors
from hypothesis import given
from hypothesis import strategies as st

from minillm.attention import kv_int4, kv_quant
from minillm.experiments.kv_rounding import RoundedReads, int4_rounding, int8_rounding
from minillm.grading import load_impl
from minillm.serve import LLM
from minillm.testing import varied_random_model

impl = load_impl("ch12_kv_quant")


# -- 12.6 int8, one scale per token and KV head -------------------------------------------

@pytest.mark.exercise("12.6", points=3)
@HIDDEN
@given(x=tensors())
def test_int8_equals_the_library_on_hidden_random_heads(x):
    before = x.clone()
    codes, scales = impl.quantize_int8(x)
    expected_codes, expected_scales = kv_quant.quantize_int8(x)
    assert_same(codes, expected_codes, "codes")
    assert_same(scales, expected_scales, "scales")
    assert_same(impl.dequantize_int8(expected_codes, expected_scales),
                kv_quant.dequantize_int8(expected_codes, expected_scales), "dequantized")
    assert torch.equal(x, before), "the input must not be changed"


@pytest.mark.exercise("12.6", points=1)
def test_int8_ties_round_to_even():
    scale = 2.0 ** -3  # exact: each x / scale below is exactly k + 1/2
    x = torch.tensor([[127, 2.5, -2.5, 0.5, -0.5, 1.5, -1.5, 126.5]]) * scale
    codes, scales = impl.quantize_int8(x)
    assert scales.tolist() == [scale]
    assert codes.tolist() == [[127, 2, -2, 0, 0, 2, -2, 126]]


@pytest.mark.exercise("12.6", points=1)
def test_int8_zero_and_tiny_rows():
    """A row of zeros: scale 0, codes 0, and zeros back, no NaN; a row of values near
    1e-30 is rounded by its own maximum like any other."""
    x = torch.randn(4, 3, 16, generator=torch.Generator().manual_seed(1))
    x[0, 1], x[2] = 0.0, x[2] * 1e-30
    codes, scales = impl.quantize_int8(x)
    assert scales[0, 1] == 0 and not codes[0, 1].any()
    assert not impl.dequantize_int8(codes, scales).isnan().any()
    assert_same(codes, kv_quant.quantize_int8(x)[0], "codes")
    assert_same(scales, kv_quant.quantize_int8(x)[1], "scales")


@pytest.mark.exercise("12.6", points=1)
def test_int8_one_huge_token_keeps_the_others_precise():
    x = torch.randn(6, 2, 64, generator=torch.Generator().manual_seed(2))
    x[3] *= 1e4
    codes, scales = impl.quantize_int8(x)
    assert (codes.abs().amax(-1) == 127).all(), "every row's largest value is +-127"
    assert_same(scales, kv_quant.quantize_int8(x)[1], "scales")


@pytest.mark.exercise("12.6", points=1)
@HIDDEN
@given(x=tensors())
def test_int8_error_is_at_most_half_a_scale(x):
    codes, scales = impl.quantize_int8(x)
    error = (impl.dequantize_int8(codes, scales).double() - x.double()).abs()
    bound = scales.double()[..., None] * (0.5 + 4 * EPS)
    assert (error <= bound).all(), f"an error of {(error - bound).max():.3g} beyond scale / 2"
    nonzero = x.float().abs().amax(-1) > 0
    assert (codes.abs().amax(-1)[nonzero] == 127).all(), "each row's largest |x| is 127"


@pytest.mark.exercise("12.6", points=1)
def test_int8_dequantize_equals_the_library():
    g = torch.Generator().manual_seed(3)
    codes = torch.randint(-127, 128, (5, 3, 64), dtype=torch.int8, generator=g)
    scales = torch.rand(5, 3, generator=g) * 1e-2
    scales[1, 2] = 0.0
    assert_same(impl.dequantize_int8(codes, scales),
                kv_quant.dequantize_int8(codes, scales), "dequantized")


# -- 12.7 int4, asymmetric, one group along a dimension -----------------------------------

@pytest.mark.exercise("12.7", points=3)
@HIDDEN
@given(x=tensors(), data=st.data())
def test_int4_equals_the_library_on_hidden_random_groups(x, data):
    dim = data.draw(st.integers(-x.dim(), x.dim() - 1), label="dim")
    before = x.clone()
    expected = kv_int4.quantize_int4(x, dim)
    for what, yours, library in zip(("codes", "scales", "minimums"),
                                    impl.quantize_int4(x, dim), expected, strict=True):
        assert_same(yours, library, what)
    assert_same(impl.dequantize_int4(*expected, dim), kv_int4.dequantize_int4(*expected, dim),
                "dequantized")
    assert torch.equal(x, before), "the input must not be changed"


@pytest.mark.exercise("12.7", points=1)
def test_int4_ties_round_to_even():
    scale, low = 2.0 ** -2, -1.0  # exact: each (x - min) / scale is k or k + 1/2
    x = low + torch.tensor([[0, 15, 2.5, 3.5, 0.5, 14.5, 7.5]]) * scale
    codes, scales, minimums = impl.quantize_int4(x, -1)
    assert (scales.tolist(), minimums.tolist()) == ([scale], [low])
    assert codes.tolist() == [[0, 15, 2, 4, 0, 14, 8]]


@pytest.mark.exercise("12.7", points=1)
@pytest.mark.parametrize("value", [0.0, -3.5, 2.0 ** 60])
def test_int4_a_constant_group(value):
    """max == min: scale 0, codes 0, the value as minimum; back exactly, no NaN."""
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(4))
    x[1] = value
    codes, scales, minimums = impl.quantize_int4(x, 1)
    assert (scales[1].item(), minimums[1].item()) == (0.0, value) and not codes[1].any()
    back = impl.dequantize_int4(codes, scales, minimums, 1)
    assert not back.isnan().any() and (back[1] == value).all()


@pytest.mark.exercise("12.7", points=1)
@HIDDEN
@given(x=tensors(), data=st.data())
def test_int4_codes_span_0_to_15_and_err_at_most_half_a_scale(x, data):
    dim = data.draw(st.integers(-x.dim(), x.dim() - 1), label="dim")
    codes, scales, minimums = impl.quantize_int4(x, dim)
    assert codes.dtype == torch.uint8 and int(codes.max()) <= 15
    varied = scales > 0
    assert (codes.amin(dim)[varied] == 0).all() and (codes.amax(dim)[varied] == 15).all(), \
        "a group's minimum has code 0 and its maximum code 15"
    error = (impl.dequantize_int4(codes, scales, minimums, dim).double() - x.double()).abs()
    size = minimums.double().abs() + 15 * scales.double()  # the largest |value| of a group
    bound = (scales.double() * 0.5 + 4 * EPS * size).unsqueeze(dim)
    assert (error <= bound).all(), f"an error of {(error - bound).max():.3g} beyond scale / 2"


@pytest.mark.exercise("12.7", points=1)
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_int4_dequantize_along_each_dim(dim):
    g = torch.Generator().manual_seed(5)
    codes = torch.randint(0, 16, (4, 5, 6), dtype=torch.uint8, generator=g)
    stats = [n for i, n in enumerate(codes.shape) if i != dim % 3]
    scales, minimums = torch.rand(*stats, generator=g), torch.randn(*stats, generator=g)
    assert_same(impl.dequantize_int4(codes, scales, minimums, dim),
                kv_int4.dequantize_int4(codes, scales, minimums, dim), "dequantized")


# -- the engine, attending through your rounding -------------------------------------------

@pytest.fixture(scope="module")
def model():
    return varied_random_model(CONFIG)


def engine_run(model, readings, follow):
    reads = RoundedReads(readings, follow=follow)
    llm = LLM(model, block_size=4, num_blocks=48, decode_attention=reads)
    return [o.tokens for o in llm.generate(PROMPTS, PARAMS, progress=False)], reads.errors


@pytest.mark.exercise("12.6", points=2)
def test_your_int8_cache_runs_the_engine(model):
    """Every step of four requests attends through your int8 rounding: the same tokens, and
    the same attention error in every layer of every step, as through the library's."""
    yours = int8_rounding(impl.quantize_int8, impl.dequantize_int8)
    library = int8_rounding(kv_quant.quantize_int8, kv_quant.dequantize_int8)
    readings = {"yours": (yours, yours), "library": (library, library)}
    tokens, errors = engine_run(model, readings, "yours")
    assert tokens == engine_run(model, readings, "library")[0]
    assert errors["yours"] == errors["library"] and max(errors["yours"]) > 0


@pytest.mark.exercise("12.7", points=2)
def test_your_int4_kivi_rounding_runs_the_engine(model):
    """Keys per channel over each block, values per token, with your int4 functions: the
    library's tokens and attention errors."""
    def kivi(quantize, dequantize):
        return (int4_rounding(quantize, dequantize, per_channel=True),
                int4_rounding(quantize, dequantize, per_channel=False))
    readings = {"yours": kivi(impl.quantize_int4, impl.dequantize_int4),
                "library": kivi(kv_int4.quantize_int4, kv_int4.dequantize_int4)}
    tokens, errors = engine_run(model, readings, "yours")
    assert tokens == engine_run(model, readings, "library")[0]
    assert errors["yours"] == errors["library"] and max(errors["yours"]) > 0
