// The op minillm::w4a8_linear: int4_product (int4_product.h) on tensors.

#include <torch/extension.h>

#include "int4_product.h"
#include "rows.h"

namespace minillm {

Int4Weights int4_weights(const torch::Tensor& codes, const torch::Tensor& scales,
                         const torch::Tensor& zeros) {
  TORCH_CHECK(codes.scalar_type() == torch::kByte && codes.dim() == 3 && codes.is_contiguous() &&
              scales.scalar_type() == torch::kHalf && zeros.scalar_type() == torch::kHalf &&
              scales.is_contiguous() && zeros.is_contiguous(),
              "int4 weights are contiguous uint8 codes [out, groups, group / 2] and fp16 "
              "scales and zero points [out, groups]");
  const int64_t group = 2 * codes.size(2);
  return {codes.data_ptr<uint8_t>(), scales.data_ptr<c10::Half>(), zeros.data_ptr<c10::Half>(),
          codes.size(0), codes.size(1) * group, group};
}

// x [..., in] float32 -> [..., out] float32.
torch::Tensor w4a8_linear(const torch::Tensor& x, const torch::Tensor& codes,
                          const torch::Tensor& scales, const torch::Tensor& zeros) {
  const Int4Weights weights = int4_weights(codes, scales, zeros);
  return over_rows(x, weights.in, weights.out, [&](const float* rows, int64_t n, float* y) {
    int4_product(rows, n, weights, y);
  });
}

}  // namespace minillm

// Schema, shape function and Python reference: minillm/ops.py.
TORCH_LIBRARY_IMPL(minillm, CPU, m) { m.impl("w4a8_linear", &minillm::w4a8_linear); }
