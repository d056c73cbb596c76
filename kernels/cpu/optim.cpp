#include "qgrad/kernels/cpu/parallel.h"
#include "qgrad/kernels/optim.h"

namespace qgrad::kernels::cpu {

namespace {

template <class T>
void optim_impl(const OptimHyper& hyper, const std::vector<OptimSlot>& slots) {
  using M = op_math_t<T>;
  const formulas::OptimScalars<M> s = optim_scalars<M>(hyper);
  for (const OptimSlot& slot : slots) {
    const formulas::OptimTensorScalars<M> ts = optim_tensor_scalars<M>(hyper, slot);
    T* p = static_cast<T*>(slot.param.data_ptr());
    const T* g = static_cast<const T*>(slot.grad.data_ptr());
    T* b1 = slot.buf1.defined() ? static_cast<T*>(slot.buf1.data_ptr()) : nullptr;
    T* b2 = slot.buf2.defined() ? static_cast<T*>(slot.buf2.data_ptr()) : nullptr;
    if (s.kind == formulas::OptimKind::sgd) {
      parallel_for(slot.param.numel(), [&](std::int64_t i) {
        M pv = M(p[i]);
        M bv = b1 ? M(b1[i]) : M(0);
        formulas::sgd_update<M>(pv, M(g[i]), bv, s, ts);
        p[i] = T(pv);
        if (b1) b1[i] = T(bv);
      });
    } else {
      parallel_for(slot.param.numel(), [&](std::int64_t i) {
        M pv = M(p[i]), mv = M(b1[i]), vv = M(b2[i]);
        formulas::adamw_update<M>(pv, M(g[i]), mv, vv, s, ts);
        p[i] = T(pv);
        b1[i] = T(mv);
        b2[i] = T(vv);
      });
    }
  }
}

}  // namespace

void optim_step(const OptimHyper& hyper, const std::vector<OptimSlot>& slots) {
  dispatch_floating(slots.front().param.dtype(), "optim_step",
                    [&](auto tag) { optim_impl<typename decltype(tag)::type>(hyper, slots); });
}

}  // namespace qgrad::kernels::cpu
