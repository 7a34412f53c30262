"""minillm's C++ kernels for the CPU (``minillm/csrc``), built on first use.

Three pieces, measured against what PyTorch offers (``docs/benchmarks.md``):

* ``minillm::int8_linear`` (``int8_linear.cpp``, ``int8_product.h``): int8 weights times
  activations rounded to uint8 per row, the product of :mod:`minillm.quant.int8_activations`.
* ``minillm::w4a8_linear`` (``w4a8_linear.cpp``, ``int4_product.h``): int4 weights in
  groups times activations rounded to int8 per row (:mod:`minillm.quant.w4a8`).

  Both are torch ops, so a ``torch.compile`` graph can call them; their shape functions
  are below.
* ``DecodeLayers`` (``decode_layers.cpp``): a whole one-token step through every block, for
  :mod:`minillm.native_decode`.

PyTorch's extension loader compiles them with the machine's C++ compiler (g++ and ninja)
for the CPU it runs on (``-march=native``: AVX-512 VNNI where there is one) and caches the
library under ``~/.cache/torch_extensions``: ~30 s the first time, instant afterwards.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

SOURCES = Path(__file__).with_name("csrc")
SOURCE_FILES = ["int8_linear.cpp", "w4a8_linear.cpp", "decode_layers.cpp"]
# -ffp-contract=off: no fused multiply-adds, so x * (1 / s) + z rounds as it does in PyTorch.
FLAGS = ["-O3", "-march=native", "-ffp-contract=off", "-fopenmp"]

# The op's schema and shape function, so torch.compile can put it in a compiled graph; its
# CPU implementation is registered when the C++ library is loaded.
_LIBRARY = torch.library.Library("minillm", "DEF")
_LIBRARY.define("int8_linear(Tensor x, Tensor codes, Tensor scales, Tensor code_sums) -> Tensor")
_LIBRARY.define("w4a8_linear(Tensor x, Tensor codes, Tensor scales, Tensor zeros) -> Tensor")


@torch.library.register_fake("minillm::int8_linear")
def _int8_linear_shape(x, codes, scales, code_sums):
    return x.new_empty(*x.shape[:-1], codes.shape[0])


@torch.library.register_fake("minillm::w4a8_linear")
def _w4a8_linear_shape(x, codes, scales, zeros):
    return x.new_empty(*x.shape[:-1], codes.shape[0])


@functools.cache
def native_kernels():
    """The compiled module (``DecodeLayers``); loading it registers ``minillm::int8_linear``."""
    from torch.utils.cpp_extension import load

    try:
        return load("minillm_native", [str(SOURCES / name) for name in SOURCE_FILES],
                    extra_cflags=FLAGS, extra_ldflags=["-fopenmp"])
    except (OSError, RuntimeError) as error:
        raise RuntimeError(
            f"minillm's C++ kernels could not be built: {error}. They need a C++ compiler "
            "(g++) and ninja; without them, run int8 weights without int8 activations "
            "(no --int8-activations).") from error
