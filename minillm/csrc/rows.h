// The shape handling both linear ops share: x [..., in] as a matrix of rows, y [..., out].
#pragma once

#include <torch/extension.h>

#include <vector>

namespace minillm {

// y [..., out] = product(rows of x, number of rows, y's rows), x float32 [..., in].
template <typename Product>
torch::Tensor over_rows(const torch::Tensor& x, int64_t in, int64_t out, Product product) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat, "x must be float32, not ", x.scalar_type());
  TORCH_CHECK(x.size(-1) == in, "x has ", x.size(-1), " features, the weights ", in);
  const torch::Tensor rows = x.reshape({-1, in}).contiguous();
  torch::Tensor y = torch::empty({rows.size(0), out}, x.options());
  product(rows.data_ptr<float>(), rows.size(0), y.data_ptr<float>());
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = out;
  return y.view(shape);
}

}  // namespace minillm
