"""The W4A16 Triton kernel against a float64 reference, and QuantLinear's dispatch to it.

On a CPU the kernel runs in Triton's interpreter (TRITON_INTERPRET=1, set in conftest.py),
so the sizes here stay small. The reference is x @ Wᵀ in float64 with W the layer's own
dequantized weight (QuantLinear.dense_weight); only the kernel's arithmetic differs.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from minillm.quant.basic import QuantScheme
from minillm.quant.qlinear import QuantLinear

TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2}  # relative to max |y|


def quantized_layer(n: int, k: int, scheme: QuantScheme, seed: int = 0) -> QuantLinear:
    torch.manual_seed(seed)
    return QuantLinear.from_linear(nn.Linear(k, n, bias=False), scheme)


def group_of(layer: QuantLinear) -> int:
    return min(layer.scheme.group_size or layer.in_features, layer.in_features)


def check(layer: QuantLinear, x: torch.Tensor, **tile) -> None:
    from minillm.kernels.w4a16_matmul import w4a16_matmul

    y = w4a16_matmul(x, layer.codes, layer.scales, layer.zeros, group_of(layer), **tile)
    reference = x.double() @ layer.dense_weight().double().T
    assert y.dtype == x.dtype and y.shape == (*x.shape[:-1], layer.out_features)
    scale = reference.abs().max()
    torch.testing.assert_close(y.double() / scale, reference / scale,
                               atol=TOLERANCE[x.dtype], rtol=0)


CASES = [  # M, K, N, group size, BLOCK_N, BLOCK_K
    (1, 576, 40, 128, 16, 64),  # K = 4.5 groups (SmolLM2); N not a multiple of the tile
    (3, 576, 40, 128, 32, 128),  # the last K tile is half empty
    (17, 576, 24, 32, 16, 64),  # two M tiles; BLOCK_K spans two groups (gathered scales)
    (1, 64, 48, 64, 32, 32),
    (3, 64, 33, 16, 16, 32),
]


@pytest.mark.parametrize("m, k, n, group, block_n, block_k", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("symmetric", [False, True], ids=["asymmetric", "symmetric"])
def test_kernel_matches_float64_reference(m, k, n, group, block_n, block_k, dtype, symmetric):
    layer = quantized_layer(n, k, QuantScheme(4, symmetric, group))
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(dtype)
    check(layer, x, block_n=block_n, block_k=block_k)


def test_kernel_per_channel_scales_and_leading_dims():
    layer = quantized_layer(40, 64, QuantScheme(4, False, None))  # one group per row
    x = torch.randn(2, 3, 64, generator=torch.Generator().manual_seed(1))
    check(layer, x)  # the interpreter's default tile


def test_kernel_with_unrounded_zero_points():
    layer = quantized_layer(24, 128, QuantScheme(4, False, 32, float_zero=True))  # Q4_1-like
    assert (layer.zeros != layer.zeros.round()).any()
    check(layer, torch.randn(3, 128, generator=torch.Generator().manual_seed(2)))


def test_kernel_rejects_bad_arguments():
    from minillm.kernels.w4a16_matmul import w4a16_matmul

    layer = quantized_layer(8, 64, QuantScheme(4, False, 32))
    args = (layer.codes, layer.scales, layer.zeros)
    with pytest.raises(ValueError, match="float16 or float32"):
        w4a16_matmul(torch.randn(1, 64, dtype=torch.float64), *args, 32)
    with pytest.raises(ValueError, match="K = 2 x codes.shape"):
        w4a16_matmul(torch.randn(1, 63), *args, 32)
    with pytest.raises(ValueError, match="uint8"):
        w4a16_matmul(torch.randn(1, 64), layer.codes.to(torch.int8), *args[1:], 32)
    with pytest.raises(ValueError, match=r"scales must be .*\[8, 4\]"):
        w4a16_matmul(torch.randn(1, 64), layer.codes, layer.scales[:, :3], layer.zeros, 16)
    with pytest.raises(ValueError, match="group_size must be a positive"):
        w4a16_matmul(torch.randn(1, 64), *args, 0)
    with pytest.raises(ValueError, match="block_k must be a power of two"):
        w4a16_matmul(torch.randn(1, 64), *args, 32, block_k=48)


def test_quant_linear_stays_on_the_dequantize_path_on_cpu(monkeypatch):
    import minillm.kernels.w4a16_matmul as kernel

    def fail(*args, **kwargs):
        raise AssertionError("the Triton kernel must not run for CPU tensors")

    monkeypatch.setattr(kernel, "w4a16_matmul", fail)
    layer = quantized_layer(24, 64, QuantScheme(4, False, 32))
    x = torch.randn(2, 64)
    torch.testing.assert_close(layer(x), x @ layer.dense_weight().T)


@pytest.mark.parametrize("scheme, dispatched", [
    (QuantScheme(4, False, 32), True), (QuantScheme(4, True, None), True),
    (QuantScheme(4, False, per_tensor=True), False), (QuantScheme(3, True, 32), False),
    (QuantScheme(8, True, 32), False)],
    ids=str)
def test_quant_linear_dispatches_cuda_inputs_to_the_kernel(monkeypatch, scheme, dispatched):
    """Pretend the input lives on a GPU (``Tensor.is_cuda``) so forward takes its kernel
    branch, which the interpreter then runs; the result must not change."""
    import minillm.kernels.w4a16_matmul as kernel

    calls = []
    real = kernel.w4a16_matmul
    monkeypatch.setattr(kernel, "w4a16_matmul", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    torch.manual_seed(0)
    linear = nn.Linear(64, 24, bias=True)
    layer = QuantLinear.from_linear(linear, scheme)
    x = torch.randn(3, 64)
    with monkeypatch.context() as fake_gpu:
        fake_gpu.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
        y = layer(x)
    assert len(calls) == int(dispatched)
    expected = x.double() @ layer.dense_weight().double().T + linear.bias.double()
    torch.testing.assert_close(y.double(), expected, atol=1e-4, rtol=1e-4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("m", [1, 16, 100])
def test_kernel_on_gpu_matches_reference(m):
    layer = quantized_layer(4096 + 24, 576, QuantScheme(4, False, 128)).cuda()
    check(layer, torch.randn(m, 576, device="cuda", dtype=torch.float16))  # autotuned
