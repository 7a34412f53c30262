// The products of the native decode step (decode_layers.cpp): one linear layer's weights in
// any of the step's formats, and the layers that share an input computed as one.
#pragma once

#include <torch/extension.h>

#include <algorithm>
#include <vector>

#include "fp32_product.h"
#include "int4_product.h"
#include "int8_product.h"

namespace minillm {

Int8Weights int8_weights(const torch::Tensor& codes, const torch::Tensor& scales,
                         const torch::Tensor& code_sums);  // int8_linear.cpp
Int4Weights int4_weights(const torch::Tensor& codes, const torch::Tensor& scales,
                         const torch::Tensor& zeros);  // w4a8_linear.cpp

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

}  // namespace minillm
