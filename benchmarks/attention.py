"""Attention speed and memory: naive vs tiled (flash, PyTorch) vs SDPA; Triton vs SDPA on a GPU.

    python benchmarks/attention.py            # CPU table (always) + GPU table (if CUDA)
    python benchmarks/attention.py --cpu-lengths 1024 2048 4096 8192

CPU: causal attention with SmolLM2's shape (9 heads, 3 KV heads, head_dim 64), batch 1,
fp32. Peak memory is measured, not estimated: each call runs in a fresh process and we
report how much its peak resident memory grew (ru_maxrss) during the call.

GPU: the Triton kernel in minillm.kernels vs torch's scaled_dot_product_attention (flash
backend), fp16, batch 4, 32 heads (16 for head_dim 128), TFLOP/s as in the Triton tutorial
(causal counts half the FLOPs).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import torch

CPU_SHAPE = dict(heads=9, kv_heads=3, head_dim=64)


def _one_cpu_call(kind: str, n: int) -> dict:
    """Run one attention call in this process; report seconds and peak-memory growth."""
    import resource

    from minillm.attention.naive import naive_attention
    from minillm.attention.tiled import tiled_attention_with_lse
    from minillm.model import build_attention_mask

    torch.set_num_threads(2)
    torch.manual_seed(0)
    h, kvh, d = CPU_SHAPE["heads"], CPU_SHAPE["kv_heads"], CPU_SHAPE["head_dim"]
    q, k, v = torch.randn(1, h, n, d), torch.randn(1, kvh, n, d), torch.randn(1, kvh, n, d)
    steps = torch.arange(n)
    calls = {
        "naive": lambda: naive_attention(q, k, v, build_attention_mask(steps, steps)),
        "tiled": lambda: tiled_attention_with_lse(q, k, v, causal=True)[0],
        "sdpa": lambda: torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=True, enable_gqa=True),
    }
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    calls[kind]()
    seconds = time.perf_counter() - start
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    return {"seconds": seconds, "peak_mb": peak_kib / 1024}


def cpu_table(lengths: list[int]) -> None:
    print("CPU, fp32, causal, 9 heads / 3 KV heads, head_dim 64, batch 1, 2 threads")
    print("| N | naive s | tiled s | SDPA s | naive peak MB | tiled peak MB | SDPA peak MB "
          "| naive / tiled memory |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n in lengths:
        r = {kind: _in_subprocess(kind, n) for kind in ("naive", "tiled", "sdpa")}
        print(f"| {n} | {r['naive']['seconds']:.2f} | {r['tiled']['seconds']:.2f} | "
              f"{r['sdpa']['seconds']:.2f} | {r['naive']['peak_mb']:.0f} | "
              f"{r['tiled']['peak_mb']:.0f} | {r['sdpa']['peak_mb']:.0f} | "
              f"{r['naive']['peak_mb'] / max(r['tiled']['peak_mb'], 1):.0f}x |", flush=True)


def _in_subprocess(kind: str, n: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--one-call", kind, str(n)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


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
    parser.add_argument("--one-call", nargs=2, metavar=("KIND", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one_call:  # a fresh process measuring one call (see cpu_table)
        print(json.dumps(_one_cpu_call(args.one_call[0], int(args.one_call[1]))))
        return
    if not args.skip_cpu:
        cpu_table(args.cpu_lengths)
    if torch.cuda.is_available():
        gpu_table(args.gpu_lengths)
    else:
        print("\nno CUDA device: the Triton vs SDPA table needs a GPU")


if __name__ == "__main__":
    main()
