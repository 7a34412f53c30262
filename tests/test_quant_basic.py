"""Round-to-nearest quantization: error bounds, round trips, packing (property tests)."""

from __future__ import annotations

import pytest
import torch

from minillm.quant.basic import QuantScheme, clipping_mse, fake_quantize, half_rounded_up, quantize
from minillm.quant.packing import pack_bits, pack_int4, unpack_bits, unpack_int4

SCHEMES = [QuantScheme(bits, symmetric, group, per_tensor)
           for bits in (3, 4, 8) for symmetric in (True, False)
           for group, per_tensor in ((None, False), (32, False), (None, True))]


@pytest.mark.parametrize("scheme", SCHEMES, ids=str)
@pytest.mark.parametrize("seed", range(3))
def test_rounding_error_is_at_most_half_a_step(scheme, seed):
    w = torch.randn(16, 64, generator=torch.Generator().manual_seed(seed)) * (seed + 1)
    q = quantize(w, scheme)
    error = (q.dequantize() - w).abs()
    per_scale = w.numel() // q.scales.numel()  # weights sharing one scale (groups divide 64)
    step = q.scales[..., None].expand(*q.scales.shape, per_scale).reshape(w.shape)
    assert (error <= step / 2 + 1e-6).all()


@pytest.mark.parametrize("scheme", SCHEMES, ids=str)
def test_codes_stay_on_the_grid(scheme):
    q = quantize(torch.randn(8, 64, generator=torch.Generator().manual_seed(0)) * 5, scheme)
    if scheme.symmetric:
        limit = 2 ** (scheme.bits - 1) - 1
        assert q.codes.min() >= -limit and q.codes.max() <= limit
    else:
        assert q.codes.min() >= 0 and q.codes.max() <= 2**scheme.bits - 1


def test_values_on_the_grid_survive_exactly():
    scheme = QuantScheme(bits=4, symmetric=False, group_size=32)
    w = fake_quantize(torch.randn(4, 64, generator=torch.Generator().manual_seed(1)), scheme)
    torch.testing.assert_close(fake_quantize(w, scheme), w, atol=1e-6, rtol=0)


def test_more_bits_and_smaller_groups_mean_less_error():
    w = torch.randn(32, 256, generator=torch.Generator().manual_seed(2))
    def err(**kw):
        return (fake_quantize(w, QuantScheme(**kw)) - w).pow(2).mean().item()
    assert err(bits=8, group_size=None) < err(bits=4, group_size=None) < err(bits=3,
                                                                               group_size=None)
    assert err(bits=4, group_size=32) < err(bits=4, group_size=None) < err(bits=4,
                                                                              per_tensor=True)


def test_symmetric_keeps_zero_exact():
    w = torch.randn(4, 32)
    w[:, 5] = 0
    assert (fake_quantize(w, QuantScheme(bits=4, symmetric=True, group_size=None))[:, 5]
            == 0).all()


@pytest.mark.parametrize("seed", range(3))
def test_pack_unpack_round_trip_is_exact(seed):
    codes = torch.randint(0, 16, (7, 64), generator=torch.Generator().manual_seed(seed),
                          dtype=torch.uint8)
    packed = pack_int4(codes)
    assert packed.shape == (7, 32) and packed.dtype == torch.uint8
    assert torch.equal(unpack_int4(packed), codes)


def test_packing_rejects_bad_input():
    with pytest.raises(ValueError, match="even"):
        pack_int4(torch.zeros(3, dtype=torch.uint8))
    with pytest.raises(ValueError, match="between 0 and 15"):
        pack_int4(torch.full((2,), 16, dtype=torch.uint8))
    with pytest.raises(ValueError, match="bits"):
        QuantScheme(bits=1)


def test_a_shorter_last_group_is_quantized_on_its_own():
    w = torch.randn(3, 10, generator=torch.Generator().manual_seed(4))
    q = quantize(w, QuantScheme(bits=4, group_size=4))
    assert q.scales.shape == (3, 3)  # groups of 4, 4 and 2 columns
    tail = quantize(w[:, 8:], QuantScheme(bits=4, group_size=None))
    torch.testing.assert_close(q.dequantize()[:, 8:], tail.dequantize())


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 8])
def test_bit_stream_packing_round_trips_and_is_dense(bits):
    codes = torch.randint(0, 2**bits, (3, 64), generator=torch.Generator().manual_seed(bits),
                          dtype=torch.uint8)
    packed = pack_bits(codes, bits)
    assert packed.shape == (3, 64 * bits // 8)
    assert torch.equal(unpack_bits(packed, bits), codes)
    if bits == 4:  # the same layout as the two-per-byte packing the kernels read
        assert torch.equal(packed, pack_int4(codes))


def test_bit_stream_packing_rejects_codes_that_do_not_fill_bytes():
    with pytest.raises(ValueError, match="whole bytes"):
        pack_bits(torch.zeros(2, 5, dtype=torch.uint8), 3)
    with pytest.raises(ValueError, match="between 0 and 7"):
        pack_bits(torch.full((8,), 8, dtype=torch.uint8), 3)


def test_float_zero_reproduces_a_q4_1_grid_and_the_integer_zero_does_not():
    # llama.cpp Q4_1: every group of 32 is Δ q + min, its codes spanning 0..15
    g = torch.Generator().manual_seed(11)
    q = torch.randint(0, 16, (8, 2, 32), generator=g).float()
    q[..., 0], q[..., 1] = 0, 15
    step = torch.rand(8, 2, 1, generator=g) * 0.01 + 0.001
    low = -torch.rand(8, 2, 1, generator=g) * 0.1
    w = (q * step + low).reshape(8, 64)
    exact = fake_quantize(w, QuantScheme(4, False, 32, float_zero=True))
    assert (exact - w).abs().max() < 1e-6
    shifted = fake_quantize(w, QuantScheme(4, False, 32))  # z rounded: grid moves up to Δ/2
    assert (shifted - w).abs().max() > 1e-4


def test_clipping_the_range_lowers_the_error_when_a_few_weights_are_large():
    w = torch.randn(32, 256, generator=torch.Generator().manual_seed(12))
    w[:, 0] *= 6  # one large weight per row stretches the grid
    scheme = QuantScheme(bits=3, symmetric=True, group_size=None)
    ratios = torch.linspace(0.3, 1.0, 15)
    errors = clipping_mse(w, scheme, ratios)
    assert errors[-1] == pytest.approx((fake_quantize(w, scheme) - w).pow(2).mean().item())
    assert ratios[errors.argmin()] < 1 and errors.min() < 0.8 * errors[-1]
    clipped = quantize(w, QuantScheme(3, True, None, clip_ratio=0.5))
    assert clipped.codes.abs().max() <= 3  # clipped weights stay on the grid
    with pytest.raises(ValueError, match="clip_ratio"):
        QuantScheme(clip_ratio=0)


def test_half_rounded_up_never_shrinks_a_scale():
    x = torch.rand(1000, generator=torch.Generator().manual_seed(13)) * 1e-2 + 1e-4
    half = half_rounded_up(x)
    assert half.dtype == torch.float16 and (half.float() >= x).all()
    below = torch.nextafter(half, torch.zeros_like(half)).float()
    assert (below < x).all()  # the smallest fp16 value that is >= x
