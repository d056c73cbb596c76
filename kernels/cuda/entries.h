// The hand-written CUDA kernels that the shared kernel sources (kernels/*.cpp)
// reach on a CUDA tensor, declared in one place. Each stays hand-written only
// because it is measurably faster than the generic loop of kernels/loop.h
// (the benchmark row is named beside it; docs/benchmarks.md); everything else
// is written once over that loop. Called only through QGRAD_ON_CUDA, so a
// build without CUDA needs no definitions.
#pragma once

#include <vector>

#include "qgrad/core/tensor.h"
#include "qgrad/kernels/conv.h"
#include "qgrad/kernels/lerp.h"
#include "qgrad/kernels/linalg.h"
#include "qgrad/kernels/optim.h"
#include "qgrad/kernels/reduce.h"
#include "qgrad/kernels/softmax.h"

namespace qgrad::kernels::cuda {

// The GEMM through cuBLAS.
void gemm(const GemmShape& s, const Tensor& a, const Tensor& b, const Tensor& c, bool accumulate);

// conv2d and its input and weight gradients through cuDNN (kernels/cuda/conv.cu:
// a library, not hand-written kernels; deterministic algorithms only).
void conv2d_forward(const Conv2dShape& s, const Tensor& x, const Tensor& weight, const Tensor& y, bool accumulate);
void conv2d_backward_input(const Conv2dShape& s, const Tensor& dy, const Tensor& weight, const Tensor& dx);
void conv2d_backward_weight(const Conv2dShape& s, const Tensor& x, const Tensor& dy, const Tensor& dweight);

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
void optim_step(const OptimizerHyper& hyper, const std::vector<OptimizerSlot>& slots);

// sum over rows longer than kSumThreadPerRowMax: a block per row (or per
// fixed chunk), shared-memory tree (train step profile: sum_block_kernel).
inline constexpr std::int64_t kSumThreadPerRowMax = 128;
void sum_axis_blocks(const Tensor& in, const Tensor& out, const AxisLayout& v, bool mean);

// log_softmax and the fused cross-entropy forward over contiguous rows of at
// least kWarpRowMin elements: one warp per row, shuffle reductions
// (train_ops cross_entropy_fwbw; test_loss "wide rows").
inline constexpr std::int64_t kWarpRowMin = 33;
inline bool use_warp_rows(const AxisLayout& v) { return v.inner == 1 && v.channels >= kWarpRowMin; }
void log_softmax_warp_rows(const Tensor& x, const Tensor& y, const AxisLayout& v);
void log_softmax_backward_warp_rows(const Tensor& y, const Tensor& dy, const Tensor& dx, const AxisLayout& v);
void cross_entropy_forward_warp_rows(const Tensor& logits, const Tensor& labels, const Tensor& probs,
                                     const Tensor& row_loss);

// The stable sort of embedding's backward: sorted = keys (s64 [n]) in
// increasing order, order = their positions, equal keys in increasing
// position (CUB's radix sort, which is stable; the CPU uses std::stable_sort,
// so both give the one stable result). Not a speed choice: the generic loop
// has no sort.
void sort_keys_with_positions(const Tensor& keys, const Tensor& sorted, const Tensor& order);

}  // namespace qgrad::kernels::cuda
