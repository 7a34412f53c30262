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
// AVX-512 VNNI and groups of 32, two groups are one 32-byte load, two nibble masks and one
// dot-product instruction over 64 byte pairs; four weight rows share each activation load.
#pragma once

#include <ATen/Parallel.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX512VNNI__) && defined(__AVX512F__) && defined(__F16C__)
#include <immintrin.h>
#define MINILLM_VNNI_512 1
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

#ifdef MINILLM_VNNI_512
// Activations laid out for pairs of groups of 32 (groups g and g + 1 as one 64-byte vector):
// [c_g[0:16], c_g+1[0:16], c_g[16:32], c_g+1[16:32]], the order in which one 32-byte load of
// the two groups' packed codes unpacks (low nibbles, then high nibbles); and per pair, C_g / 8
// on the lanes whose dot products belong to group g (lanes 0-3 and 8-11), C_g+1 / 8 on the
// others, so the zero-point term can be subtracted lane by lane.
struct PairedActivations {
  std::vector<int8_t> codes;
  std::vector<float> group_sums;  // [pairs, 16]
};

inline PairedActivations pair_groups(const int8_t* c, const int32_t* group_sums, int64_t groups) {
  PairedActivations paired{std::vector<int8_t>(groups * 32), std::vector<float>(groups / 2 * 16)};
  for (int64_t pair = 0; pair < groups / 2; ++pair) {
    const int8_t* first = c + pair * 64;
    int8_t* out = &paired.codes[pair * 64];
    std::copy(first, first + 16, out);
    std::copy(first + 32, first + 48, out + 16);
    std::copy(first + 16, first + 32, out + 32);
    std::copy(first + 48, first + 64, out + 48);
    for (int lane = 0; lane < 16; ++lane)
      paired.group_sums[pair * 16 + lane] = float(group_sums[2 * pair + (lane / 4) % 2]) / 8.f;
  }
  return paired;
}

// sum_g s_og (S_og - z_og C_g) for four consecutive weight rows, groups of 32 in pairs.
inline void int4_rows4_paired(const Int4Weights& w, int64_t o, const PairedActivations& a,
                              float* totals) {
  const int64_t groups = w.in / 32;
  const __m256i low_nibbles = _mm256_set1_epi8(0x0F);
  const __m512i spread = _mm512_set_epi32(1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0);
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                   _mm512_setzero_ps()};
  for (int64_t pair = 0; pair < groups / 2; ++pair) {
    const __m512i activations = _mm512_loadu_si512(&a.codes[pair * 64]);
    const __m512 sums_over_8 = _mm512_loadu_ps(&a.group_sums[pair * 16]);
    for (int k = 0; k < 4; ++k) {
      const int64_t at = (o + k) * groups + 2 * pair;  // the pair's first group
      const __m256i packed = _mm256_loadu_si256((const __m256i*)(w.codes + at * 16));
      const __m512i codes = _mm512_inserti64x4(
          _mm512_castsi256_si512(_mm256_and_si256(packed, low_nibbles)),
          _mm256_and_si256(_mm256_srli_epi16(packed, 4), low_nibbles), 1);
      const __m512i dots = _mm512_dpbusd_epi32(_mm512_setzero_si512(), codes, activations);
      int32_t two_scales, two_zeros;  // two fp16 values each
      std::memcpy(&two_scales, w.scales + at, 4);
      std::memcpy(&two_zeros, w.zeros + at, 4);
      const __m512 s = _mm512_permutexvar_ps(
          spread, _mm512_castps128_ps512(_mm_cvtph_ps(_mm_cvtsi32_si128(two_scales))));
      const __m512 z = _mm512_permutexvar_ps(
          spread, _mm512_castps128_ps512(_mm_cvtph_ps(_mm_cvtsi32_si128(two_zeros))));
      // s * (S - z C), lane by lane: each lane holds a quarter-group's S and C / 8.
      acc[k] = _mm512_fmadd_ps(s, _mm512_fnmadd_ps(z, sums_over_8, _mm512_cvtepi32_ps(dots)),
                               acc[k]);
    }
  }
  for (int k = 0; k < 4; ++k) totals[k] = _mm512_reduce_add_ps(acc[k]);
}
#endif

// y [rows, out] = x [rows, in] W^T, each row of x rounded to int8 as above.
inline void int4_product(const float* x, int64_t rows, const Int4Weights& w, float* y) {
  const int64_t in = w.in, out = w.out, groups = in / w.group;
  std::vector<int8_t> codes(rows * in);
  std::vector<float> scales(rows);
  std::vector<int32_t> group_sums(rows * groups, 0);
  for (int64_t r = 0; r < rows; ++r) {
    quantize_row_symmetric(x + r * in, in, &codes[r * in], &scales[r]);
    for (int64_t i = 0; i < in; ++i) group_sums[r * groups + i / w.group] += codes[r * in + i];
  }
#ifdef MINILLM_VNNI_512
  const bool paired = w.group == 32 && groups % 2 == 0;
  std::vector<PairedActivations> pairs;
  for (int64_t r = 0; paired && r < rows; ++r)
    pairs.push_back(pair_groups(&codes[r * in], &group_sums[r * groups], groups));
#endif
  at::parallel_for(0, out, 64, [&](int64_t begin, int64_t end) {
    for (int64_t r = 0; r < rows; ++r) {
      int64_t o = begin;
#ifdef MINILLM_VNNI_512
      for (float totals[4]; paired && o + 4 <= end; o += 4) {
        int4_rows4_paired(w, o, pairs[r], totals);
        for (int k = 0; k < 4; ++k) y[r * out + o + k] = scales[r] * totals[k];
      }
#endif
      for (; o < end; ++o)
        y[r * out + o] = scales[r] * int4_row(w, o, &codes[r * in], &group_sums[r * groups]);
    }
  });
}

}  // namespace minillm
