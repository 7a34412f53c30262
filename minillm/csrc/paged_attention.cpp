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
  return {keys.data_ptr<float>(), values.data_ptr<float>(), keys.size(0), keys.size(1),
          keys.size(2), keys.size(3)};
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

}  // namespace minillm

TORCH_LIBRARY_IMPL(minillm, CPU, m) {
  m.impl("paged_decode_attention", &minillm::paged_decode_attention);
}
