"""Graded tests for chapter 12, section 9 (12.6-12.8): int8 and KIVI int4 KV blocks.

Oracles: the library's rounding (``minillm.attention.kv_quant``, ``kv_int4``), bit for bit,
on hidden random tensors drawn by Hypothesis (outlier channels, zero and constant rows,
tiny magnitudes, exact ties, bf16 and fp16 inputs) and on edge cases; what the engine's
int4 pool stores for a block; the rounding error bound (half a scale) on your own output;
and the engine, attending through your rounding (``minillm.experiments.kv_rounding``).
"""

from __future__ import annotations

import pytest
import torch
from ch12_engine_case import CONFIG, PARAMS, PROMPTS
from hypothesis import given, settings
from hypothesis import strategies as st

from minillm.attention import kv_int4, kv_quant
from minillm.config import ModelConfig
from minillm.engine.int4_cache import Int4Pool
from minillm.experiments.kv_rounding import RoundedReads, int4_rounding, int8_rounding
from minillm.grading import load_impl
from minillm.serve import LLM
from minillm.testing import varied_random_model

impl = load_impl("ch12_kv_quant")
HIDDEN = settings(max_examples=80, deadline=None, derandomize=True, database=None)
EPS = torch.finfo(torch.float32).eps


def assert_same(yours: torch.Tensor, library: torch.Tensor, what: str) -> None:
    """Equal dtype, shape and every element (the library never gives NaN)."""
    assert (yours.dtype, tuple(yours.shape)) == (library.dtype, tuple(library.shape)), \
        f"{what}: yours {yours.dtype} {tuple(yours.shape)}, the library's {library.dtype} " \
        f"{tuple(library.shape)}"
    differ = yours != library
    if differ.any():
        at = tuple(differ.nonzero()[0].tolist())
        raise AssertionError(f"{what}: {int(differ.sum())} of {differ.numel()} differ; at "
                             f"{at} yours {yours[at].item()}, the library's {library[at].item()}")


@st.composite
def tensors(draw, shape: tuple[int, ...] | None = None) -> torch.Tensor:
    """Random keys or values (of ``shape``, or a random one), with what a mistake hides
    behind: an outlier channel, rows of zeros, constant rows, tiny magnitudes, large ones,
    a constant offset, and half-precision inputs."""
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    if shape is None:
        shape = (*draw(st.lists(st.integers(1, 5), min_size=1, max_size=3)),
                 draw(st.integers(1, 70)))
    x = torch.randn(*shape, generator=g) * draw(st.sampled_from([1.0, 1e-3, 300.0, 1e-30]))
    if draw(st.booleans()):  # an outlier channel, as SmolLM2's keys have
        x[..., draw(st.integers(0, shape[-1] - 1))] *= draw(st.sampled_from([20.0, -1e4]))
    if draw(st.booleans()):  # some rows zero, some constant
        rows = torch.rand(*shape[:-1], 1, generator=g)
        x = torch.where(rows < 0.2, 0.0, torch.where(rows > 0.8, x[..., :1], x))
    if draw(st.booleans()):  # a constant offset: int4's minimum is not 0
        x = x + 2.0 * x.abs().amax()
    dtype = draw(st.sampled_from([torch.float32, torch.float32, torch.bfloat16,
                                  torch.float16]))
    return x.to(dtype) if x.abs().amax() < 6e4 else x  # fp16 would overflow


def block(block_size=16, kv_heads=3, head_dim=8, seed=0, outlier=None) -> tuple:
    """Random keys and values of one full block; ``outlier``: a key channel times 1000."""
    g = torch.Generator().manual_seed(seed)
    keys, values = torch.randn(2, block_size, kv_heads, head_dim, generator=g)
    if outlier is not None:
        keys[..., outlier] = 1000 + keys[..., outlier]
    return keys, values


def library_block(keys, values):
    """What the engine's int4 pool stores for a full block (``minillm.engine.int4_cache``)."""
    key_codes, key_scales, key_minimums = kv_int4.quantize_int4(keys, dim=0)
    value_codes, value_scales, value_minimums = kv_int4.quantize_int4(values, dim=-1)
    return impl.Int4Block(kv_int4.pack(key_codes), key_scales, key_minimums,
                          kv_int4.pack(value_codes), value_scales, value_minimums)


FIELDS = ("key_codes", "key_scales", "key_minimums", "value_codes", "value_scales",
          "value_minimums")


def assert_same_block(yours, library) -> None:
    for name in FIELDS:
        assert_same(getattr(yours, name), getattr(library, name), name)


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


# -- 12.8 KIVI: one full block, keys per channel, values per token, packed ----------------

@pytest.mark.exercise("12.8", points=1)
def test_pack_two_codes_a_byte_low_nibble_first():
    codes = torch.tensor([[1, 2, 15, 0, 7, 9]], dtype=torch.uint8)
    packed = impl.pack(codes)
    assert packed.dtype == torch.uint8 and packed.tolist() == [[0x21, 0x0F, 0x97]]
    assert torch.equal(impl.unpack(packed), codes)
    every = torch.randint(0, 16, (3, 2, 64), dtype=torch.uint8,
                          generator=torch.Generator().manual_seed(6))
    assert_same(impl.pack(every), kv_int4.pack(every), "packed")
    assert_same(impl.unpack(kv_int4.pack(every)), every, "unpacked")


@pytest.mark.exercise("12.8", points=3)
@HIDDEN
@given(data=st.data())
def test_kivi_block_equals_the_librarys_on_hidden_random_blocks(data):
    shape = (data.draw(st.sampled_from([1, 2, 4, 16]), label="block_size"),
             data.draw(st.integers(1, 3), label="kv_heads"),
             data.draw(st.sampled_from([2, 8, 64]), label="head_dim"))
    keys, values = data.draw(tensors(shape), label="keys"), data.draw(tensors(shape))
    before = keys.clone(), values.clone()
    assert_same_block(impl.quantize_kv_block(keys, values), library_block(keys, values))
    assert torch.equal(keys, before[0]) and torch.equal(values, before[1]), \
        "the inputs must not be changed"


@pytest.mark.exercise("12.8", points=2)
@pytest.mark.parametrize("block_size, kv_heads, head_dim", [(16, 3, 64), (4, 2, 8)])
def test_kivi_block_is_what_the_engines_int4_pool_stores(block_size, kv_heads, head_dim):
    """A full block written to the engine's int4 pool and rounded (a query after it reads
    it) holds your block's codes, scales and minimums."""
    config = ModelConfig(vocab_size=8, hidden_size=kv_heads * head_dim, intermediate_size=8,
                         num_layers=1, num_heads=kv_heads, num_kv_heads=kv_heads,
                         head_dim=head_dim, max_position_embeddings=64)
    pool = Int4Pool(config, num_blocks=4, block_size=block_size)
    keys, values = block(block_size, kv_heads, head_dim, seed=7, outlier=1)
    pool.write(0, keys, values, torch.arange(2 * block_size, 3 * block_size))
    pool.attend(0, torch.zeros(1, kv_heads, 1, head_dim), torch.tensor([[2, 3]]),
                torch.tensor([[block_size]]), [block_size])
    stored = impl.Int4Block(pool.keys[0][2], pool.key_scales[0][2], pool.key_minimums[0][2],
                            pool.values[0][2], pool.value_scales[0][2],
                            pool.value_minimums[0][2])
    assert_same_block(impl.quantize_kv_block(keys, values), stored)


@pytest.mark.exercise("12.8", points=1)
def test_a_huge_key_channel_leaves_the_others_precise():
    """Keys per channel: a channel near 1000 in every token costs the other channels
    nothing (per token, its range would swallow their 16 levels)."""
    keys, values = block(outlier=5, seed=8)
    back, _ = impl.dequantize_kv_block(impl.quantize_kv_block(keys, values))
    others = torch.arange(keys.shape[-1]) != 5
    spread = keys.amax(0) - keys.amin(0)  # each channel's range over the block
    assert ((back - keys).abs()[..., others] <= spread[..., others] / 30 + 1e-6).all()


@pytest.mark.exercise("12.8", points=1)
def test_kivi_dequantize_equals_the_library():
    keys, values = block(seed=9, outlier=0)
    rounded = library_block(keys, values)
    back_keys, back_values = impl.dequantize_kv_block(rounded)
    assert_same(back_keys, kv_int4.dequantize_int4(kv_int4.unpack(rounded.key_codes),
                                                   rounded.key_scales, rounded.key_minimums,
                                                   0), "keys")
    assert_same(back_values, kv_int4.dequantize_int4(kv_int4.unpack(rounded.value_codes),
                                                     rounded.value_scales,
                                                     rounded.value_minimums, -1), "values")


@pytest.mark.exercise("12.8", points=1)
def test_an_all_zero_block_and_constant_channels():
    keys, values = torch.zeros(2, 4, 2, 8)
    keys[:, 1, 3] = -2.5  # a constant key channel; values: every row zero
    yours = impl.quantize_kv_block(keys, values)
    assert_same_block(yours, library_block(keys, values))
    back_keys, back_values = impl.dequantize_kv_block(yours)
    assert torch.equal(back_keys, keys) and torch.equal(back_values, values)


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
