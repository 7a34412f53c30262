"""Attention speed and memory: naive vs tiled (flash, PyTorch) vs SDPA; Triton vs SDPA on a GPU.

    python benchmarks/attention.py            # CPU table (always) + GPU table (if CUDA)
    python benchmarks/attention.py --cpu-lengths 1024 2048 4096 8192

CPU: causal attention with SmolLM2's shape (9 heads, 3 KV heads, head_dim 64), batch 1,
fp32. Peak memory is measured, not estimated: each call runs in a fresh process and we
report how much its peak resident memory grew (ru_maxrss) during the call
(minillm.attention.peak_memory).

GPU: the Triton kernel in minillm.kernels vs torch's scaled_dot_product_attention (flash
backend), fp16, batch 4, 32 heads (16 for head_dim 128), TFLOP/s as in the Triton tutorial
(causal counts half the FLOPs).
"""

from __future__ import annotations

import argparse

import torch

from minillm.attention.peak_memory import measure

CPU_SHAPE = dict(heads=9, kv_heads=3, head_dim=64)


def cpu_table(lengths: list[int]) -> None:
    print("CPU, fp32, causal, 9 heads / 3 KV heads, head_dim 64, batch 1, 2 threads")
    print("| N | naive s | tiled s | SDPA s | naive peak MB | tiled peak MB | SDPA peak MB "
          "| naive / tiled memory |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n in lengths:
        (naive_s, naive_mb), (tiled_s, tiled_mb), (sdpa_s, sdpa_mb) = (
            measure(kind, n, **CPU_SHAPE) for kind in ("naive", "tiled", "sdpa"))
        print(f"| {n} | {naive_s:.2f} | {tiled_s:.2f} | {sdpa_s:.2f} | {naive_mb:.0f} | "
              f"{tiled_mb:.0f} | {sdpa_mb:.0f} | {naive_mb / max(tiled_mb, 1):.0f}x |", flush=True)


def _gpu_tflops(d: int, heads: int, causal: bool, n: int) -> tuple[float, float]:
    """(Triton, SDPA flash) TFLOP/s for one shape, fp16, batch 4."""
    import triton

    from minillm.kernels.flash_attention import flash_attention

    q, k, v = (torch.randn(4, heads, n, d, device="cuda", dtype=torch.float16) for _ in range(3))
    flops = 4 * 4 * heads * n * n * d * (0.5 if causal else 1.0)
    ours = triton.testing.do_bench(lambda: flash_attention(q, k, v, causal=causal))
    flash = torch.nn.attention.SDPBackend.FLASH_ATTENTION
    with torch.nn.attention.sdpa_kernel(flash):
        theirs = triton.testing.do_bench(
            lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal))
    return flops / ours * 1e-9, flops / theirs * 1e-9


def gpu_table(lengths: list[int]) -> None:
    print(f"GPU: {torch.cuda.get_device_name()}, fp16, batch 4")
    print("| head_dim | causal | N | Triton TFLOP/s | SDPA (flash) TFLOP/s | Triton / SDPA |")
    print("|---:|---|---:|---:|---:|---:|")
    for d in (64, 128):
        for causal in (False, True):
            for n in lengths:
                ours, theirs = _gpu_tflops(d, 2048 // d, causal, n)
                print(f"| {d} | {causal} | {n} | {ours:.0f} | {theirs:.0f} | "
                      f"{ours / theirs:.2f} |", flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu-lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096,
                                                                        8192])
    parser.add_argument("--gpu-lengths", type=int, nargs="+",
                        default=[1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--skip-cpu", action="store_true")
    args = parser.parse_args(argv)
    if not args.skip_cpu:
        cpu_table(args.cpu_lengths)
    if torch.cuda.is_available():
        gpu_table(args.gpu_lengths)
    else:
        print("\nno CUDA device: the Triton vs SDPA table needs a GPU")


if __name__ == "__main__":
    main()
