"""Chapter 17: the CPU decode step — an int8 GEMV of your own, in C++, inside the engine.

The lab is :func:`int8_gemv_source`: the C++ text of the product that W8A8 layers compute
(:mod:`minillm.quant.int8_activations`). The rest of this file is given: it compiles your
source once (:mod:`minillm.inline_cpp`), calls it on tensors (:func:`int8_gemv`), and
wraps it in a layer the engine runs (:class:`YourInt8Linear`, :func:`with_your_gemv`).
"""

from __future__ import annotations

import ctypes

import torch

from minillm import ops
from minillm.inline_cpp import compile_cpp, pointer
from minillm.quant.int8_activations import Int8ActivationLinear
from minillm.transform import copy_modules


def int8_gemv_source() -> str:
    """Exercise 17.1: an int8 GEMV in C++ — the integer product of a W8A8 layer.

    Return the C++ source (a string) of one function with C linkage and exactly this
    signature (only standard headers and ``<immintrin.h>``; no torch headers)::

        extern "C" void int8_gemv(const uint8_t* x_codes,  // [rows, in], row-major
                                  const float* x_scales,   // [rows]
                                  const int32_t* x_zeros,  // [rows], each in [0, 255]
                                  const int8_t* w_codes,   // [out, in], row-major
                                  const float* w_scales,   // [out]
                                  float* y,                // [rows, out], row-major: write
                                  int64_t rows, int64_t out, int64_t in);

    It must write, for every row r and output o::

        y[r, o] = float(S) * (x_scales[r] * w_scales[o]),
        S = sum over k of (x_codes[r, k] - x_zeros[r]) * w_codes[o, k]

    with S computed exactly in integers (int32 holds it: |S| <= in * 255 * 128 for
    ``in`` < 65,000) and only then turned into a float, times the two scales in float32.
    This is the library's W8A8 product, ``minillm::int8_linear``, after it has rounded each
    row of activations to uint8 codes with its own scale and zero point
    (:func:`minillm.ops.quantize_activations`); each output row of the weights has a
    symmetric int8 code row and a scale (per-channel). Rows of x are tokens: a decode step
    at batch 1 has one, a prompt many.

    Invariants the grader checks, on shapes and values you do not see:

    * equal to a float64 reference within float32 rounding, for any ``in`` >= 1 (not only
      multiples of your vector width), ``out`` >= 1 and ``rows`` >= 1;
    * no overflow on the extremes: codes 255 with zero point 0, or codes 0 with zero point
      255, against weights of -128 or 127 everywhere, over 1,536 inputs;
    * a zero scale gives exact zeros, not NaN;
    * one block of SmolLM2 computed with your function writes the same greedy tokens as the
      library's.

    Speed is up to you, and timed in the notebook against the library's kernel: the
    compiler gets ``-O3 -march=native -fopenmp``; ``#pragma omp parallel for`` uses torch's
    threads, and ``#if defined(__AVX2__)`` guards code that needs AVX2.

    Hints: chapter 17, section 2 (why a byte-by-byte product is slow and what the vector
    instructions do, incl. which of them saturate in int16) and the lab section; the
    library's kernel is ``minillm/csrc/int8_product.h``.
    """
    ### BEGIN SOLUTION
    return r"""
#include <cstdint>
#include <vector>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace {

// sum over k in [begin, n) of a[k] w[k]: a is a row of activation codes minus their zero
// point (int16: -255..255), w a weight row; exact in int32.
int32_t dot_from(const int16_t* a, const int8_t* w, int64_t begin, int64_t n) {
  int32_t sum = 0;
  for (int64_t k = begin; k < n; ++k) sum += int32_t(a[k]) * int32_t(w[k]);
  return sum;
}

#if defined(__AVX2__)
// 16 products per step: the weights widened to int16, then vpmaddwd multiplies int16 pairs
// and adds each pair into an int32 lane (no saturation; vpmaddubsw would saturate at 32767).
int32_t dot(const int16_t* a, const int8_t* w, int64_t n) {
  __m256i acc = _mm256_setzero_si256();
  int64_t k = 0;
  for (; k + 16 <= n; k += 16) {
    const __m256i weights = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(w + k)));
    const __m256i codes = _mm256_loadu_si256((const __m256i*)(a + k));
    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(codes, weights));
  }
  __m128i lanes = _mm_add_epi32(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
  lanes = _mm_add_epi32(lanes, _mm_shuffle_epi32(lanes, 0x4E));
  lanes = _mm_add_epi32(lanes, _mm_shuffle_epi32(lanes, 0xB1));
  return _mm_cvtsi128_si32(lanes) + dot_from(a, w, k, n);  // and the tail
}
#else
int32_t dot(const int16_t* a, const int8_t* w, int64_t n) { return dot_from(a, w, 0, n); }
#endif

}  // namespace

extern "C" void int8_gemv(const uint8_t* x_codes, const float* x_scales,
                          const int32_t* x_zeros, const int8_t* w_codes,
                          const float* w_scales, float* y, int64_t rows, int64_t out,
                          int64_t in) {
  std::vector<int16_t> centred(in);  // one row of activations minus its zero point
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t k = 0; k < in; ++k)
      centred[k] = int16_t(int32_t(x_codes[r * in + k]) - x_zeros[r]);
    const int16_t* a = centred.data();
    const float x_scale = x_scales[r];
    float* y_row = y + r * out;
#pragma omp parallel for schedule(static)
    for (int64_t o = 0; o < out; ++o)
      y_row[o] = float(dot(a, w_codes + o * in, in)) * (x_scale * w_scales[o]);
  }
}
"""
    ### END SOLUTION


def int8_gemv(x_codes: torch.Tensor, x_scales: torch.Tensor, x_zeros: torch.Tensor,
              w_codes: torch.Tensor, w_scales: torch.Tensor) -> torch.Tensor:
    """Your kernel on tensors: x_codes uint8 [rows, in], x_scales float32 [rows], x_zeros
    int32 [rows], w_codes int8 [out, in], w_scales float32 [out] -> y float32 [rows, out].
    Compiles :func:`int8_gemv_source` the first time (a second or two; cached by content)."""
    rows, width = _checked(x_codes, torch.uint8, 2, "x_codes").shape
    out, in_features = _checked(w_codes, torch.int8, 2, "w_codes").shape
    if width != in_features:
        raise ValueError(f"x_codes has {width} features, w_codes {in_features}")
    for name, tensor, dtype, size in [("x_scales", x_scales, torch.float32, rows),
                                      ("x_zeros", x_zeros, torch.int32, rows),
                                      ("w_scales", w_scales, torch.float32, out)]:
        if _checked(tensor, dtype, 1, name).numel() != size:
            raise ValueError(f"{name} needs {size} entries, not {tensor.numel()}")
    y = torch.empty(rows, out, dtype=torch.float32)
    kernel = compile_cpp(int8_gemv_source(), "ch17_int8_gemv").int8_gemv
    kernel(pointer(x_codes), pointer(x_scales), pointer(x_zeros), pointer(w_codes),
           pointer(w_scales), pointer(y), ctypes.c_int64(rows), ctypes.c_int64(out),
           ctypes.c_int64(in_features))
    return y


def _checked(tensor: torch.Tensor, dtype: torch.dtype, dims: int, name: str) -> torch.Tensor:
    """``tensor`` if it is a contiguous CPU tensor of ``dtype`` with ``dims`` dimensions."""
    if tensor.dtype != dtype or tensor.dim() != dims or tensor.device.type != "cpu" or \
            not tensor.is_contiguous():
        raise ValueError(f"{name} must be a contiguous {dims}-d {dtype} CPU tensor, not "
                         f"{tuple(tensor.shape)} {tensor.dtype} on {tensor.device}")
    return tensor


class YourInt8Linear(Int8ActivationLinear):
    """A W8A8 layer whose product is your kernel: the same weights, each input row rounded
    to uint8 by the library (:func:`minillm.ops.quantize_activations`), then
    :func:`int8_gemv`. The engine runs it in eager steps (its native step knows only the
    library's layers)."""

    @classmethod
    def of(cls, layer: Int8ActivationLinear) -> YourInt8Linear:
        return cls(layer.codes, layer.scales, layer.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1]).float()
        codes, scale, zero = ops.quantize_activations(rows)
        y = int8_gemv(codes.to(torch.uint8).contiguous(), scale.reshape(-1).contiguous(),
                      zero.reshape(-1).to(torch.int32).contiguous(), self.codes.contiguous(),
                      self.scales.contiguous())
        y = y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)
        return y if self.bias is None else y + self.bias.to(y.dtype)


def with_your_gemv(model: torch.nn.Module, prefix: str = "layers.0.") -> torch.nn.Module:
    """A copy of ``model`` (which is left as it is) whose W8A8 layers named ``prefix...``
    run your kernel: by default the seven products of SmolLM2's first block."""
    names = [name for name, module in model.named_modules()
             if name.startswith(prefix) and type(module) is Int8ActivationLinear]
    if not names:
        raise ValueError(f"no W8A8 layer (Int8ActivationLinear) is named {prefix}...: make "
                         "one with minillm.quant.int8_activations.to_int8_activations")
    yours = copy_modules(model)
    for name in names:
        yours.set_submodule(name, YourInt8Linear.of(model.get_submodule(name)))
    return yours

