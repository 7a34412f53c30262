"""Plausible wrong int8 GEMVs for chapter 17's lab: C++ sources the graded tests must reject.

Most are a plain loop with one mistake (:func:`_plain_kernel`); two are vector kernels with
the mistakes vectorising invites. Each distinct source is compiled once (a second or two).
"""

from __future__ import annotations

SIGNATURE = """extern "C" void int8_gemv(const uint8_t* x_codes, const float* x_scales,
                          const int32_t* x_zeros, const int8_t* w_codes,
                          const float* w_scales, float* y, int64_t rows, int64_t out,
                          int64_t in)"""


def _plain_kernel(accumulator: str = "int32_t", activation: str = "x_codes[r * in + k] - "
                  "x_zeros[r]", weight: str = "w_codes[o * in + k]",
                  result: str = "float(sum) * (x_scales[r] * w_scales[o])") -> str:
    """A row-by-row loop; each argument is one of its expressions, as the solution has it
    by default."""
    return f"""
#include <cmath>
#include <cstdint>

{SIGNATURE} {{
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < out; ++o) {{
      {accumulator} sum = 0;
      for (int64_t k = 0; k < in; ++k)
        sum += int32_t({activation}) * int32_t({weight});
      y[r * out + o] = {result};
    }}
}}
"""


def int8_gemv_source__int16_accumulator():
    """Sums the products in int16: past 32,767 the sum wraps around."""
    return _plain_kernel(accumulator="int16_t")


def int8_gemv_source__saturating_maddubs():
    """Multiplies bytes with vpmaddubsw, whose pairs of products saturate at int16's 32,767."""
    return """
#include <algorithm>
#include <cstdint>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace {
// sum_k x[k] w[k] as vpmaddubsw computes it: each adjacent pair of products saturated to int16.
int32_t dot(const uint8_t* x, const int8_t* w, int64_t n) {
  int32_t sum = 0;
  int64_t k = 0;
#if defined(__AVX2__)
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i acc = _mm256_setzero_si256();
  for (; k + 32 <= n; k += 32) {
    const __m256i pairs = _mm256_maddubs_epi16(_mm256_loadu_si256((const __m256i*)(x + k)),
                                               _mm256_loadu_si256((const __m256i*)(w + k)));
    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, ones));
  }
  alignas(32) int32_t lanes[8];
  _mm256_store_si256((__m256i*)lanes, acc);
  for (int lane = 0; lane < 8; ++lane) sum += lanes[lane];
#endif
  for (; k + 2 <= n; k += 2)
    sum += std::clamp(int32_t(x[k]) * w[k] + int32_t(x[k + 1]) * w[k + 1], -32768, 32767);
  if (k < n) sum += int32_t(x[k]) * w[k];
  return sum;
}
}  // namespace

""" + SIGNATURE + """ {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < out; ++o) {
      const int8_t* w = w_codes + o * in;
      int32_t weight_sum = 0;
      for (int64_t k = 0; k < in; ++k) weight_sum += w[k];
      const int32_t sum = dot(x_codes + r * in, w, in) - x_zeros[r] * weight_sum;
      y[r * out + o] = float(sum) * (x_scales[r] * w_scales[o]);
    }
}
"""


def int8_gemv_source__tail_dropped():
    """Unrolls the inner loop by 8 and forgets the last in % 8 inputs."""
    return """
#include <cstdint>

""" + SIGNATURE + """ {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < out; ++o) {
      const uint8_t* x = x_codes + r * in;
      const int8_t* w = w_codes + o * in;
      int32_t sum = 0;
      for (int64_t k = 0; k + 8 <= in; k += 8)
        for (int j = 0; j < 8; ++j) sum += (int32_t(x[k + j]) - x_zeros[r]) * w[k + j];
      y[r * out + o] = float(sum) * (x_scales[r] * w_scales[o]);
    }
}
"""


def int8_gemv_source__missing_weight_scale():
    """Scales by the activation's scale only: each output row's weight scale is missing."""
    return _plain_kernel(result="float(sum) * x_scales[r]")


def int8_gemv_source__transposed_weight():
    """Reads the weights as [in, out] (row stride out, not in): the transposed matrix."""
    return _plain_kernel(weight="w_codes[k * out + o]")


def int8_gemv_source__per_tensor_activation_scale():
    """Uses the first row's activation scale and zero point for every row (per tensor)."""
    return _plain_kernel(activation="x_codes[r * in + k] - x_zeros[0]",
                         result="float(sum) * (x_scales[0] * w_scales[o])")


def int8_gemv_source__zero_point_ignored():
    """Multiplies the uint8 codes themselves, without subtracting the row's zero point."""
    return _plain_kernel(activation="x_codes[r * in + k]")


def int8_gemv_source__rounded_result():
    """Rounds the scaled result to an integer, as if y were integer codes too."""
    return _plain_kernel(result="std::nearbyint(float(sum) * (x_scales[r] * w_scales[o]))")

