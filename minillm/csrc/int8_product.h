// minillm's int8 x int8 product for the CPU: y = x W^T with x rounded to uint8 per row.
//
// The arithmetic is the one written out in Python in minillm/quant/int8_activations.py
// (activation_qparams, quantize_activations, Int8ActivationLinear.reference_product), in
// the same order, so the two agree bit for bit (compiled with -ffp-contract=off: a fused
// multiply-add would round x / s + z once instead of twice). Per row of x:
//
//   s_x = (max(x, 0) - min(x, 0)) / 255,  z_x = round(-min(x, 0) / s_x)      (float64)
//   q_x = clamp(round(x * (1 / s_x) + z_x), 0, 255)                           (uint8)
//   y_o = float(sum_i q_x,i q_o,i - z_x sum_i q_o,i) * (s_x * s_o)           (int32 sums)
//
// The loop streams each weight row once, four rows at a time, with AVX-512 VNNI's
// dot-product instruction (64 byte pairs per instruction) when the CPU has it, and a plain
// loop the compiler vectorizes otherwise. Rows of x are taken in blocks, so a long prompt
// reuses each weight row from the cache for a whole block.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "prefetch.h"

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#include <immintrin.h>
#define MINILLM_VNNI 1
#endif

namespace minillm {

constexpr int64_t kRowsPerBlock = 32;  // rows of x sharing one pass over the weights
constexpr float kSmallestScale = 6.1e-5f;

// sum_i a_i b_i, exact in int32 (|sum| <= n * 255 * 128: fine for n < 65,000).
inline int32_t dot(const uint8_t* a, const int8_t* b, int64_t n) {
  int32_t sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += int32_t(a[i]) * int32_t(b[i]);
  return sum;
}

// The dot products of a with four consecutive weight rows b, b + n, b + 2n, b + 3n.
inline void dot4(const uint8_t* a, const int8_t* b, int64_t n, int32_t* sums) {
#ifdef MINILLM_VNNI
  if (n % 64 == 0) {
    __m512i acc0 = _mm512_setzero_si512(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    for (int64_t i = 0; i < n; i += 64) {
      const __m512i activations = _mm512_loadu_si512(a + i);
      acc0 = _mm512_dpbusd_epi32(acc0, activations, _mm512_loadu_si512(b + i));
      acc1 = _mm512_dpbusd_epi32(acc1, activations, _mm512_loadu_si512(b + n + i));
      acc2 = _mm512_dpbusd_epi32(acc2, activations, _mm512_loadu_si512(b + 2 * n + i));
      acc3 = _mm512_dpbusd_epi32(acc3, activations, _mm512_loadu_si512(b + 3 * n + i));
    }
    sums[0] = _mm512_reduce_add_epi32(acc0);
    sums[1] = _mm512_reduce_add_epi32(acc1);
    sums[2] = _mm512_reduce_add_epi32(acc2);
    sums[3] = _mm512_reduce_add_epi32(acc3);
    return;
  }
#endif
  for (int k = 0; k < 4; ++k) sums[k] = dot(a, b + k * n, n);
}

// One row's uint8 grid and codes (activation_qparams and quantize_activations in Python).
inline void quantize_row(const float* x, int64_t n, uint8_t* codes, float* scale,
                         int32_t* zero) {
  float low = 0.f, high = 0.f;
  for (int64_t i = 0; i < n; ++i) {
    low = std::min(low, x[i]);
    high = std::max(high, x[i]);
  }
  const double range_scale = high > low ? (double(high) - double(low)) / 255.0 : 0.1;
  const double zero_point = std::clamp(std::nearbyint(-double(low) / range_scale), 0.0, 255.0);
  const float s = std::max(float(range_scale), kSmallestScale);
  const float inverse = 1.f / s, z = float(zero_point);
  for (int64_t i = 0; i < n; ++i)
    codes[i] = uint8_t(std::clamp(std::nearbyint(x[i] * inverse + z), 0.f, 255.f));
  *scale = s;
  *zero = int32_t(zero_point);
}

// An int8 weight matrix: codes [out, in], a scale per row, and sum_i q_o,i per row.
struct Int8Weights {
  const int8_t* codes;
  const float* scales;
  const int32_t* code_sums;
  int64_t out, in;
};

// y [rows, out] = x [rows, in] W^T, x rounded per row as above.
inline void int8_product(const float* x, int64_t rows, const Int8Weights& w, float* y) {
  const int64_t in = w.in, out = w.out;
  std::vector<uint8_t> x_codes(rows * in);
  std::vector<float> x_scales(rows);
  std::vector<int32_t> x_zeros(rows);
  at::parallel_for(0, rows, kRowsPerBlock, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      quantize_row(x + r * in, in, &x_codes[r * in], &x_scales[r], &x_zeros[r]);
  });
  auto finish = [&](int64_t r, int64_t o, int32_t sum) {  // the zero point, then the scales
    y[r * out + o] = float(sum - x_zeros[r] * w.code_sums[o]) * (x_scales[r] * w.scales[o]);
  };
  // Each thread takes a range of output rows (weight rows) and streams it once per block.
  at::parallel_for(0, out, 64, [&](int64_t begin, int64_t end) {
    int32_t sums[4];
    for (int64_t first_row = 0; first_row < rows; first_row += kRowsPerBlock) {
      const int64_t last_row = std::min(rows, first_row + kRowsPerBlock);
      int64_t o = begin;
      for (; o + 4 <= end; o += 4) {
        if (o + kWeightRowsAhead + 4 <= out)
          prefetch(w.codes + (o + kWeightRowsAhead) * in, 4 * in);
        for (int64_t r = first_row; r < last_row; ++r) {
          dot4(&x_codes[r * in], w.codes + o * in, in, sums);
          for (int k = 0; k < 4; ++k) finish(r, o + k, sums[k]);
        }
      }
      for (; o < end; ++o)
        for (int64_t r = first_row; r < last_row; ++r)
          finish(r, o, dot(&x_codes[r * in], w.codes + o * in, in));
    }
  });
}

}  // namespace minillm
