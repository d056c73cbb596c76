// The CPU GEMM (Eigen, kernels/cpu/linalg.cpp): the one kernel of the CPU
// that is not written over kernels/loop.h, compiled by the C++ compiler only
// (Eigen stays out of nvcc). Private to kernels/linalg.cpp and the CPU
// convolution (kernels/cpu/conv.cpp).
#pragma once

#include "qgrad/kernels/linalg.h"

namespace qgrad::kernels::cpu {

void gemm(const GemmShape& s, const Tensor& a, const Tensor& b, const Tensor& c, bool accumulate);
// The same product on raw row-major arrays of the compute type (the same
// fixed row blocks), for callers that hold their operands in buffers.
void gemm_raw(const GemmShape& s, const float* a, const float* b, float* c, bool accumulate);
void gemm_raw(const GemmShape& s, const double* a, const double* b, double* c, bool accumulate);

}  // namespace qgrad::kernels::cpu
