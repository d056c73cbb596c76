// Element formulas of the fused attention row kernels (kernels/attention.h),
// shared by the CPU row loop and the CUDA warp-per-row kernel. M is the math
// type (float for f32/f16/bf16, double for f64).
#pragma once

#include <cstdint>
#include <limits>
#include <type_traits>

#include "qgrad/kernels/attention.h"
#include "qgrad/kernels/formulas/lerp.h"  // fused_multiply_add: packed_attention's products
#include "qgrad/kernels/formulas/transformer.h"

namespace qgrad::formulas {

// The logit of column j of row r: s * scale + mask (additive), or -inf where
// the boolean mask is false or the causal mask hides j (j > query index).
template <class T, class MaskT>
QGRAD_HD op_math_t<T> attention_logit(const kernels::AttentionRows& a, const T* scores, const MaskT* mask,
                                      std::int64_t mask_row, std::int64_t r, std::int64_t j) {
  using M = op_math_t<T>;
  constexpr M kNegInf = -std::numeric_limits<M>::infinity();
  if (a.causal && j > r % a.L) return kNegInf;
  M z = M(scores[r * a.S + j]) * M(a.scale);
  if (mask == nullptr) return z;
  if constexpr (std::is_same_v<MaskT, bool>) {
    if (!mask[mask_row + j * a.mask_col_stride]) return kNegInf;
  } else {
    z = z + M(mask[mask_row + j * a.mask_col_stride]);
  }
  return z;
}

// The probability from the logit, the row max and the row sum: exp(z - max) /
// sum, or 0 for a row where every column is masked (max == -inf).
template <class M>
QGRAD_HD M attention_prob_of_exp(M e, M mx, M sum) {
  return mx == -std::numeric_limits<M>::infinity() ? M(0) : e / sum;
}
// The same from the logit z, e = exp(z - max).
template <class M>
QGRAD_HD M attention_prob(M z, M mx, M sum) {
  if (mx == -std::numeric_limits<M>::infinity()) return M(0);
  return attention_prob_of_exp(exp_m(z - mx), mx, sum);
}

// packed_attention's logit of query i and key j from their dot product (summed
// over the head dim in increasing order from 0): dot * scale, or -inf where
// the causal mask hides j.
template <class M>
QGRAD_HD M packed_logit(M dot, M scale, bool causal, std::int64_t i, std::int64_t j) {
  return causal && j > i ? -std::numeric_limits<M>::infinity() : dot * scale;
}
// The logit's gradient from the probability p, its gradient dp and the row's
// sum of dp * p (lane_sum's order): p * (dp - dot) * scale.
template <class M>
QGRAD_HD M packed_logit_grad(M p, M dp, M dot, M scale) {
  return p * (dp - dot) * scale;
}

// packed_attention's probabilities and logit gradients as operands of their
// products (O = P v, dV = Pᵀ dO; dQ = dS k, dK = dSᵀ q): rounded to the
// dtype T, as the tensor cores take them in f16 and bf16 (kernels/cuda/
// attention.cu); the value itself where T is the math type (f32, f64).
template <class T, class M>
QGRAD_HD M packed_operand(M v) {
  if constexpr (std::is_same_v<T, M>) return v;
  else return M(T(v));
}

// The dropout multiplier of element i (scale_d = 1 / (1 - p), 0 for p == 1).
template <class M>
QGRAD_HD M attention_drop(const kernels::AttentionRows& a, std::int64_t i, M v, M scale_d) {
  if (a.p <= 0.0) return v;
  return dropout_apply(v, dropout_keep(a.seed, a.offset, i, a.p), scale_d);
}

}  // namespace qgrad::formulas
