// minillm's int4 x int8 product for the CPU (W4A8): y = x W^T with x rounded to int8 per row.
//
// The weights are minillm's int4 decode layout (minillm/quant/weight_only.py): per output
// row o and group g of inputs, codes q in [0, 15] packed two per byte within the group (low
// nibbles: the group's first half, high nibbles: its second half), an fp16 scale s_og and
// an fp16 zero point z_og, so w = s_og (q - z_og) (GGUF's Q4_1). Each row of x is rounded to
// symmetric int8, x ~ s_x c with c in [-127, 127] (llama.cpp's Q8 activations). Then
//
//   y_o = s_x sum_g s_og (S_og - z_og C_g),   S_og = sum_{i in g} q_i c_i,  C_g = sum_{i in g} c_i
//
// with S and C exact integer sums (minillm/quant/w4a8.py writes it out in float64). With
// AVX-512 VNNI and groups of 32, two groups are one 32-byte load, two nibble masks and two
// dot-product instructions over 32 byte pairs each; four weight rows share each activation
// load, and the float work (scales, zero points) is done eight groups at a time.
#pragma once

#include <ATen/Parallel.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "prefetch.h"

// The vector path needs 256-bit VNNI dot products: AVX-512 VNNI's (with VL), or AVX-VNNI's,
// which is the same instruction for CPUs without AVX-512.
#if defined(__AVX512VNNI__) && defined(__AVX512VL__) && defined(__F16C__) && defined(__FMA__)
#include <immintrin.h>
#define MINILLM_VNNI_256 1
#define MINILLM_DPBUSD_256 _mm256_dpbusd_epi32
constexpr const char* kInt4Path = "avx512-vnni";
#elif defined(__AVXVNNI__) && defined(__F16C__) && defined(__FMA__)
#include <immintrin.h>
#define MINILLM_VNNI_256 1
#define MINILLM_DPBUSD_256 _mm256_dpbusd_avx_epi32
constexpr const char* kInt4Path = "avx-vnni";
#else
constexpr const char* kInt4Path = "scalar";
#endif

namespace minillm {

// An int4 weight matrix in the decode layout: codes [out, groups, group / 2] bytes,
// scales and zero points [out, groups] fp16.
struct Int4Weights {
  const uint8_t* codes;
  const c10::Half* scales;
  const c10::Half* zeros;
  int64_t out, in, group;
};

// One row's symmetric int8 codes: s = max|x| / 127 (1 for an all-zero row), c = round(x / s).
inline void quantize_row_symmetric(const float* x, int64_t n, int8_t* codes, float* scale) {
  float largest = 0.f;
  for (int64_t i = 0; i < n; ++i) largest = std::max(largest, std::abs(x[i]));
  const float s = largest > 0.f ? largest / 127.f : 1.f;
  const float inverse = 1.f / s;
  for (int64_t i = 0; i < n; ++i)
    codes[i] = int8_t(std::clamp(std::nearbyint(x[i] * inverse), -127.f, 127.f));
  *scale = s;
}

// sum_g s_og (S_og - z_og C_g) for one weight row o, any even group size.
inline float int4_row(const Int4Weights& w, int64_t o, const int8_t* c,
                      const int32_t* group_sums) {
  const int64_t groups = w.in / w.group, half = w.group / 2;
  float total = 0.f;
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* packed = w.codes + (o * groups + g) * half;
    const int8_t* a = c + g * w.group;
    int32_t sum = 0;
    for (int64_t j = 0; j < half; ++j)
      sum += int32_t(packed[j] & 15) * a[j] + int32_t(packed[j] >> 4) * a[half + j];
    const float s = float(w.scales[o * groups + g]), z = float(w.zeros[o * groups + g]);
    total += s * (float(sum) - z * float(group_sums[g]));
  }
  return total;
}

#ifdef MINILLM_VNNI_256
// A row's activation codes laid out for pairs of groups of 32 (groups g and g + 1 as one
// 64-byte vector): [c_g[0:16], c_g+1[0:16], c_g[16:32], c_g+1[16:32]], the order in which
// one 32-byte load of the two groups' packed codes unpacks (low nibbles, then high ones).
inline std::vector<int8_t> pair_groups(const int8_t* c, int64_t groups) {
  std::vector<int8_t> paired(groups * 32);
  for (int64_t pair = 0; pair < groups / 2; ++pair) {
    const int8_t* first = c + pair * 64;
    int8_t* out = &paired[pair * 64];
    std::copy(first, first + 16, out);
    std::copy(first + 32, first + 48, out + 16);
    std::copy(first + 16, first + 32, out + 32);
    std::copy(first + 48, first + 64, out + 48);
  }
  return paired;
}

// S_og and S_o,g+1 of one pair of groups as eight int32 lanes (lanes 0-3: quarter sums of
// group g, lanes 4-7: of g + 1): one 32-byte load, two nibble masks, two dot products.
inline __m256i pair_dots(const uint8_t* packed_pair, const int8_t* paired_activations) {
  const __m256i low_nibbles = _mm256_set1_epi8(0x0F);
  const __m256i packed = _mm256_loadu_si256((const __m256i*)packed_pair);
  const __m256i low = _mm256_and_si256(packed, low_nibbles);
  const __m256i high = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low_nibbles);
  const __m256i first = _mm256_loadu_si256((const __m256i*)paired_activations);
  const __m256i second = _mm256_loadu_si256((const __m256i*)(paired_activations + 32));
  return MINILLM_DPBUSD_256(MINILLM_DPBUSD_256(_mm256_setzero_si256(), low, first), high,
                            second);
}

inline float sum_lanes(__m256 v) {
  const __m128 pairs = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 quads = _mm_add_ps(pairs, _mm_movehl_ps(pairs, pairs));
  return _mm_cvtss_f32(_mm_add_ss(quads, _mm_shuffle_ps(quads, quads, 1)));
}

// sum_g s_og (S_og - z_og C_g) for four consecutive weight rows, groups of 32. Eight groups
// at a time: two rounds of horizontal adds turn four pairs' lanes into one sum per group,
// in the order [g0, g2, g4, g6, g1, g3, g5, g7], and the scales, zero points and C_g are
// permuted to match. A last pair, if any, is summed on its own.
inline void int4_rows4_paired(const Int4Weights& w, int64_t o, const int8_t* paired,
                              const float* group_sums, float* totals) {
  const int64_t groups = w.in / 32;
  const __m256i hadd_order = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
  if (o + kWeightRowsAhead + 4 <= w.out) {
    const int64_t at = (o + kWeightRowsAhead) * groups;
    prefetch(w.codes + at * 16, 4 * groups * 16);
    prefetch(w.scales + at, 4 * groups * 2);
    prefetch(w.zeros + at, 4 * groups * 2);
  }
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                   _mm256_setzero_ps()};
  int64_t g = 0;
  for (; g + 8 <= groups; g += 8) {
    const __m256 c = _mm256_permutevar8x32_ps(_mm256_loadu_ps(group_sums + g), hadd_order);
    for (int k = 0; k < 4; ++k) {
      const int64_t at = (o + k) * groups + g;
      __m256i dots[4];
      for (int pair = 0; pair < 4; ++pair)
        dots[pair] = pair_dots(w.codes + (at + 2 * pair) * 16, paired + (g + 2 * pair) * 32);
      const __m256i sums = _mm256_hadd_epi32(_mm256_hadd_epi32(dots[0], dots[1]),
                                             _mm256_hadd_epi32(dots[2], dots[3]));
      const __m256 s = _mm256_permutevar8x32_ps(
          _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(w.scales + at))), hadd_order);
      const __m256 z = _mm256_permutevar8x32_ps(
          _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(w.zeros + at))), hadd_order);
      acc[k] = _mm256_fmadd_ps(s, _mm256_fnmadd_ps(z, c, _mm256_cvtepi32_ps(sums)), acc[k]);
    }
  }
  for (int k = 0; k < 4; ++k) totals[k] = sum_lanes(acc[k]);
  for (; g < groups; g += 2)  // the last pairs
    for (int k = 0; k < 4; ++k) {
      const int64_t at = (o + k) * groups + g;
      const __m256i dots = pair_dots(w.codes + at * 16, paired + g * 32);
      const __m256i twice = _mm256_hadd_epi32(dots, dots);
      const __m256i sums = _mm256_hadd_epi32(twice, twice);  // lane 0: S_g, lane 4: S_g+1
      const int32_t first = _mm256_cvtsi256_si32(sums), second = _mm256_extract_epi32(sums, 4);
      totals[k] += float(w.scales[at]) * (float(first) - float(w.zeros[at]) * group_sums[g]) +
                   float(w.scales[at + 1]) *
                       (float(second) - float(w.zeros[at + 1]) * group_sums[g + 1]);
    }
}
#endif

// Rows of x rounded to symmetric int8, with what the products need of them: each row's
// scale and group sums C_g, and (VNNI, groups of 32) the codes laid out for pairs of groups.
// Products that share an input (q, k and v) share this.
struct Int4Activations {
  std::vector<int8_t> codes;
  std::vector<float> scales;
  std::vector<int32_t> group_sums;
  int64_t rows, in, group;
#ifdef MINILLM_VNNI_256
  bool paired;  // groups of 32, an even number of them: the vector path applies
  std::vector<std::vector<int8_t>> paired_codes;
  std::vector<float> float_group_sums;
#endif
};

inline Int4Activations int4_activations(const float* x, int64_t rows, int64_t in,
                                        int64_t group) {
  const int64_t groups = in / group;
  Int4Activations a;
  a.codes.resize(rows * in);
  a.scales.resize(rows);
  a.group_sums.assign(rows * groups, 0);
  a.rows = rows, a.in = in, a.group = group;
  for (int64_t r = 0; r < rows; ++r) {
    quantize_row_symmetric(x + r * in, in, &a.codes[r * in], &a.scales[r]);
    for (int64_t i = 0; i < in; ++i) a.group_sums[r * groups + i / group] += a.codes[r * in + i];
  }
#ifdef MINILLM_VNNI_256
  a.paired = group == 32 && groups % 2 == 0;
  a.float_group_sums.assign(a.group_sums.begin(), a.group_sums.end());
  for (int64_t r = 0; a.paired && r < rows; ++r)
    a.paired_codes.push_back(pair_groups(&a.codes[r * in], groups));
#endif
  return a;
}

// Output columns [begin, end) of y = x W^T for every row (y: this product's first column of
// a row-major [rows, y_stride] output). Weight rows go in blocks of 64, each block used by
// every row of x while it is in the cache.
inline void int4_rows(const Int4Activations& a, const Int4Weights& w, int64_t begin,
                      int64_t end, float* y, int64_t y_stride) {
  const int64_t groups = w.in / w.group;
  for (int64_t block = begin; block < end; block += 64) {
    const int64_t block_end = std::min(end, block + 64);
    for (int64_t r = 0; r < a.rows; ++r) {
      int64_t o = block;
#ifdef MINILLM_VNNI_256
      for (float totals[4]; a.paired && o + 4 <= block_end; o += 4) {
        int4_rows4_paired(w, o, a.paired_codes[r].data(), &a.float_group_sums[r * groups],
                          totals);
        for (int k = 0; k < 4; ++k) y[r * y_stride + o + k] = a.scales[r] * totals[k];
      }
#endif
      for (; o < block_end; ++o)
        y[r * y_stride + o] = a.scales[r] * int4_row(w, o, &a.codes[r * w.in],
                                                     &a.group_sums[r * groups]);
    }
  }
}

// y [rows, out] = x [rows, in] W^T, each row of x rounded to int8 as above.
inline void int4_product(const float* x, int64_t rows, const Int4Weights& w, float* y) {
  const Int4Activations a = int4_activations(x, rows, w.in, w.group);
  at::parallel_for(0, w.out, 64, [&](int64_t begin, int64_t end) {
    int4_rows(a, w, begin, end, y, w.out);
  });
}

}  // namespace minillm
