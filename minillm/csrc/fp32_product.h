// minillm's float32 product for the CPU: y = x W^T, W float32 [out, in] (nn.Linear's layout).
//
// A decode step multiplies a few rows of activations by every weight matrix, and streams
// each weight from memory once: the speed is the bandwidth at which the loop reads W.
// PyTorch's F.linear at batch 1 reads an [out, in] float32 weight at ~11-16 GB/s on the
// course's 2-core machines (docs/benchmarks.md), one core's worth; this loop reads four
// weight rows at a time with both cores (~50 GB/s on the AMD EPYC; software prefetching,
// which helps the int8 loop on an Intel Xeon, made it slower there: 34 GB/s), and keeps a
// block of up to 32 activation rows per pass so a batched step reads each weight once. Sums are
// fused multiply-adds over 16 lanes (AVX-512) or 8 (AVX2), then a horizontal add: another
// summation order than MKL's, so results agree with PyTorch to float32 rounding, not bits.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>


#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

namespace minillm {

#if defined(__AVX512F__)
constexpr const char* kFp32Path = "avx512";
#elif defined(__AVX2__) && defined(__FMA__)
constexpr const char* kFp32Path = "avx2";
#else
constexpr const char* kFp32Path = "scalar";
#endif

struct Fp32Weights {
  const float* weight;  // [out, in]
  int64_t out, in;
};

#if defined(__AVX512F__)
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
#endif

// sum_i a_i b_i for four rows b, b + n, b + 2n, b + 3n.
inline void fp32_dot4(const float* a, const float* b, int64_t n, float* sums) {
  int64_t i = 0;
  float tail[4] = {0.f, 0.f, 0.f, 0.f};
#if defined(__AVX512F__)
  __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
  for (; i + 16 <= n; i += 16) {
    const __m512 x = _mm512_loadu_ps(a + i);
    acc0 = _mm512_fmadd_ps(x, _mm512_loadu_ps(b + i), acc0);
    acc1 = _mm512_fmadd_ps(x, _mm512_loadu_ps(b + n + i), acc1);
    acc2 = _mm512_fmadd_ps(x, _mm512_loadu_ps(b + 2 * n + i), acc2);
    acc3 = _mm512_fmadd_ps(x, _mm512_loadu_ps(b + 3 * n + i), acc3);
  }
  _mm_storeu_ps(tail, reduce4(acc0, acc1, acc2, acc3));
#elif defined(__AVX2__) && defined(__FMA__)
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                   _mm256_setzero_ps()};
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(a + i);
    for (int k = 0; k < 4; ++k)
      acc[k] = _mm256_fmadd_ps(x, _mm256_loadu_ps(b + k * n + i), acc[k]);
  }
  for (int k = 0; k < 4; ++k) {
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, acc[k]);
    for (float lane : lanes) tail[k] += lane;
  }
#endif
  for (; i < n; ++i)
    for (int k = 0; k < 4; ++k) tail[k] += a[i] * b[k * n + i];
  for (int k = 0; k < 4; ++k) sums[k] = tail[k];
}

#if defined(__AVX512F__)
// The dot products of four activation rows (a, a + a_stride, ...) with four weight rows:
// sixteen accumulators, each weight vector loaded once for the four rows. Every (row,
// weight row) sum is accumulated exactly as fp32_dot4 accumulates it, so a sequence's
// numbers do not depend on what else shares its batch.
inline void fp32_tile4x4(const float* a, int64_t a_stride, const float* b, int64_t n,
                         float (*sums)[4]) {
  __m512 acc[4][4];
  for (auto& row : acc)
    for (auto& v : row) v = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 w[4] = {_mm512_loadu_ps(b + i), _mm512_loadu_ps(b + n + i),
                         _mm512_loadu_ps(b + 2 * n + i), _mm512_loadu_ps(b + 3 * n + i)};
    for (int r = 0; r < 4; ++r) {
      const __m512 x = _mm512_loadu_ps(a + r * a_stride + i);
      for (int k = 0; k < 4; ++k) acc[r][k] = _mm512_fmadd_ps(x, w[k], acc[r][k]);
    }
  }
  for (int r = 0; r < 4; ++r)
    _mm_storeu_ps(sums[r], reduce4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]));
  for (; i < n; ++i)
    for (int r = 0; r < 4; ++r)
      for (int k = 0; k < 4; ++k) sums[r][k] += a[r * a_stride + i] * b[k * n + i];
}
#endif

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
  float sums[4];
  for (int64_t first_row = 0; first_row < rows; first_row += kRowsPerBlock) {
    const int64_t last_row = std::min(rows, first_row + kRowsPerBlock);
    int64_t o = begin;
    for (; o + 4 <= end; o += 4) {
      int64_t r = first_row;
#if defined(__AVX512F__)
      for (float tile[4][4]; r + 4 <= last_row; r += 4) {
        fp32_tile4x4(x + r * in, in, w.weight + o * in, in, tile);
        for (int i = 0; i < 4; ++i)
          for (int k = 0; k < 4; ++k) y[(r + i) * y_stride + o + k] = tile[i][k];
      }
#endif
      for (; r < last_row; ++r) {
        fp32_dot4(x + r * in, w.weight + o * in, in, sums);
        for (int k = 0; k < 4; ++k) y[r * y_stride + o + k] = sums[k];
      }
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
