// The op minillm::paged_decode_attention (paged_attention.h on tensors): write each new
// token's key and value at its slot, then attend its queries over its sequence's cache.
// Called by the compiled decode step (minillm/serve/executors/compiled.py) as one opaque op
// per layer, so the KV pool is written in place inside the compiled graph.

#include <torch/extension.h>

#include "paged_attention.h"

namespace minillm {

PagedPool paged_pool(const torch::Tensor& keys, const torch::Tensor& values) {
  TORCH_CHECK(keys.dim() == 4 && keys.sizes() == values.sizes() &&
              keys.scalar_type() == torch::kFloat && values.scalar_type() == torch::kFloat &&
              keys.is_contiguous() && values.is_contiguous(),
              "a KV pool is two contiguous float32 tensors [blocks, block_size, kv_heads, "
              "head_dim]");
  return {keys.data_ptr<float>(), values.data_ptr<float>(), nullptr, nullptr, keys.size(0),
          keys.size(1), keys.size(2), keys.size(3)};
}

// An int8 pool: codes [blocks, block_size, kv_heads, head_dim] and float32 scales [blocks,
// block_size, kv_heads], for keys and for values.
PagedPool paged_pool(const torch::Tensor& keys, const torch::Tensor& values,
                     const torch::Tensor& key_scales, const torch::Tensor& value_scales) {
  TORCH_CHECK(keys.dim() == 4 && keys.sizes() == values.sizes() &&
              keys.scalar_type() == torch::kChar && values.scalar_type() == torch::kChar &&
              keys.is_contiguous() && values.is_contiguous(),
              "an int8 KV pool's codes are two contiguous int8 tensors [blocks, block_size, "
              "kv_heads, head_dim]");
  TORCH_CHECK(key_scales.sizes() == keys.sizes().slice(0, 3) &&
              value_scales.sizes() == key_scales.sizes() &&
              key_scales.scalar_type() == torch::kFloat &&
              value_scales.scalar_type() == torch::kFloat && key_scales.is_contiguous() &&
              value_scales.is_contiguous(),
              "an int8 KV pool's scales are two contiguous float32 tensors [blocks, "
              "block_size, kv_heads]");
  return {keys.data_ptr(), values.data_ptr(), key_scales.data_ptr<float>(),
          value_scales.data_ptr<float>(), keys.size(0), keys.size(1), keys.size(2),
          keys.size(3)};
}

// q [seqs, heads, d], k and v [seqs, kv_heads, d] float32; slots, context_lens [seqs] and
// block_tables [seqs, width] int64; returns [seqs, heads, d].
torch::Tensor paged_decode_attention(const torch::Tensor& q, const torch::Tensor& k,
                                     const torch::Tensor& v, torch::Tensor key_pool,
                                     torch::Tensor value_pool, const torch::Tensor& slots,
                                     const torch::Tensor& block_tables,
                                     const torch::Tensor& context_lens) {
  const PagedPool pool = paged_pool(key_pool, value_pool);
  TORCH_CHECK(slots.scalar_type() == torch::kLong && block_tables.scalar_type() == torch::kLong &&
              context_lens.scalar_type() == torch::kLong, "slots, tables and lengths: int64");
  const torch::Tensor queries = q.contiguous().to(torch::kFloat);
  const torch::Tensor keys = k.contiguous().to(torch::kFloat);
  const torch::Tensor values = v.contiguous().to(torch::kFloat);
  const torch::Tensor tables = block_tables.contiguous(), lengths = context_lens.contiguous();
  const int64_t seqs = queries.size(0), per_token = pool.kv_heads * pool.head_dim;
  const int64_t* slot = slots.contiguous().data_ptr<int64_t>();
  for (int64_t s = 0; s < seqs; ++s)
    write_token(pool, slot[s], keys.data_ptr<float>() + s * per_token,
                values.data_ptr<float>() + s * per_token);
  torch::Tensor out = torch::empty_like(queries);
  paged_decode(queries.data_ptr<float>(), pool, tables.data_ptr<int64_t>(), tables.size(1),
               lengths.data_ptr<int64_t>(), seqs, queries.size(1), out.data_ptr<float>());
  return out;
}

// The attention of a decode step alone, over a float32 pool (no scales) or an int8 one,
// without writing, with a sliding `window` (0: none): q [seqs, heads, d] float32 -> [seqs,
// heads, d]. For tests and benchmarks of paged_decode (the native step runs it inside
// DecodeLayers::step).
torch::Tensor paged_decode_read(const torch::Tensor& q, const torch::Tensor& key_pool,
                                const torch::Tensor& value_pool,
                                const std::vector<torch::Tensor>& scales,
                                const torch::Tensor& block_tables,
                                const torch::Tensor& context_lens, int64_t window) {
  TORCH_CHECK(scales.empty() || scales.size() == 2, "scales: none, or key and value scales");
  const PagedPool pool = scales.empty() ? paged_pool(key_pool, value_pool)
                                        : paged_pool(key_pool, value_pool, scales[0], scales[1]);
  TORCH_CHECK(q.scalar_type() == torch::kFloat && q.dim() == 3 && q.size(2) == pool.head_dim,
              "q: float32 [seqs, heads, head_dim]");
  TORCH_CHECK(block_tables.scalar_type() == torch::kLong &&
              context_lens.scalar_type() == torch::kLong, "tables and lengths: int64");
  TORCH_CHECK(window >= 0, "the window is a number of tokens, or 0 for none, not ", window);
  const torch::Tensor queries = q.contiguous(), tables = block_tables.contiguous(),
                      lengths = context_lens.contiguous();
  torch::Tensor out = torch::empty_like(queries);
  paged_decode(queries.data_ptr<float>(), pool, tables.data_ptr<int64_t>(), tables.size(1),
               lengths.data_ptr<int64_t>(), queries.size(0), queries.size(1),
               out.data_ptr<float>(), window);
  return out;
}

}  // namespace minillm

TORCH_LIBRARY_IMPL(minillm, CPU, m) {
  m.impl("paged_decode_attention", &minillm::paged_decode_attention);
}
