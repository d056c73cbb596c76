// The binary kernels, one source for both devices (kernels/loop.h).
#include "qgrad/kernels/binary.h"

#include "qgrad/kernels/broadcast.h"
#include "qgrad/kernels/formulas/cast.h"
#include "qgrad/kernels/loop.h"

namespace qgrad::kernels {

namespace {

// Inputs of out's shape: both offsets are the output index.
struct SameShapeIndex {
  QGRAD_HD void offsets(std::int64_t i, std::int64_t& oa, std::int64_t& ob) const { oa = ob = i; }
};

// Index is SameShapeIndex or BroadcastIndex (broadcast.h).
template <class T, class Index>
struct Binary {
  formulas::BinaryOp op;
  const T* x;
  const T* y;
  T* o;
  Index index;
  QGRAD_HD void operator()(std::int64_t i) const {
    using M = op_math_t<T>;
    std::int64_t oa, ob;
    index.offsets(i, oa, ob);
    o[i] = T(formulas::binary_apply<M>(op, M(x[oa]), M(y[ob])));
  }
};

template <class T>
struct BinaryScalar {
  formulas::BinaryOp op;
  const T* x;
  op_math_t<T> s;
  T* o;
  QGRAD_HD void operator()(std::int64_t i) const {
    using M = op_math_t<T>;
    o[i] = T(formulas::binary_apply<M>(op, M(x[i]), s));
  }
};

// One output element per index, summing in one fixed order, so CPU and
// CUDA agree bit for bit (and the result is deterministic).
template <class T>
struct SumToShape {
  const T* x;
  T* o;
  ReduceIndex ri;
  QGRAD_HD void operator()(std::int64_t j) const {
    using M = op_math_t<T>;
    const std::int64_t base = ri.base(j);
    M acc = M(0);
    for (std::int64_t r = 0; r < ri.red_count; ++r) acc += M(x[base + ri.reduced(r)]);
    o[j] = T(acc);
  }
};

}  // namespace

void binary(formulas::BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  dispatch_floating(out.dtype(), "binary", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* x = static_cast<const T*>(a.data_ptr());
    const T* y = static_cast<const T*>(b.data_ptr());
    T* o = static_cast<T*>(out.data_ptr());
    if (a.shape() == b.shape()) {
      for_each_index(out.device(), out.numel(), Binary<T, SameShapeIndex>{op, x, y, o, {}}, "binary");
      return;
    }
    const BroadcastIndex bi = make_broadcast_index(a.shape(), b.shape(), out.shape());
    for_each_index(out.device(), out.numel(), Binary<T, BroadcastIndex>{op, x, y, o, bi}, "binary");
  });
}

void binary_scalar(formulas::BinaryOp op, const Tensor& a, double b, const Tensor& out) {
  dispatch_floating(out.dtype(), "binary_scalar", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const op_math_t<T> s = op_math_t<T>(formulas::cast_value<T>(b));
    for_each_index(out.device(), out.numel(),
                   BinaryScalar<T>{op, static_cast<const T*>(a.data_ptr()), s, static_cast<T*>(out.data_ptr())},
                   "binary_scalar");
  });
}

void sum_to_shape(const Tensor& in, const Tensor& out) {
  dispatch_floating(out.dtype(), "sum_to_shape", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const ReduceIndex ri = make_reduce_index(in.shape(), out.shape());
    for_each_index(out.device(), out.numel(),
                   SumToShape<T>{static_cast<const T*>(in.data_ptr()), static_cast<T*>(out.data_ptr()), ri},
                   "sum_to_shape");
  });
}

}  // namespace qgrad::kernels
