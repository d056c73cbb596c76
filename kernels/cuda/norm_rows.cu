// layer_norm, rms_norm (forward and input gradient) and softmax along a
// contiguous last axis (forward and backward) on CUDA, one warp per row for
// rows of at least kNormWarpMin elements (use_norm_warp). Lane l handles
// elements l, l + 32, ... in order and the lanes combine by a shuffle-down
// tree: exactly formulas::lane_sum's order, so each row gives the bits of the
// one-index-per-row loop of kernels/transformer.cpp (the CPU's), with the same
// per-element formulas. The weight and bias gradients stay in that file.
#include "qgrad/kernels/cuda/entries.h"
#include "qgrad/kernels/cuda/warp_rows.cuh"
#include "qgrad/kernels/formulas/transformer.h"

namespace qgrad::kernels::cuda {

namespace {

template <class T>
void layer_norm_impl(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y, const Tensor& mean,
                     const Tensor& rstd, std::int64_t d, double eps_d) {
  using M = op_math_t<T>;
  const T* px = static_cast<const T*>(x.data_ptr());
  const T* pw = w.defined() ? static_cast<const T*>(w.data_ptr()) : nullptr;
  const T* pb = b.defined() ? static_cast<const T*>(b.data_ptr()) : nullptr;
  T* py = static_cast<T*>(y.data_ptr());
  M* pm = static_cast<M*>(mean.data_ptr());
  M* pr = static_cast<M*>(rstd.data_ptr());
  const M eps = M(eps_d);
  launch_warp_rows(y.device().index, y.numel() / d, [=] __device__(std::int64_t r, int lane) {
    const T* xr = px + r * d;
    M s = M(0);
    for (std::int64_t j = lane; j < d; j += 32) s += M(xr[j]);
    const M mu = warp_lane_sum(s) / M(d);
    M s2 = M(0);
    for (std::int64_t j = lane; j < d; j += 32) {
      const M c = M(xr[j]) - mu;
      s2 += c * c;
    }
    const M var = warp_lane_sum(s2) / M(d);
    const M rs = M(1) / formulas::sqrt_m(var + eps);
    for (std::int64_t j = lane; j < d; j += 32) {
      M v = (M(xr[j]) - mu) * rs;
      if (pw != nullptr) v = v * M(pw[j]);
      if (pb != nullptr) v = v + M(pb[j]);
      py[r * d + j] = T(v);
    }
    if (lane == 0) {
      pm[r] = mu;
      pr[r] = rs;
    }
  });
}

template <class T>
void rms_norm_impl(const Tensor& x, const Tensor& w, const Tensor& y, const Tensor& rstd, std::int64_t d,
                   double eps_d) {
  using M = op_math_t<T>;
  const T* px = static_cast<const T*>(x.data_ptr());
  const T* pw = w.defined() ? static_cast<const T*>(w.data_ptr()) : nullptr;
  T* py = static_cast<T*>(y.data_ptr());
  M* pr = static_cast<M*>(rstd.data_ptr());
  const M eps = M(eps_d);
  launch_warp_rows(y.device().index, y.numel() / d, [=] __device__(std::int64_t r, int lane) {
    const T* xr = px + r * d;
    M s = M(0);
    for (std::int64_t j = lane; j < d; j += 32) s += M(xr[j]) * M(xr[j]);
    const M ms = warp_lane_sum(s) / M(d);
    const M rs = M(1) / formulas::sqrt_m(ms + eps);
    for (std::int64_t j = lane; j < d; j += 32) {
      M v = M(xr[j]) * rs;
      if (pw != nullptr) v = v * M(pw[j]);
      py[r * d + j] = T(v);
    }
    if (lane == 0) pr[r] = rs;
  });
}

// dx = rstd * (g - [centered] sum(g) / d - xhat * sum(g * xhat) / d), g = dy * w.
template <class T>
void norm_backward_impl(const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd, const Tensor& dy,
                        const Tensor& dx, std::int64_t d) {
  using M = op_math_t<T>;
  const T* px = static_cast<const T*>(x.data_ptr());
  const T* pw = w.defined() ? static_cast<const T*>(w.data_ptr()) : nullptr;
  const M* pm = mean.defined() ? static_cast<const M*>(mean.data_ptr()) : nullptr;
  const M* pr = static_cast<const M*>(rstd.data_ptr());
  const T* pg = static_cast<const T*>(dy.data_ptr());
  T* pd = static_cast<T*>(dx.data_ptr());
  launch_warp_rows(dx.device().index, dx.numel() / d, [=] __device__(std::int64_t r, int lane) {
    const std::int64_t base = r * d;
    const M mu = pm != nullptr ? pm[r] : M(0), rs = pr[r];
    auto g = [&](std::int64_t j) { return pw != nullptr ? M(pg[base + j]) * M(pw[j]) : M(pg[base + j]); };
    auto xhat = [&](std::int64_t j) { return (M(px[base + j]) - mu) * rs; };
    M s = M(0), sx = M(0);
    for (std::int64_t j = lane; j < d; j += 32) {
      if (pm != nullptr) s += g(j);
      sx += g(j) * xhat(j);
    }
    const M mean_g = pm != nullptr ? warp_lane_sum(s) / M(d) : M(0);
    const M mean_gx = warp_lane_sum(sx) / M(d);
    for (std::int64_t j = lane; j < d; j += 32) pd[base + j] = T(rs * ((g(j) - mean_g) - xhat(j) * mean_gx));
  });
}

template <class T>
void softmax_impl(const Tensor& x, const Tensor& y, std::int64_t n) {
  using M = op_math_t<T>;
  const T* px = static_cast<const T*>(x.data_ptr());
  T* py = static_cast<T*>(y.data_ptr());
  launch_warp_rows(y.device().index, y.numel() / n, [=] __device__(std::int64_t r, int lane) {
    const T* xr = px + r * n;
    M m = M(xr[0]);
    for (std::int64_t j = lane; j < n; j += 32) m = formulas::max_nan(m, M(xr[j]));
    const M mx = warp_max(m);
    M s = M(0);
    for (std::int64_t j = lane; j < n; j += 32) s += formulas::exp_m(M(xr[j]) - mx);
    const M sum = warp_lane_sum(s);
    for (std::int64_t j = lane; j < n; j += 32) py[r * n + j] = T(formulas::exp_m(M(xr[j]) - mx) / sum);
  });
}

template <class T>
void softmax_backward_impl(const Tensor& y, const Tensor& dy, const Tensor& dx, std::int64_t n) {
  using M = op_math_t<T>;
  const T* py = static_cast<const T*>(y.data_ptr());
  const T* pg = static_cast<const T*>(dy.data_ptr());
  T* pd = static_cast<T*>(dx.data_ptr());
  launch_warp_rows(dx.device().index, dx.numel() / n, [=] __device__(std::int64_t r, int lane) {
    const std::int64_t base = r * n;
    M s = M(0);
    for (std::int64_t j = lane; j < n; j += 32) s += M(pg[base + j]) * M(py[base + j]);
    const M dot = warp_lane_sum(s);
    for (std::int64_t j = lane; j < n; j += 32) pd[base + j] = T(M(py[base + j]) * (M(pg[base + j]) - dot));
  });
}

}  // namespace

void layer_norm_warp_rows(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y, const Tensor& mean,
                          const Tensor& rstd, std::int64_t d, double eps) {
  dispatch_floating(y.dtype(), "layer_norm",
                    [&](auto tag) { layer_norm_impl<typename decltype(tag)::type>(x, w, b, y, mean, rstd, d, eps); });
}
void rms_norm_warp_rows(const Tensor& x, const Tensor& w, const Tensor& y, const Tensor& rstd, std::int64_t d,
                        double eps) {
  dispatch_floating(y.dtype(), "rms_norm",
                    [&](auto tag) { rms_norm_impl<typename decltype(tag)::type>(x, w, y, rstd, d, eps); });
}
void norm_backward_warp_rows(const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                             const Tensor& dy, const Tensor& dx, std::int64_t d) {
  dispatch_floating(dx.dtype(), "norm_backward",
                    [&](auto tag) { norm_backward_impl<typename decltype(tag)::type>(x, w, mean, rstd, dy, dx, d); });
}
void softmax_warp_rows(const Tensor& x, const Tensor& y, std::int64_t n) {
  dispatch_floating(y.dtype(), "softmax", [&](auto tag) { softmax_impl<typename decltype(tag)::type>(x, y, n); });
}
void softmax_backward_warp_rows(const Tensor& y, const Tensor& dy, const Tensor& dx, std::int64_t n) {
  dispatch_floating(dx.dtype(), "softmax_backward",
                    [&](auto tag) { softmax_backward_impl<typename decltype(tag)::type>(y, dy, dx, n); });
}

}  // namespace qgrad::kernels::cuda
