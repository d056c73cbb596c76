#include "qgrad/kernels/reduce.h"

#include "qgrad/kernels/cpu/parallel.h"

namespace qgrad::kernels::cpu {

void sum_axis(const Tensor& in, const Tensor& out, const AxisView& v, bool mean) {
  dispatch_floating(out.dtype(), "sum", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using M = op_math_t<T>;
    const T* x = static_cast<const T*>(in.data_ptr());
    T* o = static_cast<T*>(out.data_ptr());
    parallel_for(v.outer * v.inner, [&](std::int64_t idx) {
      const M acc = sum_strided(x + v.base(idx), v.n, v.inner);
      o[idx] = T(mean ? acc / M(v.n) : acc);
    });
  });
}

void expand_axis(const Tensor& in, const Tensor& out, const AxisView& v, double scale) {
  dispatch_floating(out.dtype(), "expand_axis", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using M = op_math_t<T>;
    const T* x = static_cast<const T*>(in.data_ptr());
    T* o = static_cast<T*>(out.data_ptr());
    const M s = M(scale);
    parallel_for(out.numel(), [&](std::int64_t i) { o[i] = T(M(x[(i / (v.n * v.inner)) * v.inner + i % v.inner]) * s); });
  });
}

void argmax_axis(const Tensor& in, const Tensor& out, const AxisView& v) {
  dispatch_floating(in.dtype(), "argmax", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* x = static_cast<const T*>(in.data_ptr());
    auto* o = static_cast<std::int64_t*>(out.data_ptr());
    parallel_for(v.outer * v.inner, [&](std::int64_t idx) { o[idx] = argmax_strided(x + v.base(idx), v.n, v.inner); });
  });
}

}  // namespace qgrad::kernels::cpu
