// The op minillm::int8_linear: int8_product (int8_product.h) on tensors.
//
// Why a kernel of our own rather than FBGEMM's quantized::linear_dynamic, which computes the
// same numbers: a decode step is 121 products of one row, and FBGEMM spends ~13 us per call
// before it reads a weight, longer than reading a whole weight here.

#include <torch/extension.h>

#include "int8_product.h"
#include "rows.h"

namespace minillm {

Int8Weights int8_weights(const torch::Tensor& codes, const torch::Tensor& scales,
                         const torch::Tensor& code_sums) {
  TORCH_CHECK(codes.scalar_type() == torch::kChar && scales.scalar_type() == torch::kFloat &&
              code_sums.scalar_type() == torch::kInt && codes.is_contiguous(),
              "int8 weights are contiguous int8 codes, float32 scales and int32 code sums");
  return {codes.data_ptr<int8_t>(), scales.data_ptr<float>(), code_sums.data_ptr<int32_t>(),
          codes.size(0), codes.size(1)};
}

// x [..., in] float32 -> [..., out] float32.
torch::Tensor int8_linear(const torch::Tensor& x, const torch::Tensor& codes,
                          const torch::Tensor& scales, const torch::Tensor& code_sums) {
  const torch::Tensor contiguous_codes = codes.contiguous();
  const Int8Weights weights = int8_weights(contiguous_codes, scales, code_sums);
  return over_rows(x, weights.in, weights.out, [&](const float* rows, int64_t n, float* y) {
    int8_product(rows, n, weights, y);
  });
}

}  // namespace minillm

// The op's schema is defined in Python (minillm/ops.py), with its shape function for
// torch.compile; this file provides the CPU implementation.
TORCH_LIBRARY_IMPL(minillm, CPU, m) { m.impl("int8_linear", &minillm::int8_linear); }
