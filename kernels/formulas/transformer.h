// Scalar and row formulas of the transformer ops (gelu, silu, softmax,
// layer_norm, rms_norm, dropout), shared by CPU and CUDA. M is the math type:
// float for f32/f16/bf16, double for f64.
//
// The transcendental functions (exp, erf, tanh) are the platform's own: glibc
// on the CPU, libdevice on CUDA. Both are within an ulp or two of the exact
// value but not always the same ulp, so the ops that call them promise a
// tolerance across devices, not bits; the rest (+, *, /, sqrt) is correctly
// rounded on both, so the normalisations are bit-identical.
#pragma once

#include <cmath>
#include <cstdint>

#include "qgrad/core/half.h"
#include "qgrad/core/random.h"
#include "qgrad/kernels/bitmask.h"
#include "qgrad/kernels/formulas/cast.h"
#include "qgrad/kernels/formulas/softmax.h"

namespace qgrad::formulas {

template <class M>
QGRAD_HD M erf_m(M x) {
#if defined(__CUDA_ARCH__)
  if constexpr (sizeof(M) == 4) return ::erff(x);
  else return ::erf(x);
#else
  return std::erf(x);
#endif
}

template <class M>
QGRAD_HD M tanh_m(M x) {
#if defined(__CUDA_ARCH__)
  if constexpr (sizeof(M) == 4) return ::tanhf(x);
  else return ::tanh(x);
#else
  return std::tanh(x);
#endif
}

template <class M>
QGRAD_HD M sqrt_m(M x) {
#if defined(__CUDA_ARCH__)
  if constexpr (sizeof(M) == 4) return ::sqrtf(x);  // correctly rounded (nvcc's default -prec-sqrt=true)
  else return ::sqrt(x);
#else
  return std::sqrt(x);
#endif
}

// ---- gelu: PyTorch's formulas (aten/src/ATen/native/cuda/ActivationGeluKernel.cu),
// in the same order of operations, with its constants rounded to M.
// sqrt(1/2): the erf form's kAlpha.
template <class M>
QGRAD_HD M gelu_alpha() {
  return M(0.70710678118654752440);  // M_SQRT1_2
}
// sqrt(2 / pi) = M_SQRT2 * M_2_SQRTPI * 0.5: the tanh form's kBeta.
template <class M>
QGRAD_HD M gelu_tanh_beta() {
  return M(1.41421356237309504880 * 1.12837916709551257390 * 0.5);
}
// 0.044715: the tanh form's kKappa.
template <class M>
QGRAD_HD M gelu_tanh_kappa() {
  return M(0.044715);
}
// 1 / sqrt(2 pi) = M_2_SQRTPI * M_SQRT1_2 * 0.5: the erf form's backward kBeta.
template <class M>
QGRAD_HD M gelu_pdf_scale() {
  return M(1.12837916709551257390 * 0.70710678118654752440 * 0.5);
}

// x * 0.5 * (1 + erf(x / sqrt(2))).
template <class M>
QGRAD_HD M gelu_erf(M x) {
  return x * M(0.5) * (M(1) + erf_m(x * gelu_alpha<M>()));
}
// 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))).
template <class M>
QGRAD_HD M gelu_tanh(M x) {
  const M x_cube = x * x * x;
  const M inner = gelu_tanh_beta<M>() * (x + gelu_tanh_kappa<M>() * x_cube);
  return M(0.5) * x * (M(1) + tanh_m(inner));
}
// dy * (cdf + x * pdf): cdf = 0.5 (1 + erf(x / sqrt 2)), pdf = exp(-x^2 / 2) / sqrt(2 pi).
template <class M>
QGRAD_HD M gelu_erf_backward(M dy, M x) {
  const M cdf = M(0.5) * (M(1) + erf_m(x * gelu_alpha<M>()));
  const M pdf = exp_m(M(-0.5) * x * x) * gelu_pdf_scale<M>();
  return dy * (cdf + x * pdf);
}
// The derivative of the tanh form, term by term as PyTorch writes it.
template <class M>
QGRAD_HD M gelu_tanh_backward(M dy, M x) {
  const M x_sq = x * x;
  const M x_cube = x_sq * x;
  const M inner = gelu_tanh_beta<M>() * (x + gelu_tanh_kappa<M>() * x_cube);
  const M tanh_inner = tanh_m(inner);
  const M left = M(0.5) * x;
  const M right = M(1) + tanh_inner;
  const M left_derivative = M(0.5) * right;
  const M tanh_derivative = M(1) - tanh_inner * tanh_inner;
  const M inner_derivative = gelu_tanh_beta<M>() * (M(1) + M(3) * gelu_tanh_kappa<M>() * x_sq);
  const M right_derivative = left * tanh_derivative * inner_derivative;
  return dy * (left_derivative + right_derivative);
}

// ---- silu: PyTorch's formulas (aten/src/ATen/native/cuda/ActivationSiluKernel.cu).
// x / (1 + exp(-x)).
template <class M>
QGRAD_HD M silu(M x) {
  return x / (M(1) + exp_m(-x));
}
// dy * s * (1 + x (1 - s)), s = 1 / (1 + exp(-x)).
template <class M>
QGRAD_HD M silu_backward(M dy, M x) {
  const M s = M(1) / (M(1) + exp_m(-x));
  return dy * s * (M(1) + x * (M(1) - s));
}

// ---- the fixed summation order of the row kernels ----
// Sum of f(r) for r in [0, n): lane l (of kLanes) sums r = l, l + kLanes, ...
// in order, then the lanes combine as a tree (s[l] += s[l + h] for h = 16, 8,
// 4, 2, 1). The order depends on n only, never on the device or the thread
// count: a CPU iteration and a CUDA thread running it give the same bits.
// (A warp-per-row CUDA kernel with lane-strided loads and a shuffle-down tree
// reproduces exactly this order.)
inline constexpr int kLanes = 32;
template <class M, class F>
QGRAD_HD M lane_sum(std::int64_t n, F f) {
  M s[kLanes];
  for (int l = 0; l < kLanes; ++l) {
    M acc = M(0);
    for (std::int64_t r = l; r < n; r += kLanes) acc += f(r);
    s[l] = acc;
  }
  for (int h = kLanes / 2; h > 0; h /= 2)
    for (int l = 0; l < h; ++l) s[l] += s[l + h];
  return s[0];
}

// ---- softmax along an axis: a row is n elements `stride` apart ----
// y = exp(x - max) / sum(exp(x - max)); a NaN anywhere in the row gives a NaN row.
template <class T>
QGRAD_HD void softmax_row(const T* x, T* y, std::int64_t n, std::int64_t stride) {
  using M = op_math_t<T>;
  M mx = M(x[0]);
  for (std::int64_t r = 1; r < n; ++r) mx = max_nan(mx, M(x[r * stride]));
  const M sum = lane_sum<M>(n, [&](std::int64_t r) { return exp_m(M(x[r * stride]) - mx); });
  for (std::int64_t r = 0; r < n; ++r) y[r * stride] = T(exp_m(M(x[r * stride]) - mx) / sum);
}
// dx = y * (dy - sum(dy * y)).
template <class T>
QGRAD_HD void softmax_backward_row(const T* y, const T* dy, T* dx, std::int64_t n, std::int64_t stride) {
  using M = op_math_t<T>;
  const M dot = lane_sum<M>(n, [&](std::int64_t r) { return M(dy[r * stride]) * M(y[r * stride]); });
  for (std::int64_t r = 0; r < n; ++r) dx[r * stride] = T(M(y[r * stride]) * (M(dy[r * stride]) - dot));
}

// ---- layer_norm / rms_norm over one contiguous row of d elements ----
// layer_norm: mean = sum(x) / d, var = sum((x - mean)^2) / d (two passes:
// exact for rows with a large offset), rstd = 1 / sqrt(var + eps),
// y = (x - mean) * rstd * w + b (w, b optional: null).
template <class T>
QGRAD_HD void layer_norm_row(const T* x, const T* w, const T* b, T* y, std::int64_t d, op_math_t<T> eps,
                             op_math_t<T>* mean_out, op_math_t<T>* rstd_out) {
  using M = op_math_t<T>;
  const M mean = lane_sum<M>(d, [&](std::int64_t j) { return M(x[j]); }) / M(d);
  const M var = lane_sum<M>(d, [&](std::int64_t j) {
                  const M c = M(x[j]) - mean;
                  return c * c;
                }) / M(d);
  const M rstd = M(1) / sqrt_m(var + eps);
  for (std::int64_t j = 0; j < d; ++j) {
    M v = (M(x[j]) - mean) * rstd;
    if (w != nullptr) v = v * M(w[j]);
    if (b != nullptr) v = v + M(b[j]);
    y[j] = T(v);
  }
  *mean_out = mean;
  *rstd_out = rstd;
}
// rms_norm: rstd = 1 / sqrt(sum(x^2) / d + eps), y = (x * rstd) * w.
template <class T>
QGRAD_HD void rms_norm_row(const T* x, const T* w, T* y, std::int64_t d, op_math_t<T> eps, op_math_t<T>* rstd_out) {
  using M = op_math_t<T>;
  const M ms = lane_sum<M>(d, [&](std::int64_t j) { return M(x[j]) * M(x[j]); }) / M(d);
  const M rstd = M(1) / sqrt_m(ms + eps);
  for (std::int64_t j = 0; j < d; ++j) {
    M v = M(x[j]) * rstd;
    if (w != nullptr) v = v * M(w[j]);
    y[j] = T(v);
  }
  *rstd_out = rstd;
}
// g (element i's gradient in op math), or with a fake quant's saved mask
// g * bit i (its straight-through backward, FakeQuantGradOp's product: -0.0
// kept), so that a norm whose output was fake-quantized reads the masked
// gradient without a pass writing it.
template <class M>
QGRAD_HD M mask_product(M g, const std::uint32_t* mask, std::int64_t i) {
  return mask == nullptr ? g : g * M(bitmask_get(mask, i) ? 1 : 0);
}
// mask_product of dy[i].
template <class T>
QGRAD_HD op_math_t<T> masked_grad(const T* dy, const std::uint32_t* mask, std::int64_t i) {
  return mask_product(op_math_t<T>(dy[i]), mask, i);
}

// masked_grad of a gradient held in S, converted to T first (kernels::cast's
// conversion, then FakeQuantGradOp's product in T's math): the bits of the
// cast's pass followed by the mask's, NaN payloads included (a GPU
// multiply returns its canonical NaN, so the product must be T's).
template <class T, class S>
QGRAD_HD op_math_t<T> masked_grad_cast(const S* dy, const std::uint32_t* mask, std::int64_t i) {
  using M = op_math_t<T>;
  return mask_product(M(cast_value<T>(dy[i])), mask, i);
}

// A gradient v (already in T) plus the gradient `pending` (null: none)
// another consumer passed back for the same tensor, rounded as the
// backward engine's sum of the two (kernels::binary, BinaryOp::add:
// T(M(pending) + M(v))): a rule that folds the pending gradient writes the
// bits the engine's add would have.
template <class T>
QGRAD_HD T fold_pending(T v, const T* pending, std::int64_t i) {
  using M = op_math_t<T>;
  return pending == nullptr ? v : T(M(pending[i]) + M(v));
}

// The input gradient of both, from the saved mean (0 for rms_norm) and rstd:
// xhat = (x - mean) * rstd, g = dy * w (dy without w),
// dx = rstd * (g - [layer_norm] sum(g) / d - xhat * sum(g * xhat) / d).
// With `mask` (bit row0 + j for dy[j]), dy is masked_grad's; with `pending`
// (the row's d values), dx is fold_pending's.
template <class T, bool kCentered>
QGRAD_HD void norm_backward_row(const T* x, const T* w, const T* dy, T* dx, std::int64_t d, op_math_t<T> mean,
                                op_math_t<T> rstd, const std::uint32_t* mask = nullptr, std::int64_t row0 = 0,
                                const T* pending = nullptr) {
  using M = op_math_t<T>;
  auto dyj = [&](std::int64_t j) {
    return mask == nullptr ? M(dy[j]) : M(dy[j]) * M(bitmask_get(mask, row0 + j) ? 1 : 0);
  };
  auto g = [&](std::int64_t j) { return w != nullptr ? dyj(j) * M(w[j]) : dyj(j); };
  auto xhat = [&](std::int64_t j) { return (M(x[j]) - mean) * rstd; };
  const M mean_g = kCentered ? lane_sum<M>(d, g) / M(d) : M(0);
  const M mean_gx = lane_sum<M>(d, [&](std::int64_t j) { return g(j) * xhat(j); }) / M(d);
  for (std::int64_t j = 0; j < d; ++j) dx[j] = fold_pending(T(rstd * ((g(j) - mean_g) - xhat(j) * mean_gx)), pending, j);
}

// ---- dropout ----
// Element i of a draw at counter offset `offset` is kept iff its uniform
// u = random_uniform(seed, offset + i) in [0, 1) is >= p (probability 1 - p).
QGRAD_HD bool dropout_keep(std::uint64_t seed, std::uint64_t offset, std::int64_t i, double p) {
  return random_uniform(seed, offset + static_cast<std::uint64_t>(i)) >= p;
}
// y = x * (keep ? 1 / (1 - p) : 0): a dropped NaN stays NaN, as in PyTorch
// (x * mask * scale). The backward is the same product with dy.
template <class M>
QGRAD_HD M dropout_apply(M x, bool keep, M scale) {
  return x * (keep ? scale : M(0));
}

}  // namespace qgrad::formulas
