"""Measure the time and peak memory of one attention call, in a fresh process.

PyTorch reports peak memory only for GPUs, so on a CPU we measure the operating system's
view: a background thread samples the process's resident memory (``/proc/self/statm``)
every fraction of a millisecond during the call, and we report the peak minus the level
just before it. Large tensors are mapped and unmapped directly by the allocator, so they
show up and disappear in that number. Each measurement runs in a fresh process.
Used by chapter 05 and ``benchmarks/attention.py``.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time

import torch

from .naive import naive_attention
from .tiled import tiled_attention_with_lse

KINDS = ("naive", "tiled", "sdpa")


def _call(kind: str, n: int, heads: int, kv_heads: int, head_dim: int) -> tuple[float, float]:
    torch.set_num_threads(2)
    torch.manual_seed(0)
    q = torch.randn(1, heads, n, head_dim)
    k, v = torch.randn(1, kv_heads, n, head_dim), torch.randn(1, kv_heads, n, head_dim)
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    calls = {
        "naive": lambda: naive_attention(q, k, v, causal),
        "tiled": lambda: tiled_attention_with_lse(q, k, v, causal=True)[0],
        "sdpa": lambda: torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=True, enable_gqa=True),
    }
    calls[kind]()  # warm-up: first-call allocations (thread pools, kernels) are not attention's
    baseline, peak = _resident_bytes(), [0]
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], _resident_bytes())
            time.sleep(0.0002)

    sampler = threading.Thread(target=sample)
    sampler.start()
    start = time.perf_counter()
    calls[kind]()
    seconds = time.perf_counter() - start
    done.set()
    sampler.join()
    return seconds, max(peak[0] - baseline, 0) / 2**20


def _resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def measure(kind: str, n: int, heads: int = 9, kv_heads: int = 3,
            head_dim: int = 64) -> tuple[float, float]:
    """(seconds, peak MB above the inputs) of one causal attention call of length ``n``.

    The boolean causal mask for ``naive`` is built before measuring (it is an input).
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(_call, (kind, n, heads, kv_heads, head_dim))
