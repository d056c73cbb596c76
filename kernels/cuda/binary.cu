#include "qgrad/kernels/binary.h"

#include "qgrad/kernels/broadcast.h"
#include "qgrad/kernels/cuda/launch.cuh"
#include "qgrad/kernels/formulas/cast.h"

namespace qgrad::kernels::cuda {

namespace {

template <class T>
void binary_impl(formulas::BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  using M = op_math_t<T>;
  const T* x = static_cast<const T*>(a.data_ptr());
  const T* y = static_cast<const T*>(b.data_ptr());
  T* o = static_cast<T*>(out.data_ptr());
  const int dev = out.device().index;
  if (a.shape() == b.shape()) {
    launch_elementwise(dev, out.numel(), [=] __device__(std::int64_t i) {
      o[i] = T(formulas::binary_apply<M>(op, M(x[i]), M(y[i])));
    });
    return;
  }
  const BroadcastIndex bi = make_broadcast_index(a.shape(), b.shape(), out.shape());
  launch_elementwise(dev, out.numel(), [=] __device__(std::int64_t i) {
    std::int64_t oa, ob;
    bi.offsets(i, oa, ob);
    o[i] = T(formulas::binary_apply<M>(op, M(x[oa]), M(y[ob])));
  });
}

template <class T>
void binary_scalar_impl(formulas::BinaryOp op, const Tensor& a, double b, const Tensor& out) {
  using M = op_math_t<T>;
  const M s = M(formulas::cast_value<T>(b));
  const T* x = static_cast<const T*>(a.data_ptr());
  T* o = static_cast<T*>(out.data_ptr());
  launch_elementwise(out.device().index, out.numel(),
                     [=] __device__(std::int64_t i) { o[i] = T(formulas::binary_apply<M>(op, M(x[i]), s)); });
}

// One thread per output element, summing in the same order as the CPU, so
// the two agree bit for bit (and the result is deterministic).
template <class T>
void sum_to_shape_impl(const Tensor& in, const Tensor& out) {
  using M = op_math_t<T>;
  const T* x = static_cast<const T*>(in.data_ptr());
  T* o = static_cast<T*>(out.data_ptr());
  const ReduceIndex ri = make_reduce_index(in.shape(), out.shape());
  launch_elementwise(out.device().index, out.numel(), [=] __device__(std::int64_t j) {
    const std::int64_t base = ri.base(j);
    M acc = M(0);
    for (std::int64_t r = 0; r < ri.red_count; ++r) acc += M(x[base + ri.reduced(r)]);
    o[j] = T(acc);
  });
}

}  // namespace

void binary(formulas::BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  dispatch_floating(out.dtype(), "binary", [&](auto tag) { binary_impl<typename decltype(tag)::type>(op, a, b, out); });
}

void binary_scalar(formulas::BinaryOp op, const Tensor& a, double b, const Tensor& out) {
  dispatch_floating(out.dtype(), "binary_scalar",
                    [&](auto tag) { binary_scalar_impl<typename decltype(tag)::type>(op, a, b, out); });
}

void sum_to_shape(const Tensor& in, const Tensor& out) {
  dispatch_floating(out.dtype(), "sum_to_shape",
                    [&](auto tag) { sum_to_shape_impl<typename decltype(tag)::type>(in, out); });
}

}  // namespace qgrad::kernels::cuda
