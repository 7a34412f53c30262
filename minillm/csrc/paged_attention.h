// Decode attention over the paged KV pool (minillm/attention/paged.py is the reference).
//
// One layer's pool holds keys (and values) as [num_blocks, block_size, kv_heads, head_dim]:
// token t of a sequence lives at slot block_table[t / block_size] * block_size +
// t % block_size. A decode step has one new token per sequence: its key and value are
// written at its slot (a padding row has slot -1 and writes nothing), then its query heads
// attend to the sequence's first context_len tokens, reading them through the block table
// in place (no gathered copy); with a sliding window, only the last `window` of them.
//
// The pool is float32, or int8 codes with one float scale per (slot, KV head): symmetric
// absmax rounding of each head's keys (values), x ~ code * scale (minillm/attention/
// kv_quant.py is the reference). An int8 head is read as dot(q, codes) * scale and added
// to the output as (p * scale) * codes: dequantized on the fly, never stored as float.
//
// Grouped-query attention: the query heads that share a KV head (SmolLM2: 3 per KV head)
// are attended together, so each key and value row is read from memory once per step, not
// once per query head. A long context is split into parts of kPartTokens tokens, attended
// in parallel and merged with their softmax statistics (flash-decoding: each part keeps
// its largest score m and sum of exp(s - m); out = sum_p e^(m_p - M) out_p / sum_p
// e^(m_p - M) l_p), so one sequence's attention keeps both cores busy.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

namespace minillm {

#if defined(__AVX2__) && defined(__FMA__)
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const int8_t* p) {
  return _mm256_cvtepi32_ps(
      _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
inline float sum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
#endif

// q . k over one head, k float32 or int8 codes: 16 lanes at a time with AVX-512 (float
// keys), 2 x 8 with AVX2 and FMA (a plain loop would run one multiply-add at a time:
// without -ffast-math the compiler keeps a float sum's order, so it cannot vectorize it).
template <typename T>
inline float head_dot(const float* q, const T* k, int64_t d) {
  int64_t i = 0;
  float sum = 0.f;
#if defined(__AVX512F__)
  if constexpr (sizeof(T) == 4) {
    __m512 acc = _mm512_setzero_ps();
    for (; i + 16 <= d; i += 16)
      acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + i), _mm512_loadu_ps(k + i), acc);
    sum = _mm512_reduce_add_ps(acc);
  }
#endif
#if defined(__AVX2__) && defined(__FMA__)
  __m256 a = _mm256_setzero_ps(), b = _mm256_setzero_ps();
  for (; i + 16 <= d; i += 16) {
    a = _mm256_fmadd_ps(load8(q + i), load8(k + i), a);
    b = _mm256_fmadd_ps(load8(q + i + 8), load8(k + i + 8), b);
  }
  for (; i + 8 <= d; i += 8) a = _mm256_fmadd_ps(load8(q + i), load8(k + i), a);
  sum += sum8(_mm256_add_ps(a, b));
#endif
  for (; i < d; ++i) sum += q[i] * float(k[i]);
  return sum;
}

// out += weight * v over one head (v float32 or int8 codes).
template <typename T>
inline void add_scaled(float* out, float weight, const T* v, int64_t d) {
  int64_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
  const __m256 w = _mm256_set1_ps(weight);
  for (; i + 8 <= d; i += 8)
    _mm256_storeu_ps(out + i, _mm256_fmadd_ps(w, load8(v + i), _mm256_loadu_ps(out + i)));
#endif
  for (; i < d; ++i) out[i] += weight * float(v[i]);
}

struct PagedPool {
  void* keys;           // [num_blocks, block_size, kv_heads, head_dim] float32 or int8
  void* values;         // the same
  float* key_scales;    // int8 pools: [num_blocks, block_size, kv_heads]; float32: null
  float* value_scales;  // the same
  int64_t num_blocks, block_size, kv_heads, head_dim;

  bool quantized() const { return key_scales != nullptr; }
  int64_t slot(const int64_t* block_table, int64_t t) const {
    return block_table[t / block_size] * block_size + t % block_size;
  }
  template <typename T>
  T* key_at(int64_t slot, int64_t group) const {
    return static_cast<T*>(keys) + (slot * kv_heads + group) * head_dim;
  }
  template <typename T>
  T* value_at(int64_t slot, int64_t group) const {
    return static_cast<T*>(values) + (slot * kv_heads + group) * head_dim;
  }
  // A head's scale (1 in a float32 pool).
  float key_scale(int64_t slot, int64_t group) const {
    return key_scales ? key_scales[slot * kv_heads + group] : 1.f;
  }
  float value_scale(int64_t slot, int64_t group) const {
    return value_scales ? value_scales[slot * kv_heads + group] : 1.f;
  }
};

// One head rounded to int8: scale = max |x| / 127, code = round(x / scale) (ties to even,
// as torch.round), all zeros for an all-zero head. kv_quant.py's quantize_int8.
inline void quantize_head(const float* x, int64_t d, int8_t* codes, float* scale) {
  float largest = 0.f;
  for (int64_t i = 0; i < d; ++i) largest = std::max(largest, std::fabs(x[i]));
  const float s = largest / 127.f;
  *scale = s;
  for (int64_t i = 0; i < d; ++i)
    codes[i] = s > 0.f ? int8_t(std::clamp(std::nearbyint(x[i] / s), -127.f, 127.f)) : 0;
}

// Store one token's keys and values [kv_heads, head_dim] at `slot` (none when slot < 0).
inline void write_token(const PagedPool& pool, int64_t slot, const float* k, const float* v) {
  if (slot < 0) return;
  const int64_t d = pool.head_dim;
  for (int64_t g = 0; g < pool.kv_heads; ++g) {
    if (pool.quantized()) {
      quantize_head(k + g * d, d, pool.key_at<int8_t>(slot, g),
                    &pool.key_scales[slot * pool.kv_heads + g]);
      quantize_head(v + g * d, d, pool.value_at<int8_t>(slot, g),
                    &pool.value_scales[slot * pool.kv_heads + g]);
    } else {
      std::copy(k + g * d, k + (g + 1) * d, pool.key_at<float>(slot, g));
      std::copy(v + g * d, v + (g + 1) * d, pool.value_at<float>(slot, g));
    }
  }
}

constexpr int64_t kPartTokens = 256;

// A part of one sequence's attention: the `heads` query heads q [heads, d] of KV head
// `group`, over its tokens [begin, end). Writes out [heads, d] = sum_t e^(s_t - m) v_t,
// with each head's largest score m and total sum_t e^(s_t - m). `scores`: heads * (end -
// begin) floats.
template <typename T>
void attend_part(const float* q, int64_t heads, const PagedPool& pool, int64_t group,
                 const int64_t* block_table, int64_t begin, int64_t end, float* scores,
                 float* out, float* largest, float* total) {
  const int64_t d = pool.head_dim, n = end - begin;
  const float root = std::sqrt(float(d));
  std::fill(largest, largest + heads, -INFINITY);
  for (int64_t t = 0; t < n; ++t) {
    const int64_t slot = pool.slot(block_table, begin + t);
    const T* key = pool.key_at<T>(slot, group);
    const float scale = pool.key_scale(slot, group);
    for (int64_t h = 0; h < heads; ++h) {
      const float s = head_dot(q + h * d, key, d) * scale / root;
      scores[h * n + t] = s;
      largest[h] = std::max(largest[h], s);
    }
  }
  for (int64_t h = 0; h < heads; ++h) {
    total[h] = 0.f;
    for (int64_t t = 0; t < n; ++t)
      total[h] += scores[h * n + t] = std::exp(scores[h * n + t] - largest[h]);
  }
  std::fill(out, out + heads * d, 0.f);
  for (int64_t t = 0; t < n; ++t) {
    const int64_t slot = pool.slot(block_table, begin + t);
    const T* value = pool.value_at<T>(slot, group);
    const float scale = pool.value_scale(slot, group);
    for (int64_t h = 0; h < heads; ++h)
      add_scaled(out + h * d, scores[h * n + t] * scale, value, d);
  }
}

// One part of the work: sequence s, KV head `group`, tokens [begin, end).
struct Part {
  int64_t s, group, begin, end;
};

// Every query head of every sequence: q [seqs, heads, head_dim] -> out [seqs, heads,
// head_dim]; block_tables [seqs, width]; sequences with context_len 0 (padding) get zeros.
// With a sliding `window` (0: none) the query, at position context_len - 1, sees only the
// keys at positions j > context_len - 1 - window: the tokens before are never read (their
// blocks may have been given back, their table entries pointing at block 0).
template <typename T>
void paged_decode_as(const float* q, const PagedPool& pool, const int64_t* block_tables,
                     int64_t width, const int64_t* context_lens, int64_t seqs, int64_t heads,
                     int64_t window, float* out) {
  const int64_t d = pool.head_dim, group_size = heads / pool.kv_heads;
  std::vector<Part> parts;
  for (int64_t s = 0; s < seqs; ++s) {
    const int64_t first = window > 0 ? std::max<int64_t>(context_lens[s] - window, 0) : 0;
    for (int64_t g = 0; g < pool.kv_heads; ++g)
      for (int64_t begin = first; begin < context_lens[s]; begin += kPartTokens)
        parts.push_back({s, g, begin, std::min(context_lens[s], begin + kPartTokens)});
  }
  const int64_t count = int64_t(parts.size());
  std::vector<float> partial(count * group_size * d), largest(count * group_size),
      total(count * group_size);
  at::parallel_for(0, count, 1, [&](int64_t first, int64_t last) {
    std::vector<float> scores(group_size * kPartTokens);
    for (int64_t i = first; i < last; ++i) {
      const Part& p = parts[i];
      attend_part<T>(q + (p.s * heads + p.group * group_size) * d, group_size, pool, p.group,
                     block_tables + p.s * width, p.begin, p.end, scores.data(),
                     &partial[i * group_size * d], &largest[i * group_size],
                     &total[i * group_size]);
    }
  });
  std::fill(out, out + seqs * heads * d, 0.f);
  // Merge each head's parts (they follow each other in `parts`).
  for (int64_t first = 0; first < count;) {
    int64_t last = first;
    while (last < count && parts[last].s == parts[first].s &&
           parts[last].group == parts[first].group)
      ++last;
    for (int64_t h = 0; h < group_size; ++h) {
      float top = -INFINITY, sum = 0.f;
      for (int64_t i = first; i < last; ++i) top = std::max(top, largest[i * group_size + h]);
      float* result = out + (parts[first].s * heads + parts[first].group * group_size + h) * d;
      for (int64_t i = first; i < last; ++i) {
        const float weight = std::exp(largest[i * group_size + h] - top);
        sum += weight * total[i * group_size + h];
        add_scaled(result, weight, &partial[(i * group_size + h) * d], d);
      }
      for (int64_t j = 0; j < d; ++j) result[j] /= sum;
    }
    first = last;
  }
}

inline void paged_decode(const float* q, const PagedPool& pool, const int64_t* block_tables,
                         int64_t width, const int64_t* context_lens, int64_t seqs,
                         int64_t heads, float* out, int64_t window = 0) {
  if (pool.quantized())
    paged_decode_as<int8_t>(q, pool, block_tables, width, context_lens, seqs, heads, window,
                            out);
  else
    paged_decode_as<float>(q, pool, block_tables, width, context_lens, seqs, heads, window,
                           out);
}

}  // namespace minillm
