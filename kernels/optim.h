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
  QGRAD_HD void update(std::int64_t i, const formulas::OptimScalars<M>& s) const {
    M pv = M(p[i]);
    if (s.kind == OptimizerKind::sgd) {
      M bv = b1 ? M(b1[i]) : M(0);
      formulas::sgd_update<M>(pv, M(g[i]), bv, s, ts);
      if (b1) b1[i] = T(bv);
    } else {
      M mv = M(b1[i]), vv = M(b2[i]);
      formulas::adamw_update<M>(pv, M(g[i]), mv, vv, s, ts);
      b1[i] = T(mv);
      b2[i] = T(vv);
    }
    p[i] = T(pv);
  }
};

// All slots share one device and one floating dtype (the caller validates).
void optim_step(const OptimizerHyper& hyper, const std::vector<OptimizerSlot>& slots);

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
