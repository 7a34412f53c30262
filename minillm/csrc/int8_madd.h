// The int8 product's multi-row tile for AVX2 CPUs without VNNI (int8_product.h).
//
// Without a byte dot-product instruction, the exact way to multiply the uint8 activations
// (a zero point shifts them to [0, 255]) by the int8 weights is in 16 bits: `vpmaddubsw`
// multiplies bytes directly but saturates the sum of two products at 32,767, and
// 255 * 127 * 2 = 64,770 overflows it. So each activation row is widened to int16 once per
// product (Int8Activations::wide), each weight vector is widened once per tile (16 codes,
// `vpmovsxbw`), and `vpmaddwd` sums pairs of 16-bit products into int32 lanes: exact, so the
// sums are the scalar loop's bit for bit, in any order. A tile is R activation rows x four
// weight rows, R x 4 accumulators in registers: each weight vector is loaded and widened
// once for the R rows. The multiply-adds (16 products per vpmaddwd and vpaddd) still grow
// with the rows: without VNNI, n rows stay compute-bound and cost well over one row's time.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "in_register.h"

namespace minillm {

// 8 accumulators, 2 activation vectors, the weight vector in use and a product: 12 of the
// 16 registers. Three rows (12 accumulators) spill to the stack and were no faster.
constexpr int kInt8TileRows = 2;

// The sums of four vectors' eight int32 lanes, [Σa, Σb, Σc, Σd].
inline __m128i reduce4_int32(__m256i a, __m256i b, __m256i c, __m256i d) {
  const __m256i quads = _mm256_hadd_epi32(_mm256_hadd_epi32(a, b), _mm256_hadd_epi32(c, d));
  return _mm_add_epi32(_mm256_castsi256_si128(quads), _mm256_extracti128_si256(quads, 1));
}

// sum_i a_r,i b_k,i for R activation rows (int16: a, a + a_stride, ...) and four weight rows
// (b, b + n, b + 2n, b + 3n).
template <int R>
inline void int8_tile(const int16_t* a, int64_t a_stride, const int8_t* b, int64_t n,
                      int32_t (*sums)[4]) {
  __m256i acc[R][4];
  for (auto& row : acc)
    for (auto& v : row) v = _mm256_setzero_si256();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256i x[R];
    for (int r = 0; r < R; ++r) {
      x[r] = _mm256_loadu_si256((const __m256i*)(a + r * a_stride + i));
      keep_in_register(x[r]);
    }
    for (int k = 0; k < 4; ++k) {
      const __m256i w = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(b + k * n + i)));
      for (int r = 0; r < R; ++r) acc[r][k] = _mm256_add_epi32(acc[r][k], _mm256_madd_epi16(x[r], w));
    }
  }
  for (int r = 0; r < R; ++r)
    _mm_storeu_si128((__m128i*)sums[r], reduce4_int32(acc[r][0], acc[r][1], acc[r][2], acc[r][3]));
  for (; i < n; ++i)
    for (int r = 0; r < R; ++r)
      for (int k = 0; k < 4; ++k) sums[r][k] += int32_t(a[r * a_stride + i]) * b[k * n + i];
}

}  // namespace minillm
