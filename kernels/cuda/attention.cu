// scaled_dot_product_attention's fused row kernels on CUDA, one warp per row:
// lane l handles columns l, l + 32, ... ; the row max by butterfly, the sums
// in formulas::lane_sum's order (warp_lane_sum), so a row gives the CPU's
// bits wherever exp does. The element formulas are kernels/formulas/attention.h.
#include "qgrad/kernels/cuda/entries.h"
#include "qgrad/kernels/cuda/launch.cuh"
#include "qgrad/kernels/cuda/warp_rows.cuh"
#include "qgrad/kernels/formulas/attention.h"

namespace qgrad::kernels::cuda {

namespace {

template <class T, class MaskT>
void softmax_impl(const Tensor& scores, const Tensor& mask, const Tensor& probs, const Tensor& attn,
                  const AttentionRows& a) {
  using M = op_math_t<T>;
  const T* s = static_cast<const T*>(scores.data_ptr());
  const MaskT* mk = mask.defined() ? static_cast<const MaskT*>(mask.data_ptr()) : nullptr;
  T* pp = static_cast<T*>(probs.data_ptr());
  T* pa = attn.defined() ? static_cast<T*>(attn.data_ptr()) : nullptr;
  const M scale_d = M(a.p < 1.0 ? 1.0 / (1.0 - a.p) : 0.0);
  launch_warp_rows(probs.device().index, a.rows, [=] __device__(std::int64_t r, int lane) {
    const std::int64_t mrow = mk != nullptr ? a.mask_row(r) : 0;
    M m = -std::numeric_limits<M>::infinity();
    for (std::int64_t j = lane; j < a.S; j += 32) m = formulas::max_nan(m, formulas::attention_logit<T, MaskT>(a, s, mk, mrow, r, j));
    const M mx = warp_max(m);
    M part = M(0);
    for (std::int64_t j = lane; j < a.S; j += 32)
      part += formulas::exp_m(formulas::attention_logit<T, MaskT>(a, s, mk, mrow, r, j) - mx);
    const M sum = warp_lane_sum(part);
    for (std::int64_t j = lane; j < a.S; j += 32) {
      const T p = T(formulas::attention_prob(formulas::attention_logit<T, MaskT>(a, s, mk, mrow, r, j), mx, sum));
      pp[r * a.S + j] = p;
      if (pa != nullptr) pa[r * a.S + j] = T(formulas::attention_drop(a, r * a.S + j, M(p), scale_d));
    }
  });
}

template <class T>
void softmax_backward_impl(const Tensor& probs, const Tensor& dattn, const Tensor& dscores, const Tensor& dlogits,
                           const AttentionRows& a) {
  using M = op_math_t<T>;
  const T* p = static_cast<const T*>(probs.data_ptr());
  const T* da = static_cast<const T*>(dattn.data_ptr());
  T* ds = static_cast<T*>(dscores.data_ptr());
  T* dz = dlogits.defined() ? static_cast<T*>(dlogits.data_ptr()) : nullptr;
  const M scale_d = M(a.p < 1.0 ? 1.0 / (1.0 - a.p) : 0.0), scale = M(a.scale);
  launch_warp_rows(probs.device().index, a.rows, [=] __device__(std::int64_t r, int lane) {
    const std::int64_t b = r * a.S;
    M part = M(0);
    for (std::int64_t j = lane; j < a.S; j += 32)
      part += formulas::attention_drop(a, b + j, M(da[b + j]), scale_d) * M(p[b + j]);
    const M dot = warp_lane_sum(part);
    for (std::int64_t j = lane; j < a.S; j += 32) {
      const M g = M(p[b + j]) * (formulas::attention_drop(a, b + j, M(da[b + j]), scale_d) - dot);
      ds[b + j] = T(g * scale);
      if (dz != nullptr) dz[b + j] = T(g);
    }
  });
}

template <class T>
void dropout_impl(const Tensor& probs, const Tensor& attn, const AttentionRows& a) {
  using M = op_math_t<T>;
  const T* p = static_cast<const T*>(probs.data_ptr());
  T* o = static_cast<T*>(attn.data_ptr());
  const M scale_d = M(a.p < 1.0 ? 1.0 / (1.0 - a.p) : 0.0);
  launch_elementwise(probs.device().index, probs.numel(), [=] __device__(std::int64_t i) {
    o[i] = T(formulas::attention_drop(a, i, M(p[i]), scale_d));
  });
}

}  // namespace

void attention_softmax_warp_rows(const Tensor& scores, const Tensor& mask, const Tensor& probs, const Tensor& attn,
                                 const AttentionRows& a) {
  dispatch_floating(probs.dtype(), "scaled_dot_product_attention", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (a.mask == AttentionMaskKind::boolean) softmax_impl<T, bool>(scores, mask, probs, attn, a);
    else softmax_impl<T, T>(scores, mask, probs, attn, a);
  });
}

void attention_softmax_backward_warp_rows(const Tensor& probs, const Tensor& dattn, const Tensor& dscores,
                                          const Tensor& dlogits, const AttentionRows& a) {
  dispatch_floating(probs.dtype(), "scaled_dot_product_attention", [&](auto tag) {
    softmax_backward_impl<typename decltype(tag)::type>(probs, dattn, dscores, dlogits, a);
  });
}

void attention_dropout(const Tensor& probs, const Tensor& attn, const AttentionRows& a) {
  dispatch_floating(probs.dtype(), "scaled_dot_product_attention",
                    [&](auto tag) { dropout_impl<typename decltype(tag)::type>(probs, attn, a); });
}

}  // namespace qgrad::kernels::cuda
