// A decode step through every transformer block in one C++ call (the native executor,
// minillm/engine/executors/native.py).
//
// The same computation as minillm/model.py's Block.forward for one new token per sequence,
// for a batch of sequences whose keys and values live in the paged pool
// (paged_attention.h), with float32 (fp32_product.h), int8 x int8 (int8_product.h) or
// int4 x int8 (int4_product.h) products (products.h), written as plain loops:
//
//   h = x + o(attention(rope(q), rope(k), v))      q, k, v = qkv(rms_norm(x))
//   x = h + down(silu(gate) * up)                  gate, up = gate_up(rms_norm(h))
//
// and, when the model's head is given, logits = head(rms_norm(x)). That is Llama's block;
// the dense families' differences (Qwen's biases and QK-norm, sliding windows, Gemma 3's
// extra norms, GeGLU and query scale) are per-block switches (block_options.h).
//
// Why: compiled by torch.compile, a step is ~330 small kernels and ops; each costs a few
// microseconds to start, ~3 ms of a ~8 ms step on a 2-core CPU. Here the only per-step cost
// besides the arithmetic is one call from Python, and each weight is read once for the
// whole batch. Under tensor parallelism every rank runs its shard of each block and a
// Python callback all-reduces the partial outputs of o and down before they are added.

#include <torch/extension.h>

#include <array>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "block_options.h"
#include "paged_attention.h"
#include "products.h"
#include "rows.h"

namespace minillm {

PagedPool paged_pool(const torch::Tensor& keys, const torch::Tensor& values);  // paged_attention.cpp
PagedPool paged_pool(const torch::Tensor& keys, const torch::Tensor& values,
                     const torch::Tensor& key_scales, const torch::Tensor& value_scales);
torch::Tensor paged_decode_read(const torch::Tensor& q, const torch::Tensor& key_pool,
                                const torch::Tensor& value_pool,
                                const std::vector<torch::Tensor>& scales,
                                const torch::Tensor& block_tables,
                                const torch::Tensor& context_lens,
                                int64_t window);  // paged_attention.cpp

namespace {

float* floats(const torch::Tensor& t) { return t.data_ptr<float>(); }

// One step's inputs besides x and the pools, as pointers (step() documents them).
struct StepInputs {
  int64_t rows;
  std::vector<const float*> cos, sin;  // per RoPE table: [rows, head_dim]
  const int64_t *slots, *block_tables, *context_lens;
  int64_t width;  // of the block tables
};

// The step's intermediate rows, allocated once per call.
struct Buffers {
  std::vector<float> normed, qkv, queries, attended, added, gate_up, activated;
};

// out[r] = act(gate[r]) * up[r] over rows of [gate | up] (SwiGLU, GeGLU).
template <float (*act)(float)>
void gated(const float* gate_up, int64_t rows, int64_t inner, float* out) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < inner; ++i)
      out[r * inner + i] = act(gate_up[r * 2 * inner + i]) * gate_up[r * 2 * inner + inner + i];
}

}  // namespace

// The weights of every block (and optionally the final norm and head), held for the life
// of the model.
class DecodeLayers {
 public:
  // Per block, six parts, each a list of products (a product: its list of tensors):
  // {{attn_norm}}, {q, k, v}, {o}, {{mlp_norm}}, {gate, up}, {down}; and its options:
  // optional tensors by name (block_options.h), its sliding window (0: none) and the index
  // of the RoPE table it reads. `head`: empty, or {{{final norm}}, {head}}. `query_scale`
  // multiplies each query after RoPE; `activation`: the MLP's gate, silu or
  // gelu_pytorch_tanh. Norm weights are effective weights (Gemma's 1 + w).
  using Parts = std::vector<std::vector<std::vector<torch::Tensor>>>;
  DecodeLayers(std::vector<Parts> blocks, std::vector<std::map<std::string, torch::Tensor>> options,
               std::vector<int64_t> windows, std::vector<int64_t> rope_tables, Parts head,
               double eps, int64_t heads, int64_t kv_heads, int64_t head_dim,
               double query_scale, const std::string& activation)
      : blocks_(std::move(blocks)), head_tensors_(std::move(head)), eps_(float(eps)),
        query_scale_(float(query_scale)), gelu_(activation == "gelu_pytorch_tanh"),
        heads_(heads), kv_heads_(kv_heads), head_dim_(head_dim) {
    TORCH_CHECK(activation == "silu" || gelu_, "the MLP's activation is silu or "
                "gelu_pytorch_tanh, not ", activation);
    TORCH_CHECK(options.size() == blocks_.size() && windows.size() == blocks_.size() &&
                rope_tables.size() == blocks_.size(),
                "one set of options, one window and one RoPE table index per block");
    for (size_t l = 0; l < blocks_.size(); ++l) {
      const Parts& b = blocks_[l];
      TORCH_CHECK(b.size() == 6, "each block takes six parts, got ", b.size());
      weights_.push_back({Products::from(b[1]), Products::from(b[2]), Products::from(b[4]),
                          Products::from(b[5])});
      options_.push_back(BlockOptions::from(options[l], windows[l], rope_tables[l],
                                            weights_[l][0].out, head_dim_, weights_[l][1].out));
      rope_tables_ = std::max(rope_tables_, rope_tables[l] + 1);
    }
    TORCH_CHECK(head_tensors_.empty() || head_tensors_.size() == 2,
                "the head is {{{norm}}, {product}} or nothing");
    if (!head_tensors_.empty()) head_.push_back(Products::from(head_tensors_[1]));
  }

  // x [rows, hidden] float32, one row per sequence, updated in place; cos, sin: per RoPE
  // table, [rows, head_dim], each row's angles; slots [rows] (-1: a padding row, writes
  // nothing); block_tables [rows, width]; context_lens [rows] (the new token included);
  // one key and one value pool per block, and for an int8 pool one key and one value scale
  // tensor per block (none for float32 pools). `reduce_attention`, `reduce_mlp`: None, or
  // a function called with each block's partial attention (MLP) output [rows, hidden]
  // before it is added (a tensor-parallel all-reduce, in place). Returns the logits [rows,
  // vocab] with a head, else x.
  torch::Tensor step(torch::Tensor x, const std::vector<torch::Tensor>& cos,
                     const std::vector<torch::Tensor>& sin, const torch::Tensor& slots,
                     const torch::Tensor& block_tables, const torch::Tensor& context_lens,
                     const std::vector<torch::Tensor>& key_pools,
                     const std::vector<torch::Tensor>& value_pools,
                     const std::vector<torch::Tensor>& key_scales,
                     const std::vector<torch::Tensor>& value_scales,
                     pybind11::object reduce_attention, pybind11::object reduce_mlp) {
    const int64_t rows = x.size(0), hidden = x.size(1);
    TORCH_CHECK(x.scalar_type() == torch::kFloat && x.is_contiguous() && x.dim() == 2,
                "x: contiguous float32 [rows, hidden]");
    TORCH_CHECK(key_pools.size() == blocks_.size() && value_pools.size() == blocks_.size(),
                "one key and one value pool per block");
    TORCH_CHECK(key_scales.size() == value_scales.size() &&
                (key_scales.empty() || key_scales.size() == blocks_.size()),
                "no scales (float32 pools) or one key and one value scale tensor per block");
    TORCH_CHECK(slots.scalar_type() == torch::kLong && block_tables.scalar_type() == torch::kLong &&
                context_lens.scalar_type() == torch::kLong, "slots, tables and lengths: int64");
    TORCH_CHECK(cos.size() == sin.size() && int64_t(cos.size()) >= rope_tables_,
                "one cos and one sin per RoPE table the blocks read (", rope_tables_, ")");
    StepInputs in{rows, {}, {}, slots.data_ptr<int64_t>(), block_tables.data_ptr<int64_t>(),
                  context_lens.data_ptr<int64_t>(), block_tables.size(1)};
    for (size_t t = 0; t < cos.size(); ++t) {
      TORCH_CHECK(cos[t].is_contiguous() && sin[t].is_contiguous() && cos[t].size(0) == rows &&
                  sin[t].size(0) == rows, "cos and sin: contiguous [rows, head_dim]");
      in.cos.push_back(floats(cos[t])), in.sin.push_back(floats(sin[t]));
    }
    const int64_t inner = weights_[0][3].in;
    Buffers b{std::vector<float>(rows * hidden), std::vector<float>(rows * weights_[0][0].out),
              std::vector<float>(rows * heads_ * head_dim_),
              std::vector<float>(rows * heads_ * head_dim_), std::vector<float>(rows * hidden),
              std::vector<float>(rows * 2 * inner), std::vector<float>(rows * inner)};
    torch::Tensor partial = torch::from_blob(b.added.data(), {rows, hidden}, x.options());
    float* h = floats(x);
    for (size_t l = 0; l < blocks_.size(); ++l) {
      const PagedPool pool = key_scales.empty()
          ? paged_pool(key_pools[l], value_pools[l])
          : paged_pool(key_pools[l], value_pools[l], key_scales[l], value_scales[l]);
      attention(l, h, hidden, pool, in, b);
      if (!reduce_attention.is_none()) reduce_attention(partial);
      add_to_residual(h, b.added.data(), options_[l].attention_out_norm, rows, hidden);
      feed_forward(l, h, hidden, rows, b);
      if (!reduce_mlp.is_none()) reduce_mlp(partial);
      add_to_residual(h, b.added.data(), options_[l].mlp_out_norm, rows, hidden);
    }
    if (head_.empty()) return x;
    for (int64_t r = 0; r < rows; ++r)
      rms_norm(h + r * hidden, floats(head_tensors_[0][0][0]), hidden, eps_, &b.normed[r * hidden]);
    torch::Tensor logits = torch::empty({rows, head_[0].out}, x.options());
    head_[0](b.normed.data(), rows, floats(logits));
    return logits;
  }

 private:
  // Block l's attention into b.added: project (and add biases, norm each head of q and k),
  // rotate, write K and V into the pool, attend, project back.
  void attention(size_t l, const float* h, int64_t hidden, const PagedPool& pool,
                 const StepInputs& in, Buffers& b) const {
    const auto& w = weights_[l];
    const BlockOptions& o = options_[l];
    const int64_t q_size = heads_ * head_dim_, kv_size = kv_heads_ * head_dim_,
                  qkv_size = w[0].out;
    for (int64_t r = 0; r < in.rows; ++r)
      rms_norm(h + r * hidden, floats(blocks_[l][0][0][0]), hidden, eps_, &b.normed[r * hidden]);
    w[0](b.normed.data(), in.rows, b.qkv.data());
    for (int64_t r = 0; r < in.rows; ++r) {
      float* q = &b.qkv[r * qkv_size];
      float *k = q + q_size, *v = k + kv_size;
      if (o.qkv_bias)
        for (int64_t i = 0; i < qkv_size; ++i) q[i] += o.qkv_bias[i];
      if (o.q_norm) norm_heads(q, o.q_norm, heads_, head_dim_, eps_);
      if (o.k_norm) norm_heads(k, o.k_norm, kv_heads_, head_dim_, eps_);
      const float* c = in.cos[o.rope_table] + r * head_dim_;
      const float* s = in.sin[o.rope_table] + r * head_dim_;
      for (int64_t head = 0; head < heads_; ++head) rope(q + head * head_dim_, c, s, head_dim_);
      for (int64_t g = 0; g < kv_heads_; ++g) rope(k + g * head_dim_, c, s, head_dim_);
      float* query = &b.queries[r * q_size];
      if (query_scale_ == 1.f) std::copy(q, q + q_size, query);
      else for (int64_t i = 0; i < q_size; ++i) query[i] = q[i] * query_scale_;
      write_token(pool, in.slots[r], k, v);
    }
    paged_decode(b.queries.data(), pool, in.block_tables, in.width, in.context_lens, in.rows,
                 heads_, b.attended.data(), o.window);
    w[1](b.attended.data(), in.rows, b.added.data());
  }

  // Block l's MLP into b.added: down(act(gate) * up) of the normalised rows.
  void feed_forward(size_t l, const float* h, int64_t hidden, int64_t rows, Buffers& b) const {
    const auto& w = weights_[l];
    const int64_t inner = w[3].in;
    for (int64_t r = 0; r < rows; ++r)
      rms_norm(h + r * hidden, floats(blocks_[l][3][0][0]), hidden, eps_, &b.normed[r * hidden]);
    w[2](b.normed.data(), rows, b.gate_up.data());
    if (gelu_) gated<gelu_tanh>(b.gate_up.data(), rows, inner, b.activated.data());
    else gated<silu>(b.gate_up.data(), rows, inner, b.activated.data());
    w[3](b.activated.data(), rows, b.added.data());
  }

  // h += out, out first normalised by `norm` when the block has one (Gemma 3).
  void add_to_residual(float* h, float* out, const float* norm, int64_t rows,
                       int64_t hidden) const {
    if (norm)
      for (int64_t r = 0; r < rows; ++r)
        rms_norm(out + r * hidden, norm, hidden, eps_, out + r * hidden);
    for (int64_t i = 0; i < rows * hidden; ++i) h[i] += out[i];
  }

  std::vector<Parts> blocks_;  // keeps the weights alive
  std::vector<BlockOptions> options_;
  Parts head_tensors_;
  std::vector<std::array<Products, 4>> weights_;  // qkv, o, gate_up, down
  std::vector<Products> head_;  // none, or the head
  float eps_, query_scale_;
  bool gelu_;  // GeGLU (tanh GELU), else SwiGLU
  int64_t heads_, kv_heads_, head_dim_;
  int64_t rope_tables_ = 1;  // how many RoPE tables the blocks read
};

}  // namespace minillm

// Which vector code each product was built with (a CPU without it gets a plain loop).
std::map<std::string, std::string> vector_paths() {
  return {{"fp32", minillm::kFp32Path}, {"int8", minillm::kInt8Path}, {"int4", kInt4Path}};
}

// y [..., out] = x [..., in] W^T with the step's float32 product (its tests call it).
torch::Tensor fp32_linear(const torch::Tensor& x, const torch::Tensor& weight) {
  TORCH_CHECK(weight.scalar_type() == torch::kFloat && weight.dim() == 2,
              "the weight must be a float32 matrix [out, in], not ", weight.scalar_type(),
              " with ", weight.dim(), " dimensions");
  const torch::Tensor contiguous = weight.contiguous();
  const minillm::Fp32Weights w{contiguous.data_ptr<float>(), weight.size(0), weight.size(1)};
  return minillm::over_rows(x, w.in, w.out, [&](const float* rows, int64_t n, float* y) {
    minillm::fp32_product(rows, n, w, y);
  });
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("vector_paths", &vector_paths);
  m.def("paged_decode_read", &minillm::paged_decode_read, pybind11::arg("q"),
        pybind11::arg("key_pool"), pybind11::arg("value_pool"), pybind11::arg("scales"),
        pybind11::arg("block_tables"), pybind11::arg("context_lens"),
        pybind11::arg("window") = 0);
  m.def("fp32_linear", &fp32_linear);
  pybind11::class_<minillm::DecodeLayers>(m, "DecodeLayers")
      .def(pybind11::init<std::vector<minillm::DecodeLayers::Parts>,
                          std::vector<std::map<std::string, torch::Tensor>>,
                          std::vector<int64_t>, std::vector<int64_t>,
                          minillm::DecodeLayers::Parts, double, int64_t, int64_t, int64_t,
                          double, const std::string&>(),
           pybind11::arg("blocks"), pybind11::arg("options"), pybind11::arg("windows"),
           pybind11::arg("rope_tables"), pybind11::arg("head"), pybind11::arg("eps"),
           pybind11::arg("heads"), pybind11::arg("kv_heads"), pybind11::arg("head_dim"),
           pybind11::arg("query_scale"), pybind11::arg("activation"))
      .def("step", &minillm::DecodeLayers::step);
}
