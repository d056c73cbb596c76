// sqrt and its backward, one source for both devices (kernels/loop.h): one
// index per element, computed in the dtype's op math (f32 for f16/bf16).
#include "qgrad/kernels/unary.h"

#include <cmath>

#include "qgrad/kernels/loop.h"

namespace qgrad::kernels {

namespace {

// sqrt is correctly rounded in IEEE 754 (CPU: sqrtss/sqrtsd; CUDA: sqrtf and
// sqrt without -use_fast_math): both devices give the same bits.
QGRAD_HD float sqrt_of(float x) { return sqrtf(x); }
QGRAD_HD double sqrt_of(double x) { return ::sqrt(x); }

template <class T>
struct Sqrt {
  const T* x;
  T* y;
  QGRAD_HD void operator()(std::int64_t i) const { y[i] = T(sqrt_of(op_math_t<T>(x[i]))); }
};
template <class T>
struct SqrtBackward {
  const T* dy;
  const T* y;
  T* dx;
  QGRAD_HD void operator()(std::int64_t i) const {
    using M = op_math_t<T>;
    dx[i] = T(M(dy[i]) * M(0.5) / M(y[i]));
  }
};

}  // namespace

void sqrt(const Tensor& x, const Tensor& y) {
  dispatch_floating(y.dtype(), "sqrt", [&](auto tag) {
    using T = typename decltype(tag)::type;
    for_each_index(y.device(), y.numel(),
                   Sqrt<T>{static_cast<const T*>(x.data_ptr()), static_cast<T*>(y.data_ptr())}, "sqrt");
  });
}

void sqrt_backward(const Tensor& dy, const Tensor& y, const Tensor& dx) {
  dispatch_floating(dx.dtype(), "sqrt_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    for_each_index(dx.device(), dx.numel(),
                   SqrtBackward<T>{static_cast<const T*>(dy.data_ptr()), static_cast<const T*>(y.data_ptr()),
                                   static_cast<T*>(dx.data_ptr())},
                   "sqrt_backward");
  });
}

}  // namespace qgrad::kernels
