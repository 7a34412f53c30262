// The op minillm::int8_linear: int8_product (int8_product.h) on tensors.
//
// Why a kernel of our own rather than FBGEMM's quantized::linear_dynamic, which computes the
// same numbers: a decode step is 121 products of one row, and FBGEMM spends ~13 us per call
// before it reads a weight, longer than reading a whole weight here.

#include <torch/extension.h>

#include "int8_product.h"

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
  TORCH_CHECK(x.scalar_type() == torch::kFloat, "int8_linear takes float32 x, int8 codes, "
              "float32 scales and int32 code sums");
  const torch::Tensor contiguous_codes = codes.contiguous();
  const Int8Weights weights = int8_weights(contiguous_codes, scales, code_sums);
  TORCH_CHECK(x.size(-1) == weights.in, "x has ", x.size(-1), " features, the weights ",
              weights.in);
  const torch::Tensor rows = x.reshape({-1, weights.in}).contiguous();
  torch::Tensor y = torch::empty({rows.size(0), weights.out}, x.options());
  int8_product(rows.data_ptr<float>(), rows.size(0), weights, y.data_ptr<float>());
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = weights.out;
  return y.view(shape);
}

}  // namespace minillm

// The op's schema is defined in Python (minillm/quant/int8_activations.py), with its shape
// function for torch.compile; this file provides the CPU implementation.
TORCH_LIBRARY_IMPL(minillm, CPU, m) { m.impl("int8_linear", &minillm::int8_linear); }
