// The CPU convolution (kernels/cpu/conv.cpp): im2col and the Eigen GEMM of
// kernels/cpu/linalg.cpp, compiled by the C++ compiler only. Private to
// kernels/conv.cpp.
#pragma once

#include "qgrad/kernels/conv.h"

namespace qgrad::kernels::cpu {

void conv2d_forward(const Conv2dShape& s, const Tensor& x, const Tensor& weight, const Tensor& y, bool accumulate);
void conv2d_backward_input(const Conv2dShape& s, const Tensor& dy, const Tensor& weight, const Tensor& dx);
void conv2d_backward_weight(const Conv2dShape& s, const Tensor& x, const Tensor& dy, const Tensor& dweight);

}  // namespace qgrad::kernels::cpu
