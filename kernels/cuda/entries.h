// The hand-written CUDA kernels that the shared kernel sources (kernels/*.cpp)
// reach on a CUDA tensor, declared in one place. Each stays hand-written only
// because it is measurably faster than the generic loop of kernels/loop.h
// (the benchmark row is named beside it; docs/benchmarks.md); everything else
// is written once over that loop. Called only through QGRAD_ON_CUDA, so a
// build without CUDA needs no definitions.
#pragma once

#include <cstdint>
#include <vector>

#include "qgrad/core/tensor.h"
#include "qgrad/kernels/attention.h"
#include "qgrad/kernels/conv.h"
#include "qgrad/kernels/deferred.h"
#include "qgrad/kernels/lerp.h"
#include "qgrad/kernels/linalg.h"
#include "qgrad/kernels/lowbit.h"
#include "qgrad/kernels/optim.h"
#include "qgrad/kernels/qat_mlp.h"
#include "qgrad/kernels/reduce.h"
#include "qgrad/kernels/softmax.h"

namespace qgrad::kernels::cuda {

// The GEMM through cuBLAS.
void gemm(const GemmShape& s, const Tensor& a, const Tensor& b, const Tensor& c, bool accumulate);

// linear's GEMM with the bias in cuBLASLt's epilogue (kernels/linalg.h
// linear_bias; kernels/cuda/lt_gemm.cuh). Returns false, launching nothing,
// for f64, an empty shape, a GEMM under 2^27 multiply-adds (faster through
// fill + cublasGemmEx, measured) or a shape cuBLASLt has no algorithm for.
// With `residual` (out's shape and dtype): out = (x wᵀ + residual) + bias in
// the same GEMM where its plan was checked to give linear_add's bits (lt_gemm.cuh).
bool linear_bias_lt(const GemmShape& s, const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out,
                    const Tensor& residual = Tensor());

// conv2d and its input and weight gradients through cuDNN (kernels/cuda/conv.cu:
// a library, not hand-written kernels; deterministic algorithms only).
void conv2d_forward(const Conv2dShape& s, const Tensor& x, const Tensor& weight, const Tensor& y, bool accumulate);
void conv2d_backward_input(const Conv2dShape& s, const Tensor& dy, const Tensor& weight, const Tensor& dx);
void conv2d_backward_weight(const Conv2dShape& s, const Tensor& x, const Tensor& dy, const Tensor& dweight);
// Channels-last staging (kernels/conv.h): the predicate, the tiled copy
// [a, b, h, w] -> [a, h, w, b], and the three passes on staged operands.
bool conv2d_stages_channels_last(const Conv2dShape& s, DType dt, int device);
void to_channels_last(const Tensor& in, const Tensor& out);
void conv2d_forward_channels_last(const Conv2dShape& s, const Tensor& x_cl, const Tensor& w_cl, const Tensor& y);
void conv2d_backward_input_channels_last(const Conv2dShape& s, const Tensor& dy_cl, const Tensor& w_cl,
                                         const Tensor& dx);
void conv2d_backward_weight_channels_last(const Conv2dShape& s, const Tensor& x_cl, const Tensor& dy_cl,
                                          const Tensor& dweight);
// The two gradients without cuDNN for groups of at most 4 input channels (a
// first layer, a depthwise convolution), and the forward for such groups of
// at least 4 output channels (kernels/cuda/conv_direct.cu): false, launching
// nothing, for an empty batch or a shape beyond their limits. conv2d_forward
// and conv2d_backward_* call them first.
bool conv2d_forward_direct(const Conv2dShape& s, const Tensor& x, const Tensor& weight, const Tensor& y,
                           bool accumulate);
bool conv2d_backward_weight_direct(const Conv2dShape& s, const Tensor& x, const Tensor& dy, const Tensor& dweight);
bool conv2d_backward_input_direct(const Conv2dShape& s, const Tensor& dy, const Tensor& weight, const Tensor& dx);

// The exact int32 GEMM of the int8 kernels (quantized_linear, quantized_conv2d):
// C[M, ldc] (s32, row-major) = A[M, lda] (s8) x W[N, ldw]^T (s8) over K, through
// cuBLASLt's int8 tensor cores (kernels/cuda/lt_gemm.cuh: a library, not a
// hand-written GEMM), with a dp4a fallback only for shapes cuBLASLt rejects.
// K, lda, ldw multiples of 16, ldc of 4, 16-byte aligned pointers.
void int8_gemm(int device, const std::int8_t* a, std::int64_t lda, const std::int8_t* w, std::int64_t ldw,
               std::int32_t* c, std::int64_t ldc, std::int64_t M, std::int64_t N, std::int64_t K);

// fake_quantize_dynamic over contiguous rows of row_len elements (ops/lowbit.h):
// per row, choose_qparams_affine's qparams (formulas::int4_qparams) from the
// row's min/max, then the per-token fake quant and its mask (mask may be
// null), in one launch with a warp per row, prologue applied to x as it is
// loaded. Row lengths 128, 256, 384, 512, 768 and 1024; f32, bf16, f16.
// Returns false, launching nothing, otherwise.
bool fake_quantize_dynamic_rows(const Tensor& x, const Tensor& y, std::uint32_t* mask, std::int64_t row_len, int qmin,
                                int qmax, bool symmetric, float eps, RowPrologue prologue);
bool fake_quantize_dynamic_rows_batch(const std::vector<RowsBatchItem>& items, std::int64_t row_len, int qmin,
                                      int qmax, bool symmetric, float eps);

// lerp with 16-byte vector loads when every operand has the output's shape
// and is 16-byte aligned (quant lerp_fw / lerp_bw: 93-100% of copy). Return
// false, launching nothing, when that does not hold.
bool lerp_forward_vec(const LerpArgs& args, const Tensor& out);
bool lerp_backward_vec(const LerpArgs& args, const Tensor& dy, const Tensor& da, const Tensor& db, const Tensor& dw);

// A small QAT MLP's forward, loss and backward as one persistent cooperative
// kernel (kernels/qat_mlp.h; nn/fused_mlp.h; bench qat_step_..._fused).
bool qat_mlp_available(int device);
bool qat_mlp_plan(QatMlpArgs& a);
void qat_mlp_forward_backward(const QatMlpArgs& a);
// Profiling: later launches stamp %globaltimer into device_words[k] after
// their k-th grid barrier (k = 0: the start; 2L + 3 words); null: off.
void qat_mlp_record_phases(std::uint64_t* device_words);

// The multi-tensor optimizer step: one launch per 32 parameters
// (train_ops sgd_momentum_step).
void optim_step(const OptimizerHyper& hyper, const std::vector<OptimizerSlot>& slots, const Tensor& grad_scale,
                const Tensor& skip);
// clip_grad_norm's multi-tensor reduction (one launch per 128 tensors, the
// last block of each finishing it: formulas::NormKind's fixed order) and
// scale (one launch per 128 tensors). Not a speed choice alone: the generic
// loop has no multi-tensor reduction, and a launch per parameter is what
// the fused path exists to avoid.
void grad_norm(const std::vector<Tensor>& tensors, formulas::NormKind kind, double max_norm, const Tensor& total,
               const Tensor& coef, const Tensor& nonfinite);
void grad_scale(const std::vector<Tensor>& tensors, const Tensor& scale);

// sum over rows longer than kSumThreadPerRowMax: a block per row (or per
// fixed chunk), shared-memory tree (train step profile: sum_block_kernel).
inline constexpr std::int64_t kSumThreadPerRowMax = 128;
// Threads of that block (its shared-memory tree's width).
inline constexpr unsigned kSumBlockThreads = 256;
// With `defer`, a chunked column sum without a mean queues its finish there.
void sum_axis_blocks(const Tensor& in, const Tensor& out, const AxisLayout& v, bool mean, DeferredPasses* defer);

// The deferred gradient passes of one device and dtype (kernels/deferred.h),
// in queue order, one launch per table (kernels/cuda/deferred.cu). ViT step
// (b256, H200): 63 launches become one, replay 3.58 -> 3.46 ms.
void run_deferred_passes(const std::vector<DeferredPass>& passes);

// log_softmax and the fused cross-entropy forward over contiguous rows of at
// least kWarpRowMin elements: one warp per row, shuffle reductions
// (train_ops cross_entropy_fwbw; test_loss "wide rows").
inline constexpr std::int64_t kWarpRowMin = 33;
inline bool use_warp_rows(const AxisLayout& v) { return v.inner == 1 && v.channels >= kWarpRowMin; }
void log_softmax_warp_rows(const Tensor& x, const Tensor& y, const AxisLayout& v);
void log_softmax_backward_warp_rows(const Tensor& y, const Tensor& dy, const Tensor& dx, const AxisLayout& v);
void cross_entropy_forward_warp_rows(const Tensor& logits, const Tensor& labels, const Tensor& probs,
                                     const Tensor& row_loss);
// cross_entropy's rows (shorter than kWarpRowMin) and their batch mean in one
// block, for B <= kSumBlockThreads: a row a thread, then the mean in sum_axis's
// order for B rows (SumRow's loop up to kSumThreadPerRowMax, else
// sum_block_kernel's tree), so the bits of cross_entropy_forward + sum_axis
// with one launch instead of two (b256 MLP step: 4.62 -> 3.50 us captured, H200,
// the dev program cross_entropy_mean.cu, in git history before 63a9f94; at B = 4096
// one block took 38.7 us).
void cross_entropy_mean_one_block(const Tensor& logits, const Tensor& labels, const Tensor& probs, const Tensor& mean);

// layer_norm / rms_norm forward and input gradient, softmax forward and
// backward along a contiguous last axis: one warp per row of at least
// kNormWarpMin elements (kernels/cuda/norm_rows.cu), summing in
// formulas::lane_sum's order, so the bits are those of the one-thread-per-row
// loop (the CPU's). Shorter rows and strided softmax axes stay one index per
// row (kernels/transformer.cpp); the weight and bias gradients too.
inline constexpr std::int64_t kNormWarpMin = 32;
inline bool use_norm_warp(std::int64_t d) { return d >= kNormWarpMin; }
void layer_norm_warp_rows(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y, const Tensor& mean,
                          const Tensor& rstd, std::int64_t d, double eps);
void rms_norm_warp_rows(const Tensor& x, const Tensor& w, const Tensor& y, const Tensor& rstd, std::int64_t d,
                        double eps);
void norm_backward_warp_rows(const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                             const Tensor& dy, const Tensor& dx, std::int64_t d, const std::uint32_t* dy_mask,
                             const Tensor& dx_pending);
// norm_backward_warp_rows and the weight and bias gradients' chunk partials
// (pw, pb: [rows / kNormChunkRows rounded up, d] in op math, either
// undefined when not wanted; the partial column sums of NormWeightPartial and
// NormBiasPartial, kernels/transformer.cpp) in one launch, the same bits.
// With pd (the same shape), also dx's chunk partials in a chunked column
// sum's order (kernels/cuda/reduce.cu's). False (nothing written) unless d is
// 128 or 256 and the math f32.
bool norm_backward_chunks(const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd, const Tensor& dy,
                          const std::uint32_t* dy_mask, const Tensor& dx, const Tensor& pw, const Tensor& pb,
                          const Tensor& pd, std::int64_t d, const Tensor& dx_pending);
void softmax_warp_rows(const Tensor& x, const Tensor& y, std::int64_t n);
// kernels::layer_norm_fake_quantize_dynamic_rows (kernels/lowbit.h): a warp a
// row, the row in registers; layer_norm_warp_rows's sums, then the fake quant
// of fake_quantize_dynamic_rows. false, launching nothing, for other shapes.
bool layer_norm_fake_quantize_dynamic_rows(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y,
                                           const Tensor& mean, const Tensor& rstd, std::uint32_t* mask,
                                           const NormQuantRows& a);
void softmax_backward_warp_rows(const Tensor& y, const Tensor& dy, const Tensor& dx, std::int64_t n);

// scaled_dot_product_attention's fused scale/mask/softmax(/dropout) row
// kernel and its backward, one warp per row (kernels/cuda/attention.cu;
// the CPU runs a row per index), and the dropout of the probabilities again.
void attention_softmax_warp_rows(const Tensor& scores, const Tensor& mask, const Tensor& probs, const Tensor& attn,
                                 const AttentionRows& a);
void attention_softmax_backward_warp_rows(const Tensor& probs, const Tensor& dattn, const Tensor& dscores,
                                          const Tensor& dlogits, const AttentionRows& a);
void attention_dropout(const Tensor& probs, const Tensor& attn, const AttentionRows& a);
// packed_attention's fused forward and backward: a block per (batch, head)
// pair, q, k, v in shared memory (kernels/cuda/attention.cu).
void packed_attention_forward(const Tensor& qkv, const Tensor& out, const Tensor& row_max, const Tensor& row_sum,
                              const PackedAttention& a);
void packed_attention_backward(const Tensor& qkv, const Tensor& dout, const Tensor& row_max, const Tensor& row_sum,
                               const Tensor& dqkv, const PackedAttention& a, const std::uint32_t* dout_mask);

// The stable sort of embedding's backward: sorted = keys (s64 [n]) in
// increasing order, order = their positions, equal keys in increasing
// position (CUB's radix sort, which is stable; the CPU uses std::stable_sort,
// so both give the one stable result). Not a speed choice: the generic loop
// has no sort.
void sort_keys_with_positions(const Tensor& keys, const Tensor& sorted, const Tensor& order);

}  // namespace qgrad::kernels::cuda
