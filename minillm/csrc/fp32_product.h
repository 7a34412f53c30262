// minillm's float32 product for the CPU: y = x W^T, W float32 [out, in] (nn.Linear's layout).
//
// A decode step multiplies a few rows of activations by every weight matrix, and streams
// each weight from memory once: the speed is the bandwidth at which the loop reads W.
// PyTorch's F.linear at batch 1 reads an [out, in] float32 weight at ~11-16 GB/s on the
// course's 2-core machines (docs/benchmarks.md), one core's worth; this loop reads four
// weight rows at a time with both cores (~50 GB/s on the AMD EPYC; software prefetching,
// which helps the int8 loop on an Intel Xeon, made it slower there at one row: 34 GB/s), and
// keeps a block of up to 32 activation rows per pass so a batched step reads each weight once.
// Several rows (a small batch, or the n tokens a speculative step verifies) go through
// register-blocked tiles, R rows x 4 weight rows (fp32_tile), so each weight vector is
// loaded once per R rows rather than once per row. Sums are fused multiply-adds over 16
// lanes (AVX-512) or 8 (AVX2), then a horizontal add: another summation order than MKL's,
// so results agree with PyTorch to float32 rounding, not bits.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>

#include "in_register.h"
#include "prefetch.h"

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

namespace minillm {

#if defined(__AVX512F__)
constexpr const char* kFp32Path = "avx512-tile4x4";  // activation rows x weight rows
#elif defined(__AVX2__) && defined(__FMA__)
constexpr const char* kFp32Path = "avx2-tile3x4";
#else
constexpr const char* kFp32Path = "scalar";
#endif

struct Fp32Weights {
  const float* weight;  // [out, in]
  int64_t out, in;
};

#if defined(__AVX512F__)
#define MINILLM_FP32_VECTOR 1
using Fp32Vector = __m512;
constexpr int64_t kFp32Lanes = 16;
constexpr int kFp32TileRows = 4;  // 16 accumulators, 4 activation vectors, 1 weight vector
inline __m512 zero_vector() { return _mm512_setzero_ps(); }
inline __m512 load_vector(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 fused_multiply_add(__m512 a, __m512 b, __m512 c) { return _mm512_fmadd_ps(a, b, c); }

// The sums of four vectors' sixteen lanes each, [Σa, Σb, Σc, Σd], in eight shuffles and
// adds (four separate reductions take about thirty): pairs of lanes within each 128-bit
// quarter first, then the four quarters.
inline __m128 reduce4(__m512 a, __m512 b, __m512 c, __m512 d) {
  const __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
  const __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
  const __m512d ab64 = _mm512_castps_pd(ab), cd64 = _mm512_castps_pd(cd);
  const __m512 quarters = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(ab64, cd64)),
                                        _mm512_castpd_ps(_mm512_unpackhi_pd(ab64, cd64)));
  const __m256 halves = _mm256_add_ps(
      _mm512_castps512_ps256(quarters),
      _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(quarters), 1)));
  return _mm_add_ps(_mm256_castps256_ps128(halves), _mm256_extractf128_ps(halves, 1));
}
#elif defined(__AVX2__) && defined(__FMA__)
#define MINILLM_FP32_VECTOR 1
using Fp32Vector = __m256;
constexpr int64_t kFp32Lanes = 8;
// 12 accumulators, 3 activation vectors and the weight vector in use fill the 16 registers:
// 7 loads per 12 multiply-adds.
constexpr int kFp32TileRows = 3;
inline __m256 zero_vector() { return _mm256_setzero_ps(); }
inline __m256 load_vector(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 fused_multiply_add(__m256 a, __m256 b, __m256 c) { return _mm256_fmadd_ps(a, b, c); }

// The sums of four vectors' eight lanes each, [Σa, Σb, Σc, Σd]: two rounds of pairwise
// horizontal adds leave [Σa, Σb, Σc, Σd] of lanes 0-3 and of lanes 4-7, then the halves.
inline __m128 reduce4(__m256 a, __m256 b, __m256 c, __m256 d) {
  const __m256 quads = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
  return _mm_add_ps(_mm256_castps256_ps128(quads), _mm256_extractf128_ps(quads, 1));
}
#else
constexpr int kFp32TileRows = 1;
#endif

// The dot products of R activation rows (a, a + a_stride, ...) with four weight rows (b,
// b + n, b + 2n, b + 3n): R x 4 accumulators, each weight vector loaded once for the R rows
// (a register-blocked tile, as in llamafile's tinyBLAS, without packing). Every (row, weight
// row) sum is accumulated in the same order whatever R is -- lanes of fused multiply-adds,
// reduce4, then the last n % lanes products one by one -- so a sequence's numbers do not
// depend on what else shares its batch.
template <int R>
inline void fp32_tile(const float* a, int64_t a_stride, const float* b, int64_t n,
                      float (*sums)[4]) {
  int64_t i = 0;
#ifdef MINILLM_FP32_VECTOR
  Fp32Vector acc[R][4];
  for (auto& row : acc)
    for (auto& v : row) v = zero_vector();
  for (; i + kFp32Lanes <= n; i += kFp32Lanes) {
    Fp32Vector x[R];
    for (int r = 0; r < R; ++r) {
      x[r] = load_vector(a + r * a_stride + i);
      keep_in_register(x[r]);
    }
    for (int k = 0; k < 4; ++k) {
      Fp32Vector w = load_vector(b + k * n + i);
      keep_in_register(w);
      for (int r = 0; r < R; ++r) acc[r][k] = fused_multiply_add(x[r], w, acc[r][k]);
    }
  }
  for (int r = 0; r < R; ++r)
    _mm_storeu_ps(sums[r], reduce4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]));
#else
  for (int r = 0; r < R; ++r)
    for (int k = 0; k < 4; ++k) sums[r][k] = 0.f;
#endif
  for (; i < n; ++i)
    for (int r = 0; r < R; ++r)
      for (int k = 0; k < 4; ++k) sums[r][k] += a[r * a_stride + i] * b[k * n + i];
}

// y[r .. r + R) x [o .. o + 4) of y = x W^T: one tile.
template <int R>
inline void fp32_tile_into(const float* x, int64_t r, const Fp32Weights& w, int64_t o,
                           float* y, int64_t y_stride) {
  float tile[R][4];
  fp32_tile<R>(x + r * w.in, w.in, w.weight + o * w.in, w.in, tile);
  for (int i = 0; i < R; ++i)
    for (int k = 0; k < 4; ++k) y[(r + i) * y_stride + o + k] = tile[i][k];
}

inline float fp32_dot(const float* a, const float* b, int64_t n) {
  float sum = 0.f;
  for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// Output columns [begin, end) of y = x W^T for every row (y: this product's first column of
// a row-major [rows, y_stride] output), each weight row streamed once per block of 32 rows.
inline void fp32_rows(const float* x, int64_t rows, const Fp32Weights& w, int64_t begin,
                      int64_t end, float* y, int64_t y_stride) {
  constexpr int64_t kRowsPerBlock = 32;
  const int64_t in = w.in;
  for (int64_t first_row = 0; first_row < rows; first_row += kRowsPerBlock) {
    const int64_t last_row = std::min(rows, first_row + kRowsPerBlock);
    // One row streams the weights as fast as the hardware prefetcher alone (asking for them
    // as well was slower); a tile's work between loads leaves it behind: asking for the
    // weight rows ahead took 5 rows from ~1.5 to ~1.15 times one row's time (AMD EPYC).
    const bool multiple_rows = last_row - first_row > 1;
    int64_t o = begin;
    for (; o + 4 <= end; o += 4) {  // full tiles, then the rows left over
      if (multiple_rows && o + kWeightRowsAhead + 4 <= w.out)
        prefetch(w.weight + (o + kWeightRowsAhead) * in, 4 * in * sizeof(float));
      int64_t r = first_row;
      for (; r + kFp32TileRows <= last_row; r += kFp32TileRows)
        fp32_tile_into<kFp32TileRows>(x, r, w, o, y, y_stride);
      for (; r + 2 <= last_row; r += 2) fp32_tile_into<2>(x, r, w, o, y, y_stride);
      for (; r < last_row; ++r) fp32_tile_into<1>(x, r, w, o, y, y_stride);
    }
    for (; o < end; ++o)
      for (int64_t r = first_row; r < last_row; ++r)
        y[r * y_stride + o] = fp32_dot(x + r * in, w.weight + o * in, in);
  }
}

// y [rows, out] = x [rows, in] W^T.
inline void fp32_product(const float* x, int64_t rows, const Fp32Weights& w, float* y) {
  at::parallel_for(0, w.out, 64, [&](int64_t begin, int64_t end) {
    fp32_rows(x, rows, w, begin, end, y, w.out);
  });
}

}  // namespace minillm
