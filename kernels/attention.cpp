// The fused attention row kernels on the CPU (one OpenMP index per row, the
// lane order of formulas::lane_sum); CUDA tensors go to the warp-per-row
// kernels of kernels/cuda/attention.cu, which sum in the same order.
#include "qgrad/kernels/attention.h"

#include <algorithm>
#include <limits>

#include "qgrad/kernels/cpu/parallel.h"
#include "qgrad/kernels/cuda/entries.h"
#include "qgrad/kernels/dispatch.h"
#include "qgrad/kernels/formulas/attention.h"

namespace qgrad::kernels {

namespace {

// Rows per OpenMP team worth its cost: a row is S exp's and a few passes.
std::int64_t row_grain(std::int64_t S) { return std::max<std::int64_t>(1, 8192 / std::max<std::int64_t>(S, 1)); }

template <class T, class MaskT>
void softmax_rows(const Tensor& scores, const Tensor& mask, const Tensor& probs, const Tensor& attn,
                  const AttentionRows& a) {
  using M = op_math_t<T>;
  const T* s = static_cast<const T*>(scores.data_ptr());
  const MaskT* mk = mask.defined() ? static_cast<const MaskT*>(mask.data_ptr()) : nullptr;
  T* pp = static_cast<T*>(probs.data_ptr());
  T* pa = attn.defined() ? static_cast<T*>(attn.data_ptr()) : nullptr;
  const M scale_d = M(a.p < 1.0 ? 1.0 / (1.0 - a.p) : 0.0);
  cpu::parallel_for(
      a.rows,
      [&](std::int64_t r) {
        const std::int64_t mrow = mk != nullptr ? a.mask_row(r) : 0;
        auto z = [&](std::int64_t j) { return formulas::attention_logit<T, MaskT>(a, s, mk, mrow, r, j); };
        M mx = -std::numeric_limits<M>::infinity();
        for (std::int64_t j = 0; j < a.S; ++j) mx = formulas::max_nan(mx, z(j));
        const M sum = formulas::lane_sum<M>(a.S, [&](std::int64_t j) { return formulas::exp_m(z(j) - mx); });
        for (std::int64_t j = 0; j < a.S; ++j) {
          const T p = T(formulas::attention_prob(z(j), mx, sum));
          pp[r * a.S + j] = p;
          if (pa != nullptr) pa[r * a.S + j] = T(formulas::attention_drop(a, r * a.S + j, M(p), scale_d));
        }
      },
      row_grain(a.S));
}

template <class T>
void softmax_backward_rows(const Tensor& probs, const Tensor& dattn, const Tensor& dscores, const Tensor& dlogits,
                           const AttentionRows& a) {
  using M = op_math_t<T>;
  const T* p = static_cast<const T*>(probs.data_ptr());
  const T* da = static_cast<const T*>(dattn.data_ptr());
  T* ds = static_cast<T*>(dscores.data_ptr());
  T* dz = dlogits.defined() ? static_cast<T*>(dlogits.data_ptr()) : nullptr;
  const M scale_d = M(a.p < 1.0 ? 1.0 / (1.0 - a.p) : 0.0), scale = M(a.scale);
  cpu::parallel_for(
      a.rows,
      [&](std::int64_t r) {
        const std::int64_t b = r * a.S;
        auto dp = [&](std::int64_t j) { return formulas::attention_drop(a, b + j, M(da[b + j]), scale_d); };
        const M dot = formulas::lane_sum<M>(a.S, [&](std::int64_t j) { return dp(j) * M(p[b + j]); });
        for (std::int64_t j = 0; j < a.S; ++j) {
          const M g = M(p[b + j]) * (dp(j) - dot);
          ds[b + j] = T(g * scale);
          if (dz != nullptr) dz[b + j] = T(g);
        }
      },
      row_grain(a.S));
}

}  // namespace

void attention_softmax(const Tensor& scores, const Tensor& mask, const Tensor& probs, const Tensor& attn,
                       const AttentionRows& a) {
  if (a.rows == 0 || a.S == 0) return;
  if (probs.is_cuda()) {
    QGRAD_ON_CUDA(cuda::attention_softmax_warp_rows(scores, mask, probs, attn, a));
    return;
  }
  dispatch_floating(probs.dtype(), "scaled_dot_product_attention", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (a.mask == AttentionMaskKind::boolean) softmax_rows<T, bool>(scores, mask, probs, attn, a);
    else softmax_rows<T, T>(scores, mask, probs, attn, a);
  });
}

void attention_dropout(const Tensor& probs, const Tensor& attn, const AttentionRows& a) {
  if (probs.numel() == 0) return;
  if (probs.is_cuda()) {
    QGRAD_ON_CUDA(cuda::attention_dropout(probs, attn, a));
    return;
  }
  dispatch_floating(probs.dtype(), "scaled_dot_product_attention", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using M = op_math_t<T>;
    const T* p = static_cast<const T*>(probs.data_ptr());
    T* o = static_cast<T*>(attn.data_ptr());
    const M scale_d = M(a.p < 1.0 ? 1.0 / (1.0 - a.p) : 0.0);
    cpu::parallel_for(probs.numel(), [&](std::int64_t i) { o[i] = T(formulas::attention_drop(a, i, M(p[i]), scale_d)); });
  });
}

void attention_softmax_backward(const Tensor& probs, const Tensor& dattn, const Tensor& dscores,
                                const Tensor& dlogits, const AttentionRows& a) {
  if (a.rows == 0 || a.S == 0) return;
  if (probs.is_cuda()) {
    QGRAD_ON_CUDA(cuda::attention_softmax_backward_warp_rows(probs, dattn, dscores, dlogits, a));
    return;
  }
  dispatch_floating(probs.dtype(), "scaled_dot_product_attention",
                    [&](auto tag) { softmax_backward_rows<typename decltype(tag)::type>(probs, dattn, dscores, dlogits, a); });
}

}  // namespace qgrad::kernels
