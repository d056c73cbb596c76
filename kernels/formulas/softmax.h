// Scalar formulas of log_softmax and cross_entropy, shared by CPU and CUDA.
// M is the math type: float for f32/f16/bf16, double for f64.
#pragma once

#include <cmath>
#include <limits>

#include "core/half.h"

namespace qgrad::formulas {

template <class M>
QGRAD_HD M exp_m(M x) {
#if defined(__CUDA_ARCH__)
  if constexpr (sizeof(M) == 4) return ::expf(x);
  else return ::exp(x);
#else
  return std::exp(x);
#endif
}

template <class M>
QGRAD_HD M log_m(M x) {
#if defined(__CUDA_ARCH__)
  if constexpr (sizeof(M) == 4) return ::logf(x);
  else return ::log(x);
#else
  return std::log(x);
#endif
}

// Running max that lets NaN win, so a NaN row gives NaN outputs.
template <class M>
QGRAD_HD M max_nan(M a, M b) {
  return (a != a || a > b) ? a : b;
}

template <class M>
QGRAD_HD M quiet_nan() {
  return std::numeric_limits<M>::quiet_NaN();
}

// log_softmax backward at one element: dx = dy - exp(y) * sum(dy).
template <class M>
QGRAD_HD M log_softmax_grad(M dy, M y, M sum_dy) {
  return dy - exp_m(y) * sum_dy;
}

// cross_entropy backward at one element: (p - [c == label]) * g / B.
template <class M>
QGRAD_HD M cross_entropy_grad(M p, bool is_label, M g_over_b) {
  return (p - (is_label ? M(1) : M(0))) * g_over_b;
}

}  // namespace qgrad::formulas
