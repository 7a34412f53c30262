// Decode attention over the paged KV pool (minillm/attention/paged.py is the reference).
//
// One layer's pool holds keys (and values) as [num_blocks, block_size, kv_heads, head_dim]:
// token t of a sequence lives at slot block_table[t / block_size] * block_size +
// t % block_size. A decode step has one new token per sequence: its key and value are
// written at its slot (a padding row has slot -1 and writes nothing), then its query heads
// attend to the sequence's first context_len tokens, reading them through the block table
// in place (no gathered copy), with a softmax over the scores written out in two passes.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace minillm {

// q . k over one head: 16 lanes at a time where the CPU has AVX-512 (a plain loop would
// run one multiply-add at a time: without -ffast-math the compiler keeps a float sum's
// order, so it cannot vectorize it).
inline float head_dot(const float* q, const float* k, int64_t d) {
  int64_t i = 0;
  float sum = 0.f;
#if defined(__AVX512F__)
  __m512 acc = _mm512_setzero_ps();
  for (; i + 16 <= d; i += 16)
    acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + i), _mm512_loadu_ps(k + i), acc);
  sum = _mm512_reduce_add_ps(acc);
#endif
  for (; i < d; ++i) sum += q[i] * k[i];
  return sum;
}

struct PagedPool {
  float* keys;    // [num_blocks, block_size, kv_heads, head_dim]
  float* values;  // the same
  int64_t num_blocks, block_size, kv_heads, head_dim;

  float* key_at(int64_t slot, int64_t group) const {
    return keys + (slot * kv_heads + group) * head_dim;
  }
  float* value_at(int64_t slot, int64_t group) const {
    return values + (slot * kv_heads + group) * head_dim;
  }
};

// Store one token's keys and values [kv_heads, head_dim] at `slot` (none when slot < 0).
inline void write_token(const PagedPool& pool, int64_t slot, const float* k, const float* v) {
  if (slot < 0) return;
  const int64_t n = pool.kv_heads * pool.head_dim;
  std::copy(k, k + n, pool.key_at(slot, 0));
  std::copy(v, v + n, pool.value_at(slot, 0));
}

// softmax(q K^T / sqrt(d)) V for one query head of one sequence, whose keys and values are
// in kv head `group` at the slots its block table lists; `scores` has context_len floats.
inline void attend_paged(const float* q, const PagedPool& pool, int64_t group,
                         const int64_t* block_table, int64_t context_len, float* scores,
                         float* out) {
  const int64_t d = pool.head_dim;
  const float root = std::sqrt(float(d));
  float largest = -INFINITY;
  for (int64_t t = 0; t < context_len; ++t) {
    const float* key = pool.key_at(block_table[t / pool.block_size] * pool.block_size +
                                   t % pool.block_size, group);
    scores[t] = head_dot(q, key, d) / root;
    largest = std::max(largest, scores[t]);
  }
  float total = 0.f;
  for (int64_t t = 0; t < context_len; ++t) total += scores[t] = std::exp(scores[t] - largest);
  std::fill(out, out + d, 0.f);
  for (int64_t t = 0; t < context_len; ++t) {
    const float* value = pool.value_at(block_table[t / pool.block_size] * pool.block_size +
                                       t % pool.block_size, group);
    const float weight = scores[t] / total;
    for (int64_t i = 0; i < d; ++i) out[i] += weight * value[i];
  }
}

// Every query head of every sequence: q [seqs, heads, head_dim] -> out [seqs, heads,
// head_dim]; block_tables [seqs, width]; sequences with context_len 0 (padding) get zeros.
inline void paged_decode(const float* q, const PagedPool& pool, const int64_t* block_tables,
                         int64_t width, const int64_t* context_lens, int64_t seqs,
                         int64_t heads, float* out) {
  const int64_t d = pool.head_dim, group_size = heads / pool.kv_heads;
  at::parallel_for(0, seqs * heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    for (int64_t job = begin; job < end; ++job) {
      const int64_t s = job / heads, head = job % heads, length = context_lens[s];
      float* result = out + job * d;
      if (length <= 0) {
        std::fill(result, result + d, 0.f);
        continue;
      }
      scores.resize(length);
      attend_paged(q + job * d, pool, head / group_size, block_tables + s * width, length,
                   scores.data(), result);
    }
  });
}

}  // namespace minillm
