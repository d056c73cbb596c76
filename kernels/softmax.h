// Kernels of log_softmax and the fused softmax + cross-entropy.
#pragma once

#include "qgrad/core/tensor.h"
#include "qgrad/kernels/reduce.h"

namespace qgrad::kernels {

// y[o, :, j] = x - max - log(sum(exp(x - max))) along the n axis.
void log_softmax(const Tensor& x, const Tensor& y, const AxisLayout& v);
// dx = dy - exp(y) * sum(dy) along the n axis.
void log_softmax_backward(const Tensor& y, const Tensor& dy, const Tensor& dx, const AxisLayout& v);
// logits [B, C] (floating), labels [B] (s64 or s32). row_loss [B] (f32, or
// f64 for f64 logits) = logsumexp(logits[b]) - logits[b, label[b]], NaN when
// the label is outside [0, C). probs [B, C] (logits' dtype) receives
// softmax(logits) when defined.
void cross_entropy_forward(const Tensor& logits, const Tensor& labels, const Tensor& probs, const Tensor& row_loss);
// mean (a scalar of row_loss's dtype) = the batch mean of those row losses,
// in one launch where the device has a path for it (CUDA, B <= 256, rows of
// fewer than 33 classes), with the bits of cross_entropy_forward followed by
// sum_axis's mean; returns false, writing nothing, otherwise.
bool cross_entropy_mean(const Tensor& logits, const Tensor& labels, const Tensor& probs, const Tensor& mean);
// dlogits[b, c] = (probs[b, c] - [c == label[b]]) * g / B, with g a
// one-element tensor of probs' dtype on the same device (read on device).
// Rows with an out-of-range label get NaN.
void cross_entropy_backward(const Tensor& probs, const Tensor& labels, const Tensor& g, const Tensor& dlogits);
// row_loss[b] = -logp[b, labels[b]] (NaN when out of range); row_loss as in
// cross_entropy_forward.
void nll_forward(const Tensor& logp, const Tensor& labels, const Tensor& row_loss);
// dlogp[b, c] = -g / B where c == labels[b], else 0 (NaN rows for bad labels).
void nll_backward(const Tensor& labels, const Tensor& g, const Tensor& dlogp);

}  // namespace qgrad::kernels

namespace qgrad::kernels {
// Calls f(TypeTag<L>{}) with L the label type (s32 or s64; checked by the op).
template <class F>
decltype(auto) dispatch_label(DType t, F&& f) {
  if (t == DType::s32) return f(TypeTag<std::int32_t>{});
  return f(TypeTag<std::int64_t>{});
}
// Calls f(TypeTag<T>{}, TypeTag<L>{}) for a floating dtype T and a label type L.
template <class F>
void dispatch_floating_label(DType t, DType labels, const char* op, F&& f) {
  dispatch_floating(t, op, [&](auto tag) { dispatch_label(labels, [&](auto ltag) { f(tag, ltag); }); });
}
}  // namespace qgrad::kernels
