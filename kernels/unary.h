// Kernels of the elementwise unary math ops: sqrt (forward and backward).
#pragma once

#include "qgrad/core/tensor.h"

namespace qgrad::kernels {

// y = sqrt(x) elementwise (IEEE: correctly rounded in f32/f64 on both
// devices; -0 -> -0, x < 0 -> NaN); x, y share a floating dtype and device.
void sqrt(const Tensor& x, const Tensor& y);
// dx = dy * 0.5 / y (y = sqrt(x), the saved output), in the dtype's op math.
void sqrt_backward(const Tensor& dy, const Tensor& y, const Tensor& dx);

}  // namespace qgrad::kernels
