// Fused optimizer updates as an op: one call updates many parameters in
// place (on CUDA one multi-tensor launch per dtype, as PyTorch's fused/foreach
// kernels do; no host sync). nn::SGD and nn::AdamW drive it; it is public so
// a training loop can run the same update without the nn layer.
#pragma once

#include <vector>

#include "qgrad/core/optimizer_args.h"

namespace qgrad {

// Updates every slot's param (and buffers) in place. All slots share one
// floating dtype and one device. Validates everything first: nothing is
// written when it throws (op "optimizer_step_").
void optimizer_step_(const OptimizerHyper& hyper, const std::vector<OptimizerSlot>& slots);

}  // namespace qgrad
