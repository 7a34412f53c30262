// minillm's int8 x int8 product for the CPU: y = x W^T with x rounded to uint8 per row.
//
// The arithmetic is the one written out in Python in minillm/ops.py (activation_qparams,
// quantize_activations, int8_linear_reference; the math: minillm/quant/int8_activations.py),
// in the same order, so the two agree bit for bit (compiled with -ffp-contract=off: a fused
// multiply-add would round x / s + z once instead of twice). Per row of x:
//
//   s_x = (max(x, 0) - min(x, 0)) / 255,  z_x = round(-min(x, 0) / s_x)      (float64)
//   q_x = clamp(round(x * (1 / s_x) + z_x), 0, 255)                           (uint8)
//   y_o = float(sum_i q_x,i q_o,i - z_x sum_i q_o,i) * (s_x * s_o)           (int32 sums)
//
// The loop streams each weight row once, four rows at a time, with AVX-512 VNNI's
// dot-product instruction (64 byte pairs per instruction) when the CPU has it, AVX-VNNI's
// (32 pairs) on CPUs with the 256-bit form only, AVX2's 16-bit multiply-adds on tiles of
// several rows of x otherwise (int8_madd.h), and a plain loop without AVX2. Rows of x are
// taken in blocks, so a long prompt reuses each weight row from the cache for a whole block.
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
#elif defined(__AVXVNNI__)
#include <immintrin.h>
#define MINILLM_AVX_VNNI 1  // the 256-bit VNNI of CPUs without AVX-512 (Alder Lake, ...)
#elif defined(__AVX2__)
#include "int8_madd.h"
#define MINILLM_AVX2_MADD 1  // 16-bit multiply-adds in tiles of rows (AMD Zen 3, Haswell, ...)
#endif

namespace minillm {

constexpr int64_t kRowsPerBlock = 32;  // rows of x sharing one pass over the weights

#if defined(MINILLM_VNNI)
constexpr const char* kInt8Path = "avx512-vnni";
#elif defined(MINILLM_AVX_VNNI)
constexpr const char* kInt8Path = "avx-vnni";
#elif defined(MINILLM_AVX2_MADD)
constexpr const char* kInt8Path = "avx2-madd-tile2x4";
#else
constexpr const char* kInt8Path = "scalar";
#endif
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
#elif defined(MINILLM_AVX_VNNI)
  if (n % 32 == 0) {
    __m256i acc[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                      _mm256_setzero_si256()};
    for (int64_t i = 0; i < n; i += 32) {
      const __m256i activations = _mm256_loadu_si256((const __m256i*)(a + i));
      for (int k = 0; k < 4; ++k)
        acc[k] = _mm256_dpbusd_avx_epi32(
            acc[k], activations, _mm256_loadu_si256((const __m256i*)(b + k * n + i)));
    }
    for (int k = 0; k < 4; ++k) {  // the eight lanes' sum
      const __m128i pairs = _mm_add_epi32(_mm256_castsi256_si128(acc[k]),
                                          _mm256_extracti128_si256(acc[k], 1));
      const __m128i quads = _mm_add_epi32(pairs, _mm_shuffle_epi32(pairs, 0x4E));
      sums[k] = _mm_cvtsi128_si32(_mm_add_epi32(quads, _mm_shuffle_epi32(quads, 0xB1)));
    }
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

// Rows of x rounded to uint8, each with its scale and zero point: what every product with
// the same input shares (q, k and v quantize their input once).
struct Int8Activations {
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  std::vector<int32_t> zeros;
  int64_t rows, in;
#ifdef MINILLM_AVX2_MADD
  std::vector<int16_t> wide;  // the codes widened to int16, for vpmaddwd
#endif
};

inline Int8Activations int8_activations(const float* x, int64_t rows, int64_t in) {
  Int8Activations a{std::vector<uint8_t>(rows * in), std::vector<float>(rows),
                    std::vector<int32_t>(rows), rows, in};
  at::parallel_for(0, rows, kRowsPerBlock, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      quantize_row(x + r * in, in, &a.codes[r * in], &a.scales[r], &a.zeros[r]);
  });
#ifdef MINILLM_AVX2_MADD
  a.wide.assign(a.codes.begin(), a.codes.end());
#endif
  return a;
}

#ifdef MINILLM_AVX2_MADD
// Rows [first_row, last_row) x weight rows [o, o + 4): full tiles, then the rows left over;
// finish(row, weight row, sum) writes each output.
template <typename Finish>
inline void int8_tiles(const Int8Activations& a, const Int8Weights& w, int64_t o,
                       int64_t first_row, int64_t last_row, const Finish& finish) {
  const int64_t in = w.in;
  const int8_t* b = w.codes + o * in;
  int32_t sums[kInt8TileRows][4];
  int64_t r = first_row;
  auto finish_tile = [&](int rows) {
    for (int i = 0; i < rows; ++i)
      for (int k = 0; k < 4; ++k) finish(r + i, o + k, sums[i][k]);
    r += rows;
  };
  while (r + kInt8TileRows <= last_row) {
    int8_tile<kInt8TileRows>(&a.wide[r * in], in, b, in, sums);
    finish_tile(kInt8TileRows);
  }
  while (r + 2 <= last_row) {
    int8_tile<2>(&a.wide[r * in], in, b, in, sums);
    finish_tile(2);
  }
  while (r < last_row) {
    int8_tile<1>(&a.wide[r * in], in, b, in, sums);
    finish_tile(1);
  }
}
#endif

// Output columns [begin, end) of y = x W^T for every row: y points at this product's first
// column of a row-major [rows, y_stride] output (products sharing an input write side by
// side). One thread's share: it streams those weight rows once per block of x rows.
inline void int8_rows(const Int8Activations& a, const Int8Weights& w, int64_t begin,
                      int64_t end, float* y, int64_t y_stride) {
  const int64_t in = w.in, rows = a.rows;
  auto finish = [&](int64_t r, int64_t o, int32_t sum) {  // the zero point, then the scales
    y[r * y_stride + o] = float(sum - a.zeros[r] * w.code_sums[o]) *
                          (a.scales[r] * w.scales[o]);
  };
  for (int64_t first_row = 0; first_row < rows; first_row += kRowsPerBlock) {
    const int64_t last_row = std::min(rows, first_row + kRowsPerBlock);
    int64_t o = begin;
    for (; o + 4 <= end; o += 4) {
      if (o + kWeightRowsAhead + 4 <= w.out)
        prefetch(w.codes + (o + kWeightRowsAhead) * in, 4 * in);
#ifdef MINILLM_AVX2_MADD
      int8_tiles(a, w, o, first_row, last_row, finish);
#else
      for (int64_t r = first_row; r < last_row; ++r) {
        int32_t sums[4];
        dot4(&a.codes[r * in], w.codes + o * in, in, sums);
        for (int k = 0; k < 4; ++k) finish(r, o + k, sums[k]);
      }
#endif
    }
    for (; o < end; ++o)
      for (int64_t r = first_row; r < last_row; ++r)
        finish(r, o, dot(&a.codes[r * in], w.codes + o * in, in));
  }
}

// y [rows, out] = x [rows, in] W^T, x rounded per row as above.
inline void int8_product(const float* x, int64_t rows, const Int8Weights& w, float* y) {
  const Int8Activations a = int8_activations(x, rows, w.in);
  // Each thread takes a range of output rows (weight rows) and streams it once per block.
  at::parallel_for(0, w.out, 64, [&](int64_t begin, int64_t end) {
    int8_rows(a, w, begin, end, y, w.out);
  });
}

}  // namespace minillm
