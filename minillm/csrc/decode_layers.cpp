// One decode step through every transformer block in one C++ call (minillm/native_decode.py).
//
// The same computation as minillm/model.py's Block.forward for one token at batch 1, with
// int8 x int8 (int8_product.h) or int4 x int8 (int4_product.h) products, written as plain
// loops:
//
//   h = x + o(attention(rope(q), rope(k), v))      q, k, v = qkv(rms_norm(x))
//   x = h + down(silu(gate) * up)                  gate, up = gate_up(rms_norm(h))
//
// Why: compiled by torch.compile, a step is ~330 small kernels and ops; each costs a few
// microseconds to start, ~3 ms of a ~8 ms step on a 2-core CPU. Here the only per-step cost
// besides the arithmetic is one call from Python. The embedding, the final norm and the LM
// head stay in Python (one int8_linear call).

#include <torch/extension.h>

#include <array>
#include <cmath>
#include <vector>

#include "int4_product.h"
#include "int8_product.h"

namespace minillm {

Int8Weights int8_weights(const torch::Tensor& codes, const torch::Tensor& scales,
                         const torch::Tensor& code_sums);  // int8_linear.cpp
Int4Weights int4_weights(const torch::Tensor& codes, const torch::Tensor& scales,
                         const torch::Tensor& zeros);  // w4a8_linear.cpp

namespace {

// One product of a block: int8 weights (int8 codes) or int4 weights (uint8 packed codes).
struct Product {
  bool is_int4;
  Int8Weights int8;
  Int4Weights int4;
  int64_t out, in;

  static Product from(const torch::Tensor& codes, const torch::Tensor& scales,
                      const torch::Tensor& third) {
    if (codes.scalar_type() == torch::kByte) {
      const Int4Weights w = int4_weights(codes, scales, third);
      return {true, {}, w, w.out, w.in};
    }
    const Int8Weights w = int8_weights(codes, scales, third);
    return {false, w, {}, w.out, w.in};
  }

  void operator()(const float* x, float* y) const {
    if (is_int4) int4_product(x, 1, int4, y);
    else int8_product(x, 1, int8, y);
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

// softmax(q K^T / sqrt(d)) V for one query head over the cached steps 0..steps-1.
void attend(const float* q, const float* keys, const float* values, int64_t steps,
            int64_t head_dim, float* scores, float* out) {
  const float root = std::sqrt(float(head_dim));
  float largest = -INFINITY;
  for (int64_t s = 0; s < steps; ++s) {
    float dot = 0.f;
    for (int64_t i = 0; i < head_dim; ++i) dot += q[i] * keys[s * head_dim + i];
    scores[s] = dot / root;
    largest = std::max(largest, scores[s]);
  }
  float total = 0.f;
  for (int64_t s = 0; s < steps; ++s) total += scores[s] = std::exp(scores[s] - largest);
  for (int64_t i = 0; i < head_dim; ++i) out[i] = 0.f;
  for (int64_t s = 0; s < steps; ++s) {
    const float weight = scores[s] / total;
    for (int64_t i = 0; i < head_dim; ++i) out[i] += weight * values[s * head_dim + i];
  }
}

float silu(float x) { return x / (1.f + std::exp(-x)); }

}  // namespace

// The weights of every block, held for the life of the model.
class DecodeLayers {
 public:
  // Per block, 14 tensors: attn_norm; qkv codes, scales, code sums (int8) or zero points
  // (int4); o (3); mlp_norm; gate_up (3); down (3). The projections are fused
  // (minillm/fused_projections.py).
  DecodeLayers(std::vector<std::vector<torch::Tensor>> blocks, double eps, int64_t heads,
               int64_t kv_heads, int64_t head_dim)
      : blocks_(std::move(blocks)), eps_(float(eps)), heads_(heads), kv_heads_(kv_heads),
        head_dim_(head_dim) {
    for (const auto& b : blocks_) {
      TORCH_CHECK(b.size() == 14, "each block takes 14 tensors, got ", b.size());
      weights_.push_back({Product::from(b[1], b[2], b[3]), Product::from(b[4], b[5], b[6]),
                          Product::from(b[8], b[9], b[10]), Product::from(b[11], b[12], b[13])});
    }
  }

  // x [hidden] float32, updated in place; cos, sin [head_dim] for this step's position;
  // keys[l], values[l] [1, kv_heads, slots, head_dim]: this step's K and V are written at
  // slot `position`, and attention reads slots 0..position.
  void step(torch::Tensor x, const torch::Tensor& cos, const torch::Tensor& sin,
            int64_t position, const std::vector<torch::Tensor>& keys,
            const std::vector<torch::Tensor>& values) {
    const int64_t hidden = x.numel(), q_size = heads_ * head_dim_, kv_size = kv_heads_ * head_dim_;
    TORCH_CHECK(x.scalar_type() == torch::kFloat && x.is_contiguous(), "x: contiguous float32");
    TORCH_CHECK(keys.size() == blocks_.size() && values.size() == blocks_.size(),
                "one K and one V tensor per block");
    const int64_t slots = keys[0].size(2);
    TORCH_CHECK(position >= 0 && position < slots, "position ", position,
                " is outside the cache's ", slots, " slots");
    std::vector<float> normed(hidden), qkv(q_size + 2 * kv_size), attended(q_size),
        added(hidden), gate_up(weights_[0][2].out), activated(weights_[0][3].in),
        scores(heads_ * (position + 1));
    float* h = x.data_ptr<float>();
    const float *cos_data = cos.data_ptr<float>(), *sin_data = sin.data_ptr<float>();
    for (size_t l = 0; l < blocks_.size(); ++l) {
      const auto& w = weights_[l];
      float* cached_keys = keys[l].data_ptr<float>();
      float* cached_values = values[l].data_ptr<float>();
      // Attention: project, rotate, append K and V to the cache, attend, project back.
      rms_norm(h, blocks_[l][0].data_ptr<float>(), hidden, eps_, normed.data());
      w[0](normed.data(), qkv.data());
      float *q = qkv.data(), *k = q + q_size, *v = k + kv_size;
      for (int64_t head = 0; head < heads_; ++head)
        rope(q + head * head_dim_, cos_data, sin_data, head_dim_);
      for (int64_t g = 0; g < kv_heads_; ++g) {
        rope(k + g * head_dim_, cos_data, sin_data, head_dim_);
        const int64_t slot = (g * slots + position) * head_dim_;
        std::copy(k + g * head_dim_, k + (g + 1) * head_dim_, cached_keys + slot);
        std::copy(v + g * head_dim_, v + (g + 1) * head_dim_, cached_values + slot);
      }
      const int64_t group = heads_ / kv_heads_;
      at::parallel_for(0, heads_, 1, [&](int64_t begin, int64_t end) {
        for (int64_t head = begin; head < end; ++head) {
          const int64_t g = head / group;
          attend(q + head * head_dim_, cached_keys + g * slots * head_dim_,
                 cached_values + g * slots * head_dim_, position + 1, head_dim_,
                 &scores[head * (position + 1)], &attended[head * head_dim_]);
        }
      });
      w[1](attended.data(), added.data());
      for (int64_t i = 0; i < hidden; ++i) h[i] += added[i];
      // MLP: SwiGLU.
      rms_norm(h, blocks_[l][7].data_ptr<float>(), hidden, eps_, normed.data());
      w[2](normed.data(), gate_up.data());
      const int64_t inner = w[3].in;
      for (int64_t i = 0; i < inner; ++i)
        activated[i] = silu(gate_up[i]) * gate_up[inner + i];
      w[3](activated.data(), added.data());
      for (int64_t i = 0; i < hidden; ++i) h[i] += added[i];
    }
  }

 private:
  std::vector<std::vector<torch::Tensor>> blocks_;  // keeps the weights alive
  std::vector<std::array<Product, 4>> weights_;  // qkv, o, gate_up, down
  float eps_;
  int64_t heads_, kv_heads_, head_dim_;
};

}  // namespace minillm

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  pybind11::class_<minillm::DecodeLayers>(m, "DecodeLayers")
      .def(pybind11::init<std::vector<std::vector<torch::Tensor>>, double, int64_t, int64_t,
                          int64_t>())
      .def("step", &minillm::DecodeLayers::step);
}
