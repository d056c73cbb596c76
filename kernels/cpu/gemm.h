// The CPU GEMM (Eigen, kernels/cpu/linalg.cpp): the one kernel of the CPU
// that is not written over kernels/loop.h, compiled by the C++ compiler only
// (Eigen stays out of nvcc). Private to kernels/linalg.cpp.
#pragma once

#include "qgrad/kernels/linalg.h"

namespace qgrad::kernels::cpu {

void gemm(const GemmShape& s, const Tensor& a, const Tensor& b, const Tensor& c, bool accumulate);

}  // namespace qgrad::kernels::cpu
