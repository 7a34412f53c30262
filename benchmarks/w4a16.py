"""W4A16 dequant-matmul: the Triton kernel vs an fp16 cuBLAS matmul, on a GPU.

    python benchmarks/w4a16.py                 # GPU table if CUDA, else an interpreter check
    python benchmarks/w4a16.py --batches 1 4 16 64

GPU: y = x @ Wᵀ with W [N, K] either dense fp16 (``x @ w.T``, cuBLAS) or 4-bit asymmetric
group-128 codes with fp16 scales/zeros (``minillm.kernels.w4a16_matmul``), x fp16
[batch, K]. Times from ``triton.testing.do_bench`` (median, after autotuning); GB/s counts
the bytes each must read and write (weights + x + y), so at batch 1 it is the achieved
memory bandwidth. The issue's goal: >= 2x over fp16 at batch 1 on 4096 x 4096.

CPU: timing means nothing in Triton's interpreter, so the script checks the kernel's
results against a float64 reference on small shapes instead.
"""

from __future__ import annotations

import argparse
import os

import torch

if not torch.cuda.is_available():  # the kernel then runs in Triton's interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

GROUP = 128
SHAPES = {  # name: (N, K) = (out_features, in_features)
    "4096 x 4096": (4096, 4096),
    "SmolLM2 q/o_proj": (576, 576),
    "SmolLM2 k/v_proj": (192, 576),
    "SmolLM2 gate/up_proj": (1536, 576),
    "SmolLM2 down_proj": (576, 1536),
}


def quantized_weight(n: int, k: int, device: str):
    """A random [n, k] weight as a 4-bit g128 QuantLinear (codes, scales, zeros), on device."""
    from torch import nn

    from minillm.quant.basic import QuantScheme
    from minillm.quant.qlinear import QuantLinear

    torch.manual_seed(0)
    return QuantLinear.from_linear(nn.Linear(k, n, bias=False),
                                   QuantScheme(4, False, GROUP)).to(device)


def relative_error(y: torch.Tensor, x: torch.Tensor, layer) -> float:
    reference = x.double() @ layer.dense_weight().double().T
    return ((y.double() - reference).abs().max() / reference.abs().max()).item()


def gpu_row(name: str, n: int, k: int, batch: int) -> str:
    from triton.testing import do_bench

    from minillm.kernels.w4a16_matmul import w4a16_matmul

    layer = quantized_weight(n, k, "cuda")
    weight = layer.dense_weight().half()  # the dense fp16 baseline, same values
    x = torch.randn(batch, k, device="cuda", dtype=torch.float16)
    group = min(GROUP, k)
    ours = lambda: w4a16_matmul(x, layer.codes, layer.scales, layer.zeros, group)  # noqa: E731
    error = relative_error(ours(), x, layer)  # also autotunes before timing
    dense_ms = do_bench(lambda: x @ weight.T)
    ours_ms = do_bench(ours)
    io = 2 * batch * (k + n)  # x read, y written (fp16)
    dense_bytes = weight.nbytes + io
    ours_bytes = layer.codes.nbytes + layer.scales.nbytes + layer.zeros.nbytes + io
    return (f"| {name} | {batch} | {1e3 * dense_ms:.1f} | {1e3 * ours_ms:.1f} | "
            f"{dense_bytes / dense_ms * 1e-6:.0f} | {ours_bytes / ours_ms * 1e-6:.0f} | "
            f"{dense_ms / ours_ms:.2f}x | {error:.1e} |")


def gpu_table(batches: list[int]) -> None:
    print(f"GPU: {torch.cuda.get_device_name()}, fp16 activations, W4 asymmetric g{GROUP}")
    print("| shape (N x K) | batch | fp16 cuBLAS µs | W4A16 µs | fp16 GB/s | W4A16 GB/s "
          "| speedup | max rel. error |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for batch in batches:
        for name, (n, k) in SHAPES.items():
            print(gpu_row(name, n, k, batch), flush=True)


def interpreter_check() -> None:
    from minillm.kernels.w4a16_matmul import w4a16_matmul

    print("no CUDA device: timing needs a GPU. Checking the kernel in Triton's interpreter:")
    print("| N x K | batch | dtype | max rel. error vs float64 |")
    print("|---|---:|---|---:|")
    for (n, k), batch, dtype in [((40, 576), 1, torch.float32), ((40, 576), 17, torch.float32),
                                 ((192, 576), 1, torch.float16), ((64, 256), 16, torch.float16)]:
        layer = quantized_weight(n, k, "cpu")
        x = torch.randn(batch, k, generator=torch.Generator().manual_seed(batch)).to(dtype)
        y = w4a16_matmul(x, layer.codes, layer.scales, layer.zeros, min(GROUP, k))
        print(f"| {n} x {k} | {batch} | {str(dtype).removeprefix('torch.')} | "
              f"{relative_error(y, x, layer):.1e} |", flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    args = parser.parse_args(argv)
    if torch.cuda.is_available():
        gpu_table(args.batches)
    else:
        interpreter_check()


if __name__ == "__main__":
    main()
