// The hand-written CUDA kernels that the shared kernel sources (kernels/*.cpp)
// reach on a CUDA tensor, declared in one place. Each stays hand-written only
// because it is measurably faster than the generic loop of kernels/loop.h
// (the benchmark row is named beside it; docs/benchmarks.md); everything else
// is written once over that loop. Called only through QGRAD_ON_CUDA, so a
// build without CUDA needs no definitions.
#pragma once

#include <vector>

#include "qgrad/core/tensor.h"
#include "qgrad/kernels/lerp.h"
#include "qgrad/kernels/optim.h"
#include "qgrad/kernels/reduce.h"

namespace qgrad::kernels::cuda {

// relu with its x > 0 mask in one pass, one warp ballot per mask word
// (train_ops relu_fw; the generic loop would pack each word in one thread).
void relu_masked(const Tensor& in, const Tensor& out, const Tensor& mask);

// lerp with 16-byte vector loads when every operand has the output's shape
// and is 16-byte aligned (quant lerp_fw / lerp_bw: 93-100% of copy). Return
// false, launching nothing, when that does not hold.
bool lerp_forward_vec(const LerpArgs& args, const Tensor& out);
bool lerp_backward_vec(const LerpArgs& args, const Tensor& dy, const Tensor& da, const Tensor& db, const Tensor& dw);

// The multi-tensor optimizer step: one launch per 32 parameters
// (train_ops sgd_momentum_step).
void optim_step(const OptimHyper& hyper, const std::vector<OptimSlot>& slots);

// sum over rows longer than kSumThreadPerRowMax: a block per row (or per
// fixed chunk), shared-memory tree (train step profile: sum_block_kernel).
inline constexpr std::int64_t kSumThreadPerRowMax = 128;
void sum_axis_blocks(const Tensor& in, const Tensor& out, const AxisView& v, bool mean);

}  // namespace qgrad::kernels::cuda
