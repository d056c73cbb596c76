// Kernels of lerp: forward and fused backward, with broadcasting (the
// output shape is the broadcast of a, b and a tensor weight).
#pragma once

#include "qgrad/core/tensor.h"
#include "qgrad/kernels/broadcast.h"
#include "qgrad/kernels/formulas/lerp.h"

namespace qgrad::kernels {

// The operands of one lerp launch: `w` undefined means the scalar `w_scalar`.
struct LerpArgs {
  Tensor a, b, w;
  double w_scalar = 0.0;
};

// Offsets of a, b and a tensor weight for element i of the output.
struct LerpIndex {
  bool same = true;  // every operand has the output's shape (or w is a scalar)
  BroadcastIndex ab, ww;
  QGRAD_HD void offsets(std::int64_t i, std::int64_t& ia, std::int64_t& ib, std::int64_t& iw) const {
    if (same) {
      ia = ib = iw = i;
      return;
    }
    ab.offsets(i, ia, ib);
    std::int64_t unused;
    ww.offsets(i, iw, unused);
  }
};
LerpIndex make_lerp_index(const LerpArgs& args, const Shape& out);

// The per-element work of forward and backward, shared by both devices.
template <class T>
struct LerpElems {
  using M = op_math_t<T>;
  const T* a = nullptr;
  const T* b = nullptr;
  const T* w = nullptr;     // null: scalar weight
  M wm = M(0);              // scalar weight in op math
  M one_minus_wm = M(1);    // 1 - weight computed in double, then op math
  QGRAD_HD T forward(std::int64_t ia, std::int64_t ib, std::int64_t iw) const {
    return T(formulas::lerp_value<M>(M(a[ia]), M(b[ib]), w ? M(w[iw]) : wm));
  }
  QGRAD_HD T grad_a(T g, std::int64_t iw) const {
    return w ? formulas::mul_round(g, formulas::lerp_one_minus(w[iw])) : T(M(g) * one_minus_wm);
  }
  QGRAD_HD T grad_b(T g, std::int64_t iw) const { return w ? formulas::mul_round(g, w[iw]) : T(M(g) * wm); }
  QGRAD_HD T grad_w(T g, std::int64_t ia, std::int64_t ib) const {
    return formulas::mul_round(g, formulas::sub_round(b[ib], a[ia]));
  }
};

// The data of an optional tensor, or null.
template <class T>
T* data_or_null(const Tensor& t) {
  return t.defined() ? static_cast<T*>(t.data_ptr()) : nullptr;
}

template <class T>
LerpElems<T> make_lerp_elems(const LerpArgs& args) {
  using M = op_math_t<T>;
  LerpElems<T> e;
  e.a = static_cast<const T*>(args.a.data_ptr());
  e.b = static_cast<const T*>(args.b.data_ptr());
  e.w = data_or_null<const T>(args.w);
  e.wm = static_cast<M>(args.w_scalar);
  e.one_minus_wm = static_cast<M>(1.0 - args.w_scalar);
  return e;
}

// The backward's output pointers (null where a gradient is not needed).
template <class T>
struct LerpGradOut {
  const T* g = nullptr;
  T* da = nullptr;
  T* db = nullptr;
  T* dw = nullptr;
  QGRAD_HD void write(const LerpElems<T>& e, std::int64_t i, std::int64_t ia, std::int64_t ib, std::int64_t iw) const {
    if (da) da[i] = e.grad_a(g[i], iw);
    if (db) db[i] = e.grad_b(g[i], iw);
    if (dw) dw[i] = e.grad_w(g[i], ia, ib);
  }
};

template <class T>
LerpGradOut<T> make_lerp_grad_out(const Tensor& dy, const Tensor& da, const Tensor& db, const Tensor& dw) {
  return {static_cast<const T*>(dy.data_ptr()), data_or_null<T>(da), data_or_null<T>(db), data_or_null<T>(dw)};
}

// out = lerp(a, b, w) (out has the broadcast shape).
void lerp_forward(const LerpArgs& args, const Tensor& out);
// da, db, dw (each of dy's shape, undefined where not needed) from dy.
void lerp_backward(const LerpArgs& args, const Tensor& dy, const Tensor& da, const Tensor& db, const Tensor& dw);

}  // namespace qgrad::kernels
