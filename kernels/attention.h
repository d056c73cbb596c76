// Kernels of scaled_dot_product_attention (ops/attention.h) besides its two
// batched GEMMs: the fused row kernel scale -> mask -> softmax (-> dropout)
// and its backward. One row is one query position: S scores. CPU: one
// OpenMP index per row; CUDA: one warp per row (kernels/cuda/attention.cu).
// Both sum a row in the fixed lane order of formulas::lane_sum, so the two
// devices differ only where exp differs (glibc against libdevice).
#pragma once

#include <algorithm>
#include <cstddef>
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

// ---- packed_attention (ops/attention.h): the fused attention of one packed
// q|k|v projection, a (batch, head) pair at a time ----
// qkv [batch, L, 3 * heads * head_dim] (q, k, v one after the other, each
// split into heads), out [batch, L, heads * head_dim]. The saved state is two
// numbers a query row (its logits' max and exp-sum): the backward recomputes
// the probabilities from them, the same bits as the forward's.
struct PackedAttention {
  std::int64_t batch = 0, L = 0, heads = 0, head_dim = 0;
  double scale = 1;
  bool causal = false;
  QGRAD_HD std::int64_t width() const { return heads * head_dim; }
};
// The fused kernels' reach: both sequences and the head dim at most 64 (the
// CUDA kernel's 4 x 4 tiles of a 16 x 16 thread block), and the backward's
// shared memory at most 96 KiB (every GPU qgrad builds for has that much a
// block). A rule of the shape and dtype alone: the CPU follows it too.
inline constexpr std::int64_t kPackedAttentionMaxLength = 64;
inline constexpr std::size_t kPackedAttentionMaxSmem = 96 * 1024;
// Pitches of the CUDA kernels' shared arrays, in elements: a row of L values
// padded to a multiple of 8 (a warp's 8 rows read as 16-byte runs stay inside
// it) plus 4 (rows 4 apart on other banks); a row of head_dim values to the
// thread columns' reach 16 * ceil(head_dim / 16), plus 4.
QGRAD_HD std::int64_t packed_attention_seq_pitch(std::int64_t L) { return (L + 7) / 8 * 8 + 4; }
QGRAD_HD std::int64_t packed_attention_dim_pitch(std::int64_t head_dim) { return (head_dim + 15) / 16 * 16 + 4; }
// Pitch of the arrays of keys stored transposed in the CUDA kernels' key order
// (k and v: key j at 4 (j mod 16) + j / 16, so a thread's four keys j, j + 16,
// j + 32, j + 48 are one run): all 64 places whatever L, plus 4.
inline constexpr std::int64_t kPackedAttentionKeyPitch = kPackedAttentionMaxLength + 4;
// Shared memory of the CUDA forward: q transposed [head_dim][seq pitch], k
// transposed [head_dim][key pitch], v [L][dim pitch], the probabilities
// transposed [L][seq pitch], in the math type.
inline std::size_t packed_attention_forward_smem(std::int64_t L, std::int64_t head_dim, std::size_t math_bytes) {
  const std::int64_t lp = packed_attention_seq_pitch(L), dp = packed_attention_dim_pitch(head_dim);
  return static_cast<std::size_t>(head_dim * (lp + kPackedAttentionKeyPitch) + L * dp + L * lp) * math_bytes;
}
// Shared memory of the CUDA backward: q and k transposed (later q and k
// [L][dim pitch] in the same place), v transposed [head_dim][key pitch], dO
// [L][dim pitch], the probabilities and their gradient [L][seq pitch].
inline std::size_t packed_attention_backward_smem(std::int64_t L, std::int64_t head_dim, std::size_t math_bytes) {
  const std::int64_t lp = packed_attention_seq_pitch(L), dp = packed_attention_dim_pitch(head_dim);
  const std::int64_t qk = std::max(head_dim * (lp + kPackedAttentionKeyPitch), 2 * L * dp);
  return static_cast<std::size_t>(qk + head_dim * kPackedAttentionKeyPitch + L * dp + 2 * L * lp) * math_bytes;
}
bool packed_attention_fits(std::int64_t L, std::int64_t head_dim, DType dtype);
// out, row_max and row_sum ([batch, heads, L], op math type) from qkv.
void packed_attention_forward(const Tensor& qkv, const Tensor& out, const Tensor& row_max, const Tensor& row_sum,
                              const PackedAttention& a);
// dqkv (every element written) from qkv, the output's gradient dout and the
// saved row statistics. With dout_mask (a bit per element of out, the
// engine's layout: a fake quant of the output's straight-through mask), dout
// is read masked (formulas::masked_grad), as that fake quant's backward
// would have written it.
void packed_attention_backward(const Tensor& qkv, const Tensor& dout, const Tensor& row_max, const Tensor& row_sum,
                               const Tensor& dqkv, const PackedAttention& a,
                               const std::uint32_t* dout_mask = nullptr);

}  // namespace qgrad::kernels
