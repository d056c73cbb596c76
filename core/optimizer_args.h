// The arguments of the fused optimizer step, shared by the op
// (ops/optim.h `optimizer_step_`) and the kernel (kernels/optim.h): plain
// data over Tensor, so it sits in core, the one layer both see.
#pragma once

#include <cstdint>

#include "qgrad/core/tensor.h"

namespace qgrad {

enum class OptimizerKind : unsigned char { sgd, adamw };

// Step-wide hyper-parameters (host doubles, converted to the parameters'
// op-math type before launch). SGD: lr, momentum, dampening, weight_decay,
// nesterov (PyTorch's torch.optim.SGD). AdamW: lr, beta1, beta2, eps,
// weight_decay (decoupled, torch.optim.AdamW).
struct OptimizerHyper {
  OptimizerKind kind = OptimizerKind::sgd;
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
// momentum buffer (needed when momentum != 0) or AdamW exp_avg; buf2 =
// AdamW exp_avg_sq. `step` is the parameter's step count after this step
// (AdamW bias correction, >= 1); `first` marks SGD's first momentum step
// (the buffer is then overwritten with the gradient).
struct OptimizerSlot {
  Tensor param, grad, buf1, buf2;
  std::int64_t step = 1;
  bool first = false;
};

}  // namespace qgrad
