"""minillm's C++ kernels for the CPU (``minillm/csrc``), built on first use.

Four pieces, measured against what PyTorch offers (``docs/benchmarks.md``):

* ``minillm::int8_linear`` (``int8_linear.cpp``, ``int8_product.h``): int8 weights times
  activations rounded to uint8 per row, the product of :mod:`minillm.quant.int8_activations`;
* ``minillm::w4a8_linear`` (``w4a8_linear.cpp``, ``int4_product.h``): int4 weights in
  groups times activations rounded to int8 per row (:mod:`minillm.quant.w4a8`);
* ``minillm::paged_decode_attention`` (``paged_attention.cpp``): a decode step's attention
  over the paged KV pool, for the compiled executor;

  these three are torch ops, so a ``torch.compile`` graph can call them; their schemas and
  shape functions are below;
* ``DecodeLayers`` (``decode_layers.cpp``): a whole decode step through every block, for
  the native executor (:mod:`minillm.serve.executors.native`).

PyTorch's extension loader compiles them with the machine's C++ compiler (g++ and ninja)
for the CPU it runs on (``-march=native``: AVX-512 VNNI, or the 256-bit AVX-VNNI, where
there is one) and caches the library under ``~/.cache/torch_extensions``: ~30 s the first
time, instant afterwards. The cache entry is named after a hash of the CPU's instruction
set flags: a library built for one CPU is never loaded on another (a shared home, a Docker
layer, a CI cache), where an instruction it lacks would kill the process.

Without a compiler, or when the build fails, every op runs its Python reference (the same
numbers, bit for bit, only slower) after one warning that says what to install; the
native executor and compiled steps are then unavailable and the engine runs eagerly.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import warnings
from pathlib import Path

import torch

SOURCES = Path(__file__).with_name("csrc")
SOURCE_FILES = ["int8_linear.cpp", "w4a8_linear.cpp", "paged_attention.cpp",
                "decode_layers.cpp"]
# -ffp-contract=off: no fused multiply-adds, so x * (1 / s) + z rounds as it does in PyTorch.
FLAGS = ["-O3", "-march=native", "-ffp-contract=off", "-fopenmp"]

# The ops' schemas and shape functions, so torch.compile can put them in a compiled graph;
# their CPU implementations are registered when the C++ library is loaded (or, without
# one, the Python references: :func:`_register_references`).
_LIBRARY = torch.library.Library("minillm", "DEF")
_LIBRARY.define("int8_linear(Tensor x, Tensor codes, Tensor scales, Tensor code_sums) -> Tensor")
_LIBRARY.define("w4a8_linear(Tensor x, Tensor codes, Tensor scales, Tensor zeros) -> Tensor")
# Writes k and v into the pools (in place: the (a!) and (b!) marks), then attends.
_LIBRARY.define("paged_decode_attention(Tensor q, Tensor k, Tensor v, Tensor(a!) key_pool, "
                "Tensor(b!) value_pool, Tensor slots, Tensor block_tables, Tensor context_lens)"
                " -> Tensor")


@torch.library.register_fake("minillm::int8_linear")
def _int8_linear_shape(x, codes, scales, code_sums):
    return x.new_empty(*x.shape[:-1], codes.shape[0])


@torch.library.register_fake("minillm::w4a8_linear")
def _w4a8_linear_shape(x, codes, scales, zeros):
    return x.new_empty(*x.shape[:-1], codes.shape[0])


@torch.library.register_fake("minillm::paged_decode_attention")
def _paged_decode_attention_shape(q, k, v, key_pool, value_pool, slots, block_tables,
                                  context_lens):
    return torch.empty_like(q)


def cpu_flags() -> list[str]:
    """The CPU's instruction-set flags (Linux's /proc/cpuinfo), or, elsewhere, the
    platform's description of the processor."""
    try:
        with open("/proc/cpuinfo") as info:
            line = next(line for line in info if line.startswith("flags"))
        return sorted(line.split(":", 1)[1].split())
    except (OSError, StopIteration):
        return [platform.machine(), platform.processor()]


def build_name(flags: list[str], extra_flags: list[str]) -> str:
    """The cache entry of a library built for a CPU with ``flags`` (and these compiler
    flags): another CPU, another entry."""
    digest = hashlib.sha256(" ".join([*flags, "|", *extra_flags]).encode()).hexdigest()
    return f"minillm_native_{digest[:12]}"


def compiler_flags() -> list[str]:
    """``FLAGS``, with ``$MINILLM_NATIVE_CFLAGS`` appended (e.g. ``-mno-avx512f``, to build
    the 256-bit path on a CPU that also has AVX-512: the tests do)."""
    return FLAGS + os.environ.get("MINILLM_NATIVE_CFLAGS", "").split()


@functools.cache
def native_kernels():
    """The compiled module (``DecodeLayers``, ``vector_paths``); loading it registers the
    ops. None when it cannot be built: the ops then run their Python references."""
    from torch.utils.cpp_extension import load

    flags = compiler_flags()
    try:
        module = load(build_name(cpu_flags(), flags), [str(SOURCES / f) for f in SOURCE_FILES],
                      extra_cflags=flags, extra_ldflags=["-fopenmp"])
    except (OSError, RuntimeError, ImportError) as error:
        warnings.warn(
            f"minillm's C++ kernels could not be built ({_first_line(error)}); int8 and int4 "
            "products run their Python reference (the same numbers, much slower) and "
            "decode steps run eagerly. Install a C++ compiler and ninja to build them "
            "(Debian: apt-get install g++; pip install ninja).", RuntimeWarning, stacklevel=2)
        _register_references()
        return None
    paths = module.vector_paths()
    if "vnni" not in paths["int8"]:
        warnings.warn(f"this CPU has no VNNI dot-product instructions: int8 and int4 products "
                      f"run a plain loop (several times slower); kernels: {paths}",
                      RuntimeWarning, stacklevel=2)
    return module


def _first_line(error: Exception) -> str:
    return next((line for line in str(error).splitlines() if line.strip()), type(error).__name__)


def _register_references() -> None:
    """The ops' CPU implementations when there is no C++ library: their readable
    references (:mod:`minillm.quant.int8_activations`, :mod:`minillm.quant.w4a8`,
    :mod:`minillm.attention.paged`)."""
    from .attention.paged import paged_decode_reference
    from .quant.int8_activations import int8_linear_reference
    from .quant.w4a8 import w4a8_linear_reference

    _LIBRARY.impl("int8_linear", int8_linear_reference, "CPU")
    _LIBRARY.impl("w4a8_linear", w4a8_linear_reference, "CPU")
    _LIBRARY.impl("paged_decode_attention", paged_decode_reference, "CPU")
