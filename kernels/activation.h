// Kernels of relu: the forward packs the x > 0 mask its backward needs.
#pragma once

#include "qgrad/core/tensor.h"

namespace qgrad::kernels {

// out = relu(in); when mask is defined (s32, bitmask_words(n) words) it
// receives bit i = in[i] > 0.
void relu(const Tensor& in, const Tensor& out, const Tensor& mask);
// dx[i] = mask bit i ? g[i] : 0.
void relu_backward(const Tensor& g, const Tensor& mask, const Tensor& dx);

}  // namespace qgrad::kernels
