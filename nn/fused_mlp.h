// One QAT training step's forward, loss and backward for a small MLP as one
// CUDA launch: a persistent kernel (kernels/cuda/qat_mlp.cu) in place of the
// ~35 kernels of the composed ops, whose launches and dependencies bound a
// small MLP's step (docs/benchmarks.md, issue #16).
#pragma once

#include <string>

#include "qgrad/core/tensor.h"
#include "qgrad/nn/layers.h"

namespace qgrad::nn {

// loss = cross_entropy(model.forward(x), labels); loss.backward(); returns
// loss (detached, a f32 scalar). The same state afterwards as those three
// calls: each parameter's gradient set (or added to the one it has), every
// observer's running range, scale and zero point moved by this batch.
//
// A model of prepare_qat's MLP form goes through qat_mlp_loss_backward_
// (ops/qat_mlp.h): on CUDA, where qat_mlp_fused_unsupported(...) is empty,
// one cooperative kernel does all of it; otherwise that op, or for any other
// model the model's own forward, runs the composed ops. The fused
// kernel's products are f32 FMAs like the composed path's cuBLAS f32 GEMMs,
// summed in another order (and the loss's rows too), so its values differ
// from the composed path's by float rounding, and a value within that of a
// rounding boundary of a fake quant can land on the neighbouring level; every
// other formula (observers, qparams, fake quant, masks, cross-entropy) is the
// ops' own. No host sync: capturable in a CudaGraph. It observes the weights
// itself: an output stage_weight_fake_quants staged before it is dropped (its
// observer update kept, as for any staged output never taken), so do not
// stage before calling it.
Tensor qat_mlp_loss_backward(Sequential& model, const Tensor& x, const Tensor& labels);

// Why qat_mlp_loss_backward(model, x, labels) would run the composed ops
// rather than the fused kernel; empty when the kernel runs. The kernel
// takes up to kQatMlpFusedMultiplyAdds (ops/qat_mlp.h) and: x f32 [B, K] on a
// CUDA device with cooperative launch,
// not requiring grad; labels [B] s64 or s32 on that device; a model prepared
// by prepare_qat ("quant", then 1 to 6 QATLinear, each optionally followed by
// a ReLU) in f32 (no compute dtype), every fake quant with its observer and
// fake quant on and no range sync, per-tensor activations, per-channel
// weights on axis 0, every parameter requiring grad with no gradient or an
// f32 one; and B times the widest layer's features under 2^24.
std::string qat_mlp_fused_unsupported(const Sequential& model, const Tensor& x, const Tensor& labels);

}  // namespace qgrad::nn
