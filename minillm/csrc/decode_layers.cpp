// A decode step through every transformer block in one C++ call (the native executor,
// minillm/serve/executors/native.py).
//
// The same computation as minillm/model.py's Block.forward for one new token per sequence,
// for a batch of sequences whose keys and values live in the paged pool
// (paged_attention.h), with float32 (fp32_product.h), int8 x int8 (int8_product.h) or
// int4 x int8 (int4_product.h) products, written as plain loops:
//
//   h = x + o(attention(rope(q), rope(k), v))      q, k, v = qkv(rms_norm(x))
//   x = h + down(silu(gate) * up)                  gate, up = gate_up(rms_norm(h))
//
// and, when the model's head is given, logits = head(rms_norm(x)).
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

#include "fp32_product.h"
#include "int4_product.h"
#include "int8_product.h"
#include "paged_attention.h"
#include "rows.h"

namespace minillm {

Int8Weights int8_weights(const torch::Tensor& codes, const torch::Tensor& scales,
                         const torch::Tensor& code_sums);  // int8_linear.cpp
Int4Weights int4_weights(const torch::Tensor& codes, const torch::Tensor& scales,
                         const torch::Tensor& zeros);  // w4a8_linear.cpp
PagedPool paged_pool(const torch::Tensor& keys, const torch::Tensor& values);  // paged_attention.cpp
PagedPool paged_pool(const torch::Tensor& keys, const torch::Tensor& values,
                     const torch::Tensor& key_scales, const torch::Tensor& value_scales);
torch::Tensor paged_decode_read(const torch::Tensor& q, const torch::Tensor& key_pool,
                                const torch::Tensor& value_pool,
                                const std::vector<torch::Tensor>& scales,
                                const torch::Tensor& block_tables,
                                const torch::Tensor& context_lens);  // paged_attention.cpp

namespace {

// One product: a float32 weight [out, in] (one tensor), int8 weights (codes, scales, code
// sums) or int4 weights (packed codes, scales, zero points).
struct Product {
  enum Kind { kFp32, kInt8, kInt4 } kind;
  Fp32Weights fp32;
  Int8Weights int8;
  Int4Weights int4;
  int64_t out, in;

  static Product from(const std::vector<torch::Tensor>& t) {
    if (t.size() == 1) {
      TORCH_CHECK(t[0].scalar_type() == torch::kFloat && t[0].is_contiguous() && t[0].dim() == 2,
                  "a float32 product takes one contiguous [out, in] weight");
      const Fp32Weights w{t[0].data_ptr<float>(), t[0].size(0), t[0].size(1)};
      return {kFp32, w, {}, {}, w.out, w.in};
    }
    TORCH_CHECK(t.size() == 3, "an integer product takes codes, scales and a third tensor");
    if (t[0].scalar_type() == torch::kByte) {
      const Int4Weights w = int4_weights(t[0], t[1], t[2]);
      return {kInt4, {}, {}, w, w.out, w.in};
    }
    const Int8Weights w = int8_weights(t[0], t[1], t[2]);
    return {kInt8, {}, w, {}, w.out, w.in};
  }
};

// Products that share an input (q, k and v; gate and up), computed as one: the input is
// rounded to int8 once, one parallel loop runs over all their output rows, and each writes
// its columns side by side (the effect of fusing the layers, without a fused copy).
struct Products {
  std::vector<Product> parts;
  Product::Kind kind = Product::kFp32;
  int64_t out = 0, in = 0;

  static Products from(const std::vector<std::vector<torch::Tensor>>& layers) {
    Products p;
    for (const auto& tensors : layers) {
      p.parts.push_back(Product::from(tensors));
      const Product& part = p.parts.back();
      TORCH_CHECK(p.parts.size() == 1 || (part.in == p.in && part.kind == p.kind &&
                                          (part.kind != Product::kInt4 ||
                                           part.int4.group == p.parts[0].int4.group)),
                  "products of one input must share its size and their weight format");
      p.in = part.in, p.kind = part.kind;
      p.out += part.out;
    }
    return p;
  }

  void operator()(const float* x, int64_t rows, float* y) const {
    Int8Activations int8;
    Int4Activations int4;
    if (kind == Product::kInt8) int8 = int8_activations(x, rows, in);
    if (kind == Product::kInt4) int4 = int4_activations(x, rows, in, parts[0].int4.group);
    at::parallel_for(0, out, 64, [&](int64_t begin, int64_t end) {
      int64_t first = 0;  // the part's first output column
      for (const Product& part : parts) {
        const int64_t lo = std::max(begin, first) - first;
        const int64_t hi = std::min(end, first + part.out) - first;
        if (lo < hi) {
          if (kind == Product::kFp32) fp32_rows(x, rows, part.fp32, lo, hi, y + first, out);
          else if (kind == Product::kInt8) int8_rows(int8, part.int8, lo, hi, y + first, out);
          else int4_rows(int4, part.int4, lo, hi, y + first, out);
        }
        first += part.out;
      }
    });
  }
};

// x / rms(x) * weight (RMSNorm), in PyTorch's order of operations.
void rms_norm(const float* x, const float* weight, int64_t n, float eps, float* out) {
  float squares = 0.f;
  for (int64_t i = 0; i < n; ++i) squares += x[i] * x[i];
  const float inverse_rms = 1.f / std::sqrt(squares / float(n) + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = weight[i] * (x[i] * inverse_rms);
}

// Rotate each channel pair (i, i + half) of one head by its RoPE angle, in place:
// x * cos + rotate_half(x) * sin (minillm/rope.py).
void rope(float* head, const float* cos, const float* sin, int64_t head_dim) {
  const int64_t half = head_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float first = head[i], second = head[i + half];
    head[i] = first * cos[i] + (-second) * sin[i];
    head[i + half] = second * cos[i + half] + first * sin[i + half];
  }
}

float silu(float x) { return x / (1.f + std::exp(-x)); }

float* floats(const torch::Tensor& t) { return t.data_ptr<float>(); }

}  // namespace

// The weights of every block (and optionally the final norm and head), held for the life
// of the model.
class DecodeLayers {
 public:
  // Per block, six parts, each a list of products (a product: its list of tensors):
  // {{attn_norm}}, {q, k, v}, {o}, {{mlp_norm}}, {gate, up}, {down}. `head`: empty, or
  // {{{final norm}}, {head}}.
  using Parts = std::vector<std::vector<std::vector<torch::Tensor>>>;
  DecodeLayers(std::vector<Parts> blocks, Parts head, double eps, int64_t heads,
               int64_t kv_heads, int64_t head_dim)
      : blocks_(std::move(blocks)), head_tensors_(std::move(head)), eps_(float(eps)),
        heads_(heads), kv_heads_(kv_heads), head_dim_(head_dim) {
    for (const auto& b : blocks_) {
      TORCH_CHECK(b.size() == 6, "each block takes six parts, got ", b.size());
      weights_.push_back({Products::from(b[1]), Products::from(b[2]), Products::from(b[4]),
                          Products::from(b[5])});
    }
    TORCH_CHECK(head_tensors_.empty() || head_tensors_.size() == 2,
                "the head is {{{norm}}, {product}} or nothing");
    if (!head_tensors_.empty()) head_.push_back(Products::from(head_tensors_[1]));
  }

  // x [rows, hidden] float32, one row per sequence, updated in place; cos, sin [rows,
  // head_dim]: each row's RoPE angles; slots [rows] (-1: a padding row, writes nothing);
  // block_tables [rows, width]; context_lens [rows] (the new token included); one key and
  // one value pool per block, and for an int8 pool one key and one value scale tensor per
  // block (none for float32 pools). `reduce_attention`, `reduce_mlp`: None, or a function called
  // with each block's partial attention (MLP) output [rows, hidden] before it is added (a
  // tensor-parallel all-reduce, in place). Returns the logits [rows, vocab] with a head,
  // else x.
  torch::Tensor step(torch::Tensor x, const torch::Tensor& cos, const torch::Tensor& sin,
                     const torch::Tensor& slots, const torch::Tensor& block_tables,
                     const torch::Tensor& context_lens, const std::vector<torch::Tensor>& key_pools,
                     const std::vector<torch::Tensor>& value_pools,
                     const std::vector<torch::Tensor>& key_scales,
                     const std::vector<torch::Tensor>& value_scales,
                     pybind11::object reduce_attention, pybind11::object reduce_mlp) {
    const int64_t rows = x.size(0), hidden = x.size(1), q_size = heads_ * head_dim_,
                  kv_size = kv_heads_ * head_dim_, qkv_size = q_size + 2 * kv_size;
    TORCH_CHECK(x.scalar_type() == torch::kFloat && x.is_contiguous() && x.dim() == 2,
                "x: contiguous float32 [rows, hidden]");
    TORCH_CHECK(key_pools.size() == blocks_.size() && value_pools.size() == blocks_.size(),
                "one key and one value pool per block");
    TORCH_CHECK(key_scales.size() == value_scales.size() &&
                (key_scales.empty() || key_scales.size() == blocks_.size()),
                "no scales (float32 pools) or one key and one value scale tensor per block");
    TORCH_CHECK(slots.scalar_type() == torch::kLong && block_tables.scalar_type() == torch::kLong &&
                context_lens.scalar_type() == torch::kLong, "slots, tables and lengths: int64");
    TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous() && cos.size(0) == rows,
                "cos and sin: contiguous [rows, head_dim]");
    const int64_t inner = weights_[0][3].in;
    std::vector<float> normed(rows * hidden), qkv(rows * qkv_size), attended(rows * q_size),
        queries(rows * q_size), added(rows * hidden), gate_up(rows * 2 * inner),
        activated(rows * inner);
    torch::Tensor partial = torch::from_blob(added.data(), {rows, hidden}, x.options());
    const int64_t* slot = slots.data_ptr<int64_t>();
    float* h = floats(x);
    for (size_t l = 0; l < blocks_.size(); ++l) {
      const auto& w = weights_[l];
      const PagedPool pool = key_scales.empty()
          ? paged_pool(key_pools[l], value_pools[l])
          : paged_pool(key_pools[l], value_pools[l], key_scales[l], value_scales[l]);
      // Attention: project, rotate, write K and V into the pool, attend, project back.
      for (int64_t r = 0; r < rows; ++r)
        rms_norm(h + r * hidden, floats(blocks_[l][0][0][0]), hidden, eps_, &normed[r * hidden]);
      w[0](normed.data(), rows, qkv.data());
      for (int64_t r = 0; r < rows; ++r) {
        float* q = &qkv[r * qkv_size];
        float *k = q + q_size, *v = k + kv_size;
        const float *c = floats(cos) + r * head_dim_, *s = floats(sin) + r * head_dim_;
        for (int64_t head = 0; head < heads_; ++head) rope(q + head * head_dim_, c, s, head_dim_);
        for (int64_t g = 0; g < kv_heads_; ++g) rope(k + g * head_dim_, c, s, head_dim_);
        std::copy(q, q + q_size, &queries[r * q_size]);
        write_token(pool, slot[r], k, v);
      }
      paged_decode(queries.data(), pool, block_tables.data_ptr<int64_t>(),
                   block_tables.size(1), context_lens.data_ptr<int64_t>(), rows, heads_,
                   attended.data());
      w[1](attended.data(), rows, added.data());
      if (!reduce_attention.is_none()) reduce_attention(partial);
      for (int64_t i = 0; i < rows * hidden; ++i) h[i] += added[i];
      // MLP: SwiGLU.
      for (int64_t r = 0; r < rows; ++r)
        rms_norm(h + r * hidden, floats(blocks_[l][3][0][0]), hidden, eps_, &normed[r * hidden]);
      w[2](normed.data(), rows, gate_up.data());
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t i = 0; i < inner; ++i)
          activated[r * inner + i] = silu(gate_up[r * 2 * inner + i]) *
                                     gate_up[r * 2 * inner + inner + i];
      w[3](activated.data(), rows, added.data());
      if (!reduce_mlp.is_none()) reduce_mlp(partial);
      for (int64_t i = 0; i < rows * hidden; ++i) h[i] += added[i];
    }
    if (head_.empty()) return x;
    for (int64_t r = 0; r < rows; ++r)
      rms_norm(h + r * hidden, floats(head_tensors_[0][0][0]), hidden, eps_, &normed[r * hidden]);
    torch::Tensor logits = torch::empty({rows, head_[0].out}, x.options());
    head_[0](normed.data(), rows, floats(logits));
    return logits;
  }

 private:
  std::vector<Parts> blocks_;  // keeps the weights alive
  Parts head_tensors_;
  std::vector<std::array<Products, 4>> weights_;  // qkv, o, gate_up, down
  std::vector<Products> head_;  // none, or the head
  float eps_;
  int64_t heads_, kv_heads_, head_dim_;
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
  m.def("paged_decode_read", &minillm::paged_decode_read);
  m.def("fp32_linear", &fp32_linear);
  pybind11::class_<minillm::DecodeLayers>(m, "DecodeLayers")
      .def(pybind11::init<std::vector<minillm::DecodeLayers::Parts>,
                          minillm::DecodeLayers::Parts, double, int64_t, int64_t, int64_t>())
      .def("step", &minillm::DecodeLayers::step);
}
