// The forward, cross-entropy loss and backward of a QAT MLP as one fused
// CUDA kernel (kernels/cuda/qat_mlp.cu), or as the composed ops elsewhere. nn::qat_mlp_loss_backward (nn/fused_mlp.h)
// gathers a prepared model's tensors and calls it; it is public so that a
// training loop can run the same step without the nn layer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "qgrad/core/tensor.h"

namespace qgrad {

// A per-tensor or per-channel (axis 0) observer + fake quant: its running
// range (f32 [C], updated), the qparams it writes (f32 / s32 [C]) and its
// options (averaging_constant < 0: running min/max, else moving average).
struct QatMlpQuant {
  Tensor run_min, run_max, scale, zero_point;
  double averaging_constant = 0.01;
  bool symmetric = false;
  std::int32_t symmetric_zero_point = 0;
  std::int64_t qmin = 0, qmax = 255;
};

// z = act_in · fake_quant(weight)ᵀ + bias; act_out = output_quant(z), relu'd
// when `relu`. weight_grad / bias_grad are written, or added to when the
// accumulate flag is set.
struct QatMlpLayer {
  Tensor weight, bias;            // f32 [N, K], [N] or undefined
  Tensor weight_grad, bias_grad;  // f32, the parameters' shapes
  bool accumulate_weight_grad = false, accumulate_bias_grad = false;
  bool relu = false;
  QatMlpQuant weight_quant;  // per channel: C = N
  QatMlpQuant output_quant;  // per tensor: C = 1
};

// Whether the fused kernel can run on `device` (a CUDA device with
// cooperative launch, in a build with CUDA).
bool qat_mlp_fused_available(const Device& device);
// The largest step the kernel takes, in multiply-adds of the forward
// (B times the sum of N x K over the layers; the b256 784-256-256-10 MLP is
// 2^26): its phases are tiles of FFMA bound by latency, and larger steps run
// faster as the composed ops on cuBLAS.
inline constexpr std::int64_t kQatMlpFusedMultiplyAdds = std::int64_t{1} << 27;
// The most layers the op takes.
inline constexpr std::size_t kQatMlpMaxLayers = 6;

// loss = mean cross_entropy(act_L, labels) of the MLP x -> input_quant ->
// layers, its parameter gradients and every observer's update; returns the
// loss (f32 scalar). On a device with qat_mlp_fused_available and up to
// kQatMlpFusedMultiplyAdds, one kernel launch; otherwise the composed ops
// (observe_fake_quantize_*, linear, cross_entropy, backward), whose results
// the kernel's match to float rounding (docs/ops.md). Everything on one
// device, f32, x [B, K0] not requiring grad, labels [B] s64 / s32, 1 to 6
// layers of chained shapes, B times any layer's width and any weight's size
// under 2^24. Validates everything first (op "qat_mlp_loss_backward_"):
// nothing is written when it throws.
Tensor qat_mlp_loss_backward_(const Tensor& x, const Tensor& labels, const QatMlpQuant& input_quant,
                              const std::vector<QatMlpLayer>& layers);

}  // namespace qgrad
