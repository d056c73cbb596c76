// Fused optimizer kernels: one launch updates many parameters (CUDA:
// multi-tensor apply, the pointer table travels in the kernel arguments, as
// PyTorch's foreach kernels do; no host sync and no host-to-device copy).
#pragma once

#include <vector>

#include "qgrad/core/tensor.h"
#include "qgrad/kernels/formulas/optim.h"

namespace qgrad::kernels {

// Step-wide hyper-parameters as host doubles; converted to the op-math type
// of the parameters on the host before launch.
struct OptimHyper {
  formulas::OptimKind kind = formulas::OptimKind::sgd;
  double lr = 0.0;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
};

// One parameter: param and grad (same shape, dtype, device); buf1 = SGD
// momentum buffer (undefined when momentum == 0) or AdamW exp_avg; buf2 =
// AdamW exp_avg_sq. `step` is the parameter's step count after this step
// (AdamW bias correction); `first` marks SGD's first momentum step.
struct OptimSlot {
  Tensor param, grad, buf1, buf2;
  std::int64_t step = 1;
  bool first = false;
};

// All slots share one device and one floating dtype (the caller validates).
void optim_step(const OptimHyper& hyper, const std::vector<OptimSlot>& slots);

// Host-side conversion of the hyper-parameters (shared by both backends).
template <class M>
formulas::OptimScalars<M> optim_scalars(const OptimHyper& h);
template <class M>
formulas::OptimTensorScalars<M> optim_tensor_scalars(const OptimHyper& h, const OptimSlot& s);

namespace cpu {
void optim_step(const OptimHyper& hyper, const std::vector<OptimSlot>& slots);
}
namespace cuda {
void optim_step(const OptimHyper& hyper, const std::vector<OptimSlot>& slots);
}

}  // namespace qgrad::kernels
