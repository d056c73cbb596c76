#include "qgrad/kernels/optim.h"

#include <cmath>

#include "qgrad/kernels/cuda/entries.h"
#include "qgrad/kernels/loop.h"

namespace qgrad::kernels {

template <class M>
formulas::OptimScalars<M> optim_scalars(const OptimizerHyper& h) {
  formulas::OptimScalars<M> s;
  s.kind = h.kind;
  s.neg_lr = static_cast<M>(-h.lr);
  s.momentum = static_cast<M>(h.momentum);
  s.one_minus_dampening = static_cast<M>(1.0 - h.dampening);
  s.weight_decay = static_cast<M>(h.weight_decay);
  s.use_weight_decay = h.weight_decay != 0.0;
  s.use_momentum = h.momentum != 0.0;
  s.nesterov = h.nesterov;
  s.decay = static_cast<M>(1.0 - h.lr * h.weight_decay);
  s.lerp_weight = static_cast<M>(1.0 - h.beta1);
  s.beta2 = static_cast<M>(h.beta2);
  s.one_minus_beta2 = static_cast<M>(1.0 - h.beta2);
  s.eps = static_cast<M>(h.eps);
  return s;
}

// PyTorch computes the bias corrections with Python floats (double).
template <class M>
formulas::OptimTensorScalars<M> optim_tensor_scalars(const OptimizerHyper& h, const OptimizerSlot& slot) {
  formulas::OptimTensorScalars<M> t;
  t.first = slot.first;
  if (h.kind == OptimizerKind::adamw) {
    const double step = static_cast<double>(slot.step);
    const double bc1 = 1.0 - std::pow(h.beta1, step);
    const double bc2 = 1.0 - std::pow(h.beta2, step);
    t.neg_step_size = static_cast<M>(-(h.lr / bc1));
    t.bc2_sqrt = static_cast<M>(std::sqrt(bc2));
  }
  return t;
}

template formulas::OptimScalars<float> optim_scalars<float>(const OptimizerHyper&);
template formulas::OptimScalars<double> optim_scalars<double>(const OptimizerHyper&);
template formulas::OptimTensorScalars<float> optim_tensor_scalars<float>(const OptimizerHyper&, const OptimizerSlot&);
template formulas::OptimTensorScalars<double> optim_tensor_scalars<double>(const OptimizerHyper&, const OptimizerSlot&);

namespace {

template <class T>
struct OptimUpdate {
  OptimElems<T> e;
  formulas::OptimScalars<op_math_t<T>> s;
  QGRAD_HD void operator()(std::int64_t i) const { e.update(i, s); }
};

}  // namespace

void optim_step(const OptimizerHyper& hyper, const std::vector<OptimizerSlot>& slots) {
  if (slots.empty()) return;
  const Device dev = slots.front().param.device();
  if (dev.is_cuda()) {
    QGRAD_ON_CUDA(cuda::optim_step(hyper, slots));
    return;
  }
  dispatch_floating(slots.front().param.dtype(), "optim_step", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const formulas::OptimScalars<op_math_t<T>> s = optim_scalars<op_math_t<T>>(hyper);
    for (const OptimizerSlot& slot : slots)
      for_each_index(dev, slot.param.numel(), OptimUpdate<T>{optim_elems<T>(hyper, slot), s}, "optim_step");
  });
}

}  // namespace qgrad::kernels
