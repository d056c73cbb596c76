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
//   grad_scale (optional): a one-element tensor of the parameters' dtype on
//     their device; every gradient is multiplied by it (and rounded to the
//     dtype) as the kernel reads it: the clip coefficient of grad_norm,
//     applied with no pass of its own. The gradients are not modified.
//   skip (optional): a one-element s32 tensor on that device; when it holds
//     a nonzero value the step writes nothing (read on the device, so the
//     host never waits: grad_norm's non-finite flag).
void optimizer_step_(const OptimizerHyper& hyper, const std::vector<OptimizerSlot>& slots,
                     const Tensor& grad_scale = Tensor(), const Tensor& skip = Tensor());

// The global gradient norm of torch.nn.utils.clip_grad_norm_ and its clip
// coefficient, two scalar (shape {}) tensors of the gradients' dtype on
// their device, computed there with no host sync:
//   total_norm = norm_p([norm_p(g_0), norm_p(g_1), ...]), p in {1, 2, inf};
//   clip_coef  = min(max_norm / (total_norm + 1e-6), 1).
struct GradNorm {
  Tensor total_norm;
  Tensor clip_coef;
};
// grads: one or more floating tensors of one dtype on one device, any
// shapes (empty ones count as norm 0). One multi-tensor reduction in a fixed
// order (one CUDA launch per 128 tensors): the same bits on every run and
// on the CPU and CUDA. nonfinite (optional, an s32 one-element tensor on
// that device): set to 1 when total_norm is NaN or infinite, never cleared
// here (error_if_nonfinite without a host sync). Not differentiable.
GradNorm grad_norm(const std::vector<Tensor>& grads, double max_norm, double norm_type = 2.0,
                   const Tensor& nonfinite = Tensor());
// tensors[i] *= scale in place (torch._foreach_mul_ by a scalar tensor):
// scale is a one-element tensor of their dtype on their device. One CUDA
// launch per 128 tensors. Not recorded on the tape.
void grad_scale_(const std::vector<Tensor>& tensors, const Tensor& scale);

}  // namespace qgrad
