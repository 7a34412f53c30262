// What makes a block of the native decode step (decode_layers.cpp) one family's: the
// per-block switches, and the element-wise pieces of a block (norms, RoPE, gates).
//
// Llama's block (SmolLM2) has every switch off. The others (minillm/config.py's table):
//
//   Qwen2    biases on q, k and v, added after their product
//   Qwen3    QK-norm: an RMSNorm over each head of q and of k, before RoPE
//   Mistral  a sliding window: the query at position p sees the keys at j > p - window
//   Gemma 3  QK-norm, norms on the outputs of attention and of the MLP before each is
//            added to the residual stream, queries times sqrt(head_dim /
//            query_pre_attn_scalar), a GeGLU (tanh GELU) MLP, and per layer a window (local
//            layers) and a RoPE table (local layers have their own base)
//
// Gemma's (1 + w) norms arrive as their effective weights 1 + w (computed in float32 in
// Python, as GemmaRMSNorm does), so one rms_norm serves every family. A switch is tested
// once per block, never per element: a Llama step does no extra work.
#pragma once

#include <torch/extension.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

namespace minillm {

// x / rms(x) * weight (RMSNorm), in PyTorch's order of operations; out may be x.
inline void rms_norm(const float* x, const float* weight, int64_t n, float eps, float* out) {
  float squares = 0.f;
  for (int64_t i = 0; i < n; ++i) squares += x[i] * x[i];
  const float inverse_rms = 1.f / std::sqrt(squares / float(n) + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = weight[i] * (x[i] * inverse_rms);
}

// Each of `heads` heads of `head_dim` numbers normalised in place (QK-norm).
inline void norm_heads(float* x, const float* weight, int64_t heads, int64_t head_dim,
                       float eps) {
  for (int64_t h = 0; h < heads; ++h)
    rms_norm(x + h * head_dim, weight, head_dim, eps, x + h * head_dim);
}

// Rotate each channel pair (i, i + half) of one head by its RoPE angle, in place:
// x * cos + rotate_half(x) * sin (minillm/rope.py).
inline void rope(float* head, const float* cos, const float* sin, int64_t head_dim) {
  const int64_t half = head_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float first = head[i], second = head[i + half];
    head[i] = first * cos[i] + (-second) * sin[i];
    head[i + half] = second * cos[i + half] + first * sin[i + half];
  }
}

inline float silu(float x) { return x / (1.f + std::exp(-x)); }

// GELU's tanh approximation, in PyTorch's order of operations (F.gelu(x, approximate="tanh")):
// 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))).
inline float gelu_tanh(float x) {
  constexpr float kBeta = float(M_SQRT2 * M_2_SQRTPI * 0.5), kKappa = 0.044715f;
  const float inner = kBeta * (x + kKappa * (x * x * x));
  return 0.5f * x * (1.f + std::tanh(inner));
}

// One block's switches. A tensor option is held (keeping its numbers alive) and read
// through its pointer, null when the block does not have it.
struct BlockOptions {
  std::vector<torch::Tensor> held;            // the tensors behind the pointers below
  const float* qkv_bias = nullptr;            // [q + k + v widths]: q, k and v biases
  const float* q_norm = nullptr;              // [head_dim]: QK-norm's weights
  const float* k_norm = nullptr;              // [head_dim]
  const float* attention_out_norm = nullptr;  // [hidden]: the attention output's norm
  const float* mlp_out_norm = nullptr;        // [hidden]: the MLP output's norm
  int64_t window = 0;      // keys window or more behind the query are not seen (0: none)
  int64_t rope_table = 0;  // which of the step's RoPE tables the block reads

  // From the optional tensors by name, each checked against the block's sizes.
  static BlockOptions from(const std::map<std::string, torch::Tensor>& named, int64_t window,
                           int64_t rope_table, int64_t qkv_size, int64_t head_dim,
                           int64_t hidden) {
    TORCH_CHECK(window >= 0 && rope_table >= 0, "a window (0: none) and a RoPE table index "
                "are non-negative, got ", window, " and ", rope_table);
    BlockOptions o;
    o.window = window, o.rope_table = rope_table;
    auto take = [&](const char* name, int64_t size, const float** into) {
      const auto it = named.find(name);
      if (it == named.end()) return;
      const torch::Tensor& t = it->second;
      TORCH_CHECK(t.scalar_type() == torch::kFloat && t.is_contiguous() && t.dim() == 1 &&
                  t.size(0) == size, "block option ", name, " must be a contiguous float32 "
                  "vector of ", size, " numbers");
      o.held.push_back(t);
      *into = t.data_ptr<float>();
    };
    take("qkv_bias", qkv_size, &o.qkv_bias);
    take("q_norm", head_dim, &o.q_norm);
    take("k_norm", head_dim, &o.k_norm);
    take("attention_out_norm", hidden, &o.attention_out_norm);
    take("mlp_out_norm", hidden, &o.mlp_out_norm);
    TORCH_CHECK(o.held.size() == named.size(), "unknown block options: the step takes "
                "qkv_bias, q_norm, k_norm, attention_out_norm and mlp_out_norm");
    return o;
  }
};

}  // namespace minillm
