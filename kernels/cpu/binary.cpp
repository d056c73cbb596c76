#include "qgrad/kernels/binary.h"

#include "qgrad/kernels/broadcast.h"
#include "qgrad/kernels/cpu/parallel.h"
#include "qgrad/kernels/formulas/cast.h"

namespace qgrad::kernels::cpu {

void binary(formulas::BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  dispatch_floating(out.dtype(), "binary", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using M = op_math_t<T>;
    const T* x = static_cast<const T*>(a.data_ptr());
    const T* y = static_cast<const T*>(b.data_ptr());
    T* o = static_cast<T*>(out.data_ptr());
    if (a.shape() == b.shape()) {
      parallel_for(out.numel(), [&](std::int64_t i) { o[i] = T(formulas::binary_apply<M>(op, M(x[i]), M(y[i]))); });
      return;
    }
    const BroadcastIndex bi = make_broadcast_index(a.shape(), b.shape(), out.shape());
    parallel_for(out.numel(), [&](std::int64_t i) {
      std::int64_t oa, ob;
      bi.offsets(i, oa, ob);
      o[i] = T(formulas::binary_apply<M>(op, M(x[oa]), M(y[ob])));
    });
  });
}

void binary_scalar(formulas::BinaryOp op, const Tensor& a, double b, const Tensor& out) {
  dispatch_floating(out.dtype(), "binary_scalar", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using M = op_math_t<T>;
    const M s = M(formulas::cast_value<T>(b));
    const T* x = static_cast<const T*>(a.data_ptr());
    T* o = static_cast<T*>(out.data_ptr());
    parallel_for(out.numel(), [&](std::int64_t i) { o[i] = T(formulas::binary_apply<M>(op, M(x[i]), s)); });
  });
}

void sum_to_shape(const Tensor& in, const Tensor& out) {
  dispatch_floating(out.dtype(), "sum_to_shape", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using M = op_math_t<T>;
    const T* x = static_cast<const T*>(in.data_ptr());
    T* o = static_cast<T*>(out.data_ptr());
    const ReduceIndex ri = make_reduce_index(in.shape(), out.shape());
    parallel_for(out.numel(), [&](std::int64_t j) {
      const std::int64_t base = ri.base(j);
      M acc = M(0);
      for (std::int64_t r = 0; r < ri.red_count; ++r) acc += M(x[base + ri.reduced(r)]);
      o[j] = T(acc);
    });
  });
}

}  // namespace qgrad::kernels::cpu
