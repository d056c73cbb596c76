// Kernels of scaled_dot_product_attention (ops/attention.h) besides its two
// batched GEMMs: the fused row kernel scale -> mask -> softmax (-> dropout)
// and its backward. One row is one query position: S scores. CPU: one
// OpenMP index per row; CUDA: one warp per row (kernels/cuda/attention.cu).
// Both sum a row in the fixed lane order of formulas::lane_sum, so the two
// devices differ only where exp differs (glibc against libdevice).
#pragma once

#include <cstdint>

#include "qgrad/core/macros.h"
#include "qgrad/core/tensor.h"
#include "qgrad/kernels/linalg.h"

namespace qgrad::kernels {

enum class AttentionMaskKind : int { none, boolean, additive };

// The rows of the score tensor [batch..., L, S] (rows = numel / S) and how
// each is masked and dropped.
struct AttentionRows {
  std::int64_t rows = 0, L = 0, S = 0;
  double scale = 1;
  bool causal = false;  // column j of query i is masked when j > i (top-left aligned)
  // The mask, broadcast to [batch..., L, S] by strides (0 along broadcast
  // dims): row r starts at mask_row(r), column j adds j * mask_col_stride.
  AttentionMaskKind mask = AttentionMaskKind::none;
  int mask_ndim = 0;  // dims of the row index: batch..., L
  std::int64_t mask_sizes[kMaxTransposeDims] = {};
  std::int64_t mask_strides[kMaxTransposeDims] = {};
  std::int64_t mask_col_stride = 0;
  // Dropout of the probabilities: element i = r * S + j is kept iff
  // formulas::dropout_keep(seed, offset, i, p) (the dropout op's scheme).
  double p = 0;
  std::uint64_t seed = 0, offset = 0;

  QGRAD_HD std::int64_t mask_row(std::int64_t r) const {
    std::int64_t off = 0;
    for (int d = mask_ndim - 1; d >= 0; --d) {
      off += (r % mask_sizes[d]) * mask_strides[d];
      r /= mask_sizes[d];
    }
    return off;
  }
};

// probs = softmax(scores * scale + mask) per row (probs may be scores
// itself: a row is read before it is written; rows with every column
// masked give zeros, as PyTorch's _safe_softmax); attn (when defined, p > 0)
// = dropout(probs). mask: undefined, boolean (true: attend) or of scores'
// dtype (added).
void attention_softmax(const Tensor& scores, const Tensor& mask, const Tensor& probs, const Tensor& attn,
                       const AttentionRows& a);
// attn = dropout(probs) again (the backward's dV = attnᵀ · dO).
void attention_dropout(const Tensor& probs, const Tensor& attn, const AttentionRows& a);
// From probs and dattn (the gradient of attn, or of probs when p == 0):
// dz = probs * (dp - sum(dp * probs)) with dp = dropout(dattn);
// dscores = dz * scale; dlogits (when defined) = dz (the mask's gradient).
void attention_softmax_backward(const Tensor& probs, const Tensor& dattn, const Tensor& dscores,
                                const Tensor& dlogits, const AttentionRows& a);

}  // namespace qgrad::kernels
