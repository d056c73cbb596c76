// Scalar formulas of log_softmax and cross_entropy, shared by CPU and CUDA.
// M is the math type: float for f32/f16/bf16, double for f64.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "qgrad/core/half.h"

namespace qgrad::formulas {

template <class M>
QGRAD_HD M exp_m(M x) {
#if defined(__CUDA_ARCH__)
  if constexpr (sizeof(M) == 4) return ::expf(x);
  else return ::exp(x);
#else
  return std::exp(x);
#endif
}

template <class M>
QGRAD_HD M log_m(M x) {
#if defined(__CUDA_ARCH__)
  if constexpr (sizeof(M) == 4) return ::logf(x);
  else return ::log(x);
#else
  return std::log(x);
#endif
}

// Running max that lets NaN win, so a NaN row gives NaN outputs.
template <class M>
QGRAD_HD M max_nan(M a, M b) {
  return (a != a || a > b) ? a : b;
}

template <class M>
QGRAD_HD M quiet_nan() {
  return std::numeric_limits<M>::quiet_NaN();
}

// log_softmax backward at one element: dx = dy - exp(y) * sum(dy).
template <class M>
QGRAD_HD M log_softmax_grad(M dy, M y, M sum_dy) {
  return dy - exp_m(y) * sum_dy;
}

// cross_entropy backward at one element: (p - [c == label]) * g / B.
template <class M>
QGRAD_HD M cross_entropy_grad(M p, bool is_label, M g_over_b) {
  return (p - (is_label ? M(1) : M(0))) * g_over_b;
}

// ---- whole rows: one caller (CPU iteration or CUDA thread) per row ----
// A row is n elements `stride` apart. Both devices run these same loops.

// y = (x - max) - log(sum(exp(x - max))).
template <class T>
QGRAD_HD void log_softmax_row(const T* x, T* y, std::int64_t n, std::int64_t stride) {
  using M = op_math_t<T>;
  M mx = M(x[0]);
  for (std::int64_t r = 1; r < n; ++r) mx = max_nan(mx, M(x[r * stride]));
  M sum = M(0);
  for (std::int64_t r = 0; r < n; ++r) sum += exp_m(M(x[r * stride]) - mx);
  const M lse = log_m(sum);
  for (std::int64_t r = 0; r < n; ++r) y[r * stride] = T((M(x[r * stride]) - mx) - lse);
}

template <class T>
QGRAD_HD void log_softmax_backward_row(const T* y, const T* dy, T* dx, std::int64_t n, std::int64_t stride) {
  using M = op_math_t<T>;
  M sum = M(0);
  for (std::int64_t r = 0; r < n; ++r) sum += M(dy[r * stride]);
  for (std::int64_t r = 0; r < n; ++r) dx[r * stride] = T(log_softmax_grad(M(dy[r * stride]), M(y[r * stride]), sum));
}

// A row's loss given its max and sum(exp(x - max)): log(sum) - (x[label] - max),
// NaN when label is outside [0, C) (x[label] is then never read).
template <class T>
QGRAD_HD op_math_t<T> cross_entropy_loss(const T* x, std::int64_t label, std::int64_t C, op_math_t<T> mx,
                                         op_math_t<T> sum) {
  using M = op_math_t<T>;
  return (label >= 0 && label < C) ? log_m(sum) - (M(x[label]) - mx) : quiet_nan<M>();
}

// One row of logits (C contiguous values): returns logsumexp - x[label]
// (NaN when label is outside [0, C)); writes softmax into p when non-null.
template <class T>
QGRAD_HD op_math_t<T> cross_entropy_row(const T* x, std::int64_t label, std::int64_t C, T* p) {
  using M = op_math_t<T>;
  M mx = M(x[0]);
  for (std::int64_t c = 1; c < C; ++c) mx = max_nan(mx, M(x[c]));
  M sum = M(0);
  for (std::int64_t c = 0; c < C; ++c) sum += exp_m(M(x[c]) - mx);
  if (p != nullptr)
    for (std::int64_t c = 0; c < C; ++c) p[c] = T(exp_m(M(x[c]) - mx) / sum);
  return cross_entropy_loss(x, label, C, mx, sum);
}

// dlogits at flat index i of [B, C]: NaN for a row whose label is invalid.
template <class T>
QGRAD_HD T cross_entropy_grad_at(const T* p, std::int64_t label, std::int64_t i, std::int64_t C,
                                 op_math_t<T> g_over_b) {
  using M = op_math_t<T>;
  if (label < 0 || label >= C) return T(quiet_nan<M>());
  return T(cross_entropy_grad(M(p[i]), label == i % C, g_over_b));
}

// nll_loss: the row loss -logp[label] (NaN for an invalid label) and the
// gradient at flat index i of [B, C]: -g/B at the label, 0 elsewhere.
template <class T>
QGRAD_HD op_math_t<T> nll_row(const T* logp, std::int64_t label, std::int64_t C) {
  using M = op_math_t<T>;
  return (label >= 0 && label < C) ? -M(logp[label]) : quiet_nan<M>();
}
template <class T>
QGRAD_HD T nll_grad_at(std::int64_t label, std::int64_t i, std::int64_t C, op_math_t<T> g_over_b) {
  using M = op_math_t<T>;
  if (label < 0 || label >= C) return T(quiet_nan<M>());
  return T(label == i % C ? -g_over_b : M(0));
}

}  // namespace qgrad::formulas
