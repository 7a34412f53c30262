"""The register-blocked products of a few rows (issue 35): a verification of n tokens or a
small batch runs tiles of several activation rows x four weight rows. The float32 product
is the float64 one to float32 rounding and, row for row, the same bits whatever shares its
batch; the int8 product (16-bit multiply-adds on AVX2 without VNNI) is the readable
reference bit for bit; both on ragged shapes (rows not a multiple of the tile, out not a
multiple of four, in not a multiple of the vector width)."""

from __future__ import annotations

import pytest
import torch

from minillm import ops
from minillm.native import native_kernels

ROWS = [1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 17, 33]
# (out, in): SmolLM2's width; out not a multiple of 4; in not a multiple of 8 or 16.
SHAPES = [(64, 576), (67, 128), (30, 100), (5, 13), (3, 7)]



@pytest.fixture(scope="module")
def kernels():
    module = native_kernels()
    if module is None:
        pytest.skip("the C++ kernels could not be built")
    return module


def fp32_inputs(rows: int, out: int, in_: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(rows * 1000 + out * 10 + in_)
    x = torch.randn(rows, in_, generator=generator)
    weight = torch.randn(out, in_, generator=generator)
    return x, weight


@pytest.mark.parametrize("out, in_", SHAPES)
@pytest.mark.parametrize("rows", ROWS)
def test_fp32_product_is_the_float64_product_to_float32_rounding(kernels, rows, out, in_):
    x, weight = fp32_inputs(rows, out, in_)
    y = kernels.fp32_linear(x, weight)
    exact = x.double() @ weight.double().T
    # Each sum of `in_` float32 products is off by at most ~in_ roundings of its terms' size.
    bound = 4 * in_ * torch.finfo(torch.float32).eps * (x.abs().double() @ weight.abs().double().T)
    assert y.shape == (rows, out) and y.dtype == torch.float32
    assert ((y.double() - exact).abs() <= bound).all()
    torch.testing.assert_close(y, x @ weight.T, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("out, in_", SHAPES[:3])
def test_fp32_row_has_the_same_bits_alone_and_in_any_batch(kernels, out, in_):
    x, weight = fp32_inputs(33, out, in_)
    alone = torch.cat([kernels.fp32_linear(row, weight) for row in x.split(1)])
    for rows in ROWS:
        assert torch.equal(kernels.fp32_linear(x[:rows], weight), alone[:rows]), rows
    assert torch.equal(kernels.fp32_linear(x[5:12], weight), alone[5:12])


def test_fp32_product_refuses_a_wrong_weight(kernels):
    with pytest.raises(RuntimeError, match="float32"):
        kernels.fp32_linear(torch.randn(2, 8), torch.randn(4, 8).double())
    with pytest.raises(RuntimeError, match="features"):
        kernels.fp32_linear(torch.randn(2, 9), torch.randn(4, 8))


@pytest.mark.parametrize("out, in_", SHAPES)
@pytest.mark.parametrize("rows", ROWS)
def test_int8_product_is_the_reference_bit_for_bit(rows, out, in_):
    generator = torch.Generator().manual_seed(rows * 1000 + out * 10 + in_)
    codes = torch.randint(-128, 128, (out, in_), dtype=torch.int8, generator=generator)
    scales = torch.rand(out, generator=generator) / 100
    x = torch.randn(rows, in_, generator=generator) * torch.rand(rows, 1, generator=generator) * 8
    x[-1] = x[-1].abs()  # a row without negatives: zero point 0
    y = ops.int8_linear(x, codes, scales, codes.sum(1, dtype=torch.int32))
    assert torch.equal(y, ops.int8_linear_reference(x, codes, scales))


def test_int8_product_is_exact_at_the_extremes_of_both_grids():
    """Activation codes 0 and 255 against weight codes -127 and 127: the largest products,
    where a saturating 16-bit pair sum (vpmaddubsw) would be wrong."""
    out, in_ = 8, 300
    codes = torch.full((out, in_), 127, dtype=torch.int8)
    codes[1::2] = -127
    codes[2, ::3] = -128
    scales = torch.full((out,), 1e-3)
    x = torch.where(torch.arange(in_) % 2 == 0, 1.0, -1.0).repeat(7, 1)  # codes 255 and 0
    x[3] = x[3].abs()
    y = ops.int8_linear(x, codes, scales, codes.sum(1, dtype=torch.int32))
    assert torch.equal(y, ops.int8_linear_reference(x, codes, scales))


def test_vector_paths_name_the_tiles(kernels):
    paths = kernels.vector_paths()
    assert paths["fp32"] in {"avx512-tile4x4", "avx2-tile3x4", "scalar"}
    assert paths["int8"] in {"avx512-vnni", "avx-vnni", "avx2-madd-tile2x4", "scalar"}
