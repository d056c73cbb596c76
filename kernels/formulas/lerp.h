// Scalar formulas of lerp, shared by the CPU and CUDA kernels.
//
// Forward (PyTorch's Lerp.h, two branches for accuracy near both ends):
//   |w| < 0.5 ? a + w * (b - a) : b - (b - a) * (1 - w)
// in op math (float for f16/bf16). PyTorch evaluates each branch as one
// fused multiply-add on both of its devices (vec::fmadd in the CPU kernel,
// nvcc's default contraction in the CUDA one), so qgrad calls fma()
// explicitly: fma(w, b - a, a) and fma(-(b - a), 1 - w, b), the contraction
// of PyTorch's `end - (end - self) * (1 - weight)`. The product's sign is
// the one that expression gives, which matters when the result is zero:
// at w = 1 the product is a zero of sign -(b - a), so b = -0 gives +0 for
// a > 0 and -0 for a < 0, as PyTorch does (fma(w - 1, b - a, b) has the same
// value everywhere else but the opposite zero). An explicit fma is one
// correctly rounded operation, identical on CPU and GPU whatever the
// contraction flags.
//
// Backward (derivatives.yaml): da = dy * (1 - w), db = dy * w,
// dw = dy * (b - a), each factor rounded to the storage type first (PyTorch
// computes (1 - w) and (b - a) as tensors), then reduced to each input's
// shape by sum_to_shape.
#pragma once

#include <cmath>

#include "qgrad/core/half.h"

namespace qgrad::formulas {

template <class M>
QGRAD_HD M fused_multiply_add(M a, M b, M c) {
#if defined(__CUDA_ARCH__)
  return fma(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

template <class M>
QGRAD_HD M lerp_value(M a, M b, M w) {
  const M d = b - a;
  const M aw = w < M(0) ? -w : w;
  return aw < M(0.5) ? fused_multiply_add(w, d, a) : fused_multiply_add(-d, M(1) - w, b);
}

// The backward factors, each rounded to T as PyTorch's tensor ops do.
template <class T>
QGRAD_HD T lerp_one_minus(T w) {
  using M = op_math_t<T>;
  return T(M(1) - static_cast<M>(w));
}
template <class T>
QGRAD_HD T mul_round(T x, T y) {
  using M = op_math_t<T>;
  return T(static_cast<M>(x) * static_cast<M>(y));
}
template <class T>
QGRAD_HD T sub_round(T x, T y) {
  using M = op_math_t<T>;
  return T(static_cast<M>(x) - static_cast<M>(y));
}

}  // namespace qgrad::formulas
