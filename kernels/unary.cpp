// sqrt and its backward, one source for both devices (kernels/loop.h's
// map_elements), computed in the dtype's op math (f32 for f16/bf16).
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
  QGRAD_HD T operator()(std::int64_t, T x) const { return T(sqrt_of(op_math_t<T>(x))); }
};
template <class T>
struct SqrtBackward {
  QGRAD_HD T operator()(std::int64_t, T dyv, T yv) const {
    using M = op_math_t<T>;
    return T(M(dyv) * M(0.5) / M(yv));
  }
};

}  // namespace

void sqrt(const Tensor& x, const Tensor& y) {
  dispatch_floating(y.dtype(), "sqrt", [&](auto tag) {
    using T = typename decltype(tag)::type;
    map_elements(y.device(), y.numel(), static_cast<const T*>(x.data_ptr()), static_cast<T*>(y.data_ptr()), Sqrt<T>{},
                 "sqrt");
  });
}

void sqrt_backward(const Tensor& dy, const Tensor& y, const Tensor& dx) {
  dispatch_floating(dx.dtype(), "sqrt_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    map_elements(dx.device(), dx.numel(), static_cast<const T*>(dy.data_ptr()), static_cast<const T*>(y.data_ptr()),
                 static_cast<T*>(dx.data_ptr()), SqrtBackward<T>{}, "sqrt_backward");
  });
}

}  // namespace qgrad::kernels
