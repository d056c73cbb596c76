// Fused optimizer kernels: one launch updates many parameters (CUDA:
// multi-tensor apply, the pointer table travels in the kernel arguments, as
// PyTorch's foreach kernels do; no host sync and no host-to-device copy).
#pragma once

#include <vector>

#include "qgrad/core/optimizer_args.h"
#include "qgrad/core/tensor.h"
#include "qgrad/kernels/formulas/optim.h"

namespace qgrad::kernels {

// One parameter's update at element i, shared by the CPU loop and the CUDA
// multi-tensor kernel (kernels/cuda/optim.cu). buf1 is null for SGD without
// momentum.
template <class T>
struct OptimElems {
  using M = op_math_t<T>;
  T* p;
  const T* g;
  T* b1;
  T* b2;
  formulas::OptimTensorScalars<M> ts;
  // The step on values already loaded (bv1 / bv2: the state buffers' values,
  // ignored where a buffer is absent). `scale`: the gradient is first
  // multiplied by it and rounded to T (the clip coefficient; the same bits as
  // grad_scale_ before the step).
  QGRAD_HD void update_values(M& pv, M gv, M& bv1, M& bv2, const formulas::OptimScalars<M>& s, bool scaled,
                              M scale) const {
    if (scaled) gv = M(T(gv * scale));
    if (s.kind == OptimizerKind::sgd) {
      if (!b1) bv1 = M(0);
      formulas::sgd_update<M>(pv, gv, bv1, s, ts);
    } else {
      formulas::adamw_update<M>(pv, gv, bv1, bv2, s, ts);
    }
  }
  QGRAD_HD void update(std::int64_t i, const formulas::OptimScalars<M>& s, bool scaled = false,
                       M scale = M(1)) const {
    M pv = M(p[i]), bv1 = b1 ? M(b1[i]) : M(0), bv2 = b2 ? M(b2[i]) : M(0);
    update_values(pv, M(g[i]), bv1, bv2, s, scaled, scale);
    if (b1) b1[i] = T(bv1);
    if (b2) b2[i] = T(bv2);
    p[i] = T(pv);
  }
};

// All slots share one device and one floating dtype (the caller validates).
// grad_scale (optional): a one-element tensor of that dtype every gradient
// is multiplied by; skip (optional): an s32 one-element tensor, and when it
// holds a nonzero value nothing is written. Both are read on the device.
void optim_step(const OptimizerHyper& hyper, const std::vector<OptimizerSlot>& slots,
                const Tensor& grad_scale = Tensor(), const Tensor& skip = Tensor());

// The global norm of `tensors` (one floating dtype, one device, any
// shapes) in the order of formulas::NormKind's comment: total (a
// one-element tensor of their dtype) = the norm, coef = the clip
// coefficient for max_norm, nonfinite (optional s32 one element) set to 1
// when the total is not finite.
void grad_norm(const std::vector<Tensor>& tensors, formulas::NormKind kind, double max_norm, const Tensor& total,
               const Tensor& coef, const Tensor& nonfinite);
// tensors[i] *= scale (a one-element tensor of their dtype), in place.
void grad_scale(const std::vector<Tensor>& tensors, const Tensor& scale);

// Host-side conversion of the hyper-parameters (shared by both backends).
template <class M>
formulas::OptimScalars<M> optim_scalars(const OptimizerHyper& h);
template <class M>
formulas::OptimTensorScalars<M> optim_tensor_scalars(const OptimizerHyper& h, const OptimizerSlot& s);
template <class T>
OptimElems<T> optim_elems(const OptimizerHyper& h, const OptimizerSlot& slot) {
  auto data = [](const Tensor& t) { return t.defined() ? static_cast<T*>(t.data_ptr()) : nullptr; };
  return {data(slot.param), static_cast<const T*>(slot.grad.data_ptr()), data(slot.buf1), data(slot.buf2),
          optim_tensor_scalars<op_math_t<T>>(h, slot)};
}

}  // namespace qgrad::kernels
