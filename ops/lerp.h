// lerp(a, b, weight) = a + weight * (b - a), with PyTorch's two-branch
// evaluation; scalar or tensor weight, numpy broadcasting. Differentiable
// in a, b and a tensor weight. See docs/ops.md.
#pragma once

#include "qgrad/core/tensor.h"

namespace qgrad {

Tensor lerp(const Tensor& a, const Tensor& b, double weight);
Tensor lerp(const Tensor& a, const Tensor& b, const Tensor& weight);

}  // namespace qgrad
