// layer_norm, rms_norm (forward and input gradient) and softmax along a
// contiguous last axis (forward and backward) on CUDA, one warp per row for
// rows of at least kNormWarpMin elements (use_norm_warp), held in registers
// where they fit (LaneRow, warp_rows.cuh). Lane l handles
// elements l, l + 32, ... in order and the lanes combine by a shuffle-down
// tree: exactly formulas::lane_sum's order, so each row gives the bits of the
// one-index-per-row loop of kernels/transformer.cpp (the CPU's), with the same
// per-element formulas. The weight and bias gradients stay in that file.
#include "qgrad/kernels/bitmask.h"
#include "qgrad/kernels/cuda/entries.h"
#include "qgrad/kernels/cuda/launch.cuh"
#include "qgrad/kernels/cuda/minmax.cuh"
#include "qgrad/kernels/cuda/warp_rows.cuh"
#include "qgrad/kernels/formulas/lowbit.h"
#include "qgrad/kernels/formulas/transformer.h"
#include "qgrad/kernels/transformer.h"

namespace qgrad::kernels::cuda {

namespace {

template <class T, class Shape>
void layer_norm_launch(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y, const Tensor& mean,
                       const Tensor& rstd, std::int64_t d, double eps_d) {
  using M = op_math_t<T>;
  const T* px = static_cast<const T*>(x.data_ptr());
  const T* pw = w.defined() ? static_cast<const T*>(w.data_ptr()) : nullptr;
  const T* pb = b.defined() ? static_cast<const T*>(b.data_ptr()) : nullptr;
  T* py = static_cast<T*>(y.data_ptr());
  M* pm = static_cast<M*>(mean.data_ptr());
  M* pr = static_cast<M*>(rstd.data_ptr());
  const M eps = M(eps_d);
  launch_lane_rows<Shape::per>(y.device().index, y.numel() / d, [=] __device__(std::int64_t r, int lane) {
    const LaneRow<T, Shape::per, Shape::full> xr(px + r * d, d, lane);
    M s = M(0);
    xr.each([&](int t) { s += xr[t]; });
    const M mu = warp_lane_sum(s) / M(d);
    M s2 = M(0);
    xr.each([&](int t) {
      const M c = xr[t] - mu;
      s2 += c * c;
    });
    const M var = warp_lane_sum(s2) / M(d);
    const M rs = M(1) / formulas::sqrt_m(var + eps);
    xr.each_with(pw, pb, [&](int t, M wt, M bt) {
      M v = (xr[t] - mu) * rs;
      if (pw != nullptr) v = v * wt;
      if (pb != nullptr) v = v + bt;
      py[r * d + xr.index(t)] = T(v);
    });
    if (lane == 0) {
      pm[r] = mu;
      pr[r] = rs;
    }
  });
}

// layer_norm then the per-token fake quant of its output, a warp a row of
// d = 32 * kPer elements held in registers (lane l: elements l, l + 32, ...):
// layer_norm_launch's sums and element formula (the same bits), then
// fake_quantize_dynamic_rows_kernel's min/max, qparams and fake quant (its
// warp_minmax_values and FakeQuantOp's float form where exact)
// (kernels/cuda/quantize_rows.cu) on the rounded outputs; the mask by one ballot
// per 32 consecutive elements.
template <class T>
struct NormQuantPtrs {
  const T* x;
  const T* w;
  const T* b;
  T* y;
  op_math_t<T>* mean;
  op_math_t<T>* rstd;
  std::uint32_t* mask;
  std::int64_t rows;
};

template <class T, int kPer>
__global__ void __launch_bounds__(256)
    layer_norm_fake_quantize_rows_kernel(NormQuantPtrs<T> p, NormQuantRows a) {
  ::qgrad::cuda::wait_for_prior_kernels();
  using M = op_math_t<T>;
  constexpr int d = 32 * kPer;
  const std::int64_t r = (std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x) >> 5;
  if (r >= p.rows) return;  // whole warps leave together
  const int lane = static_cast<int>(threadIdx.x & 31u);
  const T* xr = p.x + r * d;
  M xv[kPer];
#pragma unroll
  for (int t = 0; t < kPer; ++t) xv[t] = M(xr[lane + 32 * t]);
  M s = M(0);
#pragma unroll
  for (int t = 0; t < kPer; ++t) s += xv[t];
  const M mu = warp_lane_sum(s) / M(d);
  M s2 = M(0);
#pragma unroll
  for (int t = 0; t < kPer; ++t) {
    const M c = xv[t] - mu;
    s2 += c * c;
  }
  const M var = warp_lane_sum(s2) / M(d);
  const M rs = M(1) / formulas::sqrt_m(var + M(a.eps));
  T v[kPer];
  float f[kPer];
#pragma unroll
  for (int t = 0; t < kPer; ++t) {
    const int j = lane + 32 * t;
    M u = (xv[t] - mu) * rs;
    if (p.w != nullptr) u = u * M(p.w[j]);
    if (p.b != nullptr) u = u + M(p.b[j]);
    v[t] = T(u);
    f[t] = formulas::cast_value<float>(v[t]);
  }
  float lo, hi;
  warp_minmax_values(f, lo, hi);
  formulas::ChannelParams q;
  formulas::int4_qparams(lo, hi, a.qmin, a.qmax, a.symmetric, a.quant_eps, q.scale, q.zp);
  q.inv_scale = formulas::inv_scale_of(q.scale);
  const formulas::FakeQuantOp<T, true> op{a.qmin, a.qmax};
  const bool float_form = op.float_form_exact(q);
  const std::int64_t n = p.rows * d;
#pragma unroll
  for (int t = 0; t < kPer; ++t) {
    bool bit;
    const std::int64_t i = r * d + lane + 32 * t;
    p.y[i] = op.row_value(v[t], q, float_form, bit);
    if (p.mask != nullptr) bitmask_ballot_store(p.mask, i, n, bit);  // uniform across the warp
  }
  if (lane == 0) {
    p.mean[r] = mu;
    p.rstd[r] = rs;
  }
}

template <class T>
bool layer_norm_fake_quantize_impl(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y,
                                   const Tensor& mean, const Tensor& rstd, std::uint32_t* mask, const NormQuantRows& a) {
  using M = op_math_t<T>;
  const NormQuantPtrs<T> p{static_cast<const T*>(x.data_ptr()),
                           w.defined() ? static_cast<const T*>(w.data_ptr()) : nullptr,
                           b.defined() ? static_cast<const T*>(b.data_ptr()) : nullptr,
                           static_cast<T*>(y.data_ptr()),
                           static_cast<M*>(mean.data_ptr()),
                           static_cast<M*>(rstd.data_ptr()),
                           mask,
                           x.numel() / a.d};
  const auto blocks = static_cast<unsigned>((p.rows * 32 + 255) / 256);
  auto launch = [&](auto per) {
    ::qgrad::cuda::launch_kernel(y.device().index, layer_norm_fake_quantize_rows_kernel<T, decltype(per)::value>,
                                 blocks, 256, 0, p, a);
    return true;
  };
  switch (a.d) {
    case 128: return launch(std::integral_constant<int, 4>{});
    case 256: return launch(std::integral_constant<int, 8>{});
    case 384: return launch(std::integral_constant<int, 12>{});
    case 512: return launch(std::integral_constant<int, 16>{});
    case 768: return launch(std::integral_constant<int, 24>{});
    case 1024: return launch(std::integral_constant<int, 32>{});
    default: return false;
  }
}

template <class T, class Shape>
void rms_norm_launch(const Tensor& x, const Tensor& w, const Tensor& y, const Tensor& rstd, std::int64_t d,
                     double eps_d) {
  using M = op_math_t<T>;
  const T* px = static_cast<const T*>(x.data_ptr());
  const T* pw = w.defined() ? static_cast<const T*>(w.data_ptr()) : nullptr;
  T* py = static_cast<T*>(y.data_ptr());
  M* pr = static_cast<M*>(rstd.data_ptr());
  const M eps = M(eps_d);
  launch_lane_rows<Shape::per>(y.device().index, y.numel() / d, [=] __device__(std::int64_t r, int lane) {
    const LaneRow<T, Shape::per, Shape::full> xr(px + r * d, d, lane);
    M s = M(0);
    xr.each([&](int t) { s += xr[t] * xr[t]; });
    const M ms = warp_lane_sum(s) / M(d);
    const M rs = M(1) / formulas::sqrt_m(ms + eps);
    xr.each_with(pw, nullptr, [&](int t, M wt, M) {
      M v = xr[t] * rs;
      if (pw != nullptr) v = v * wt;
      py[r * d + xr.index(t)] = T(v);
    });
    if (lane == 0) pr[r] = rs;
  });
}

// dx = rstd * (g - [centered] sum(g) / d - xhat * sum(g * xhat) / d), g = dy * w.
// Full rows of up to 1024 elements are held (x and dy, dy replaced by g in
// the first walk, so the output walk loads neither dy, its mask nor w);
// ragged rows are walked in memory (held with their clamped loads, x and dy
// took 128-222 registers).
template <class T, class Shape>
void norm_backward_launch(const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd, const Tensor& dy,
                          const Tensor& dx, std::int64_t d, const std::uint32_t* dy_mask, const Tensor& dx_pending) {
  using M = op_math_t<T>;
  const T* pp = dx_pending.defined() ? static_cast<const T*>(dx_pending.data_ptr()) : nullptr;
  const T* px = static_cast<const T*>(x.data_ptr());
  const T* pw = w.defined() ? static_cast<const T*>(w.data_ptr()) : nullptr;
  const M* pm = mean.defined() ? static_cast<const M*>(mean.data_ptr()) : nullptr;
  const M* pr = static_cast<const M*>(rstd.data_ptr());
  const T* pg = static_cast<const T*>(dy.data_ptr());
  T* pd = static_cast<T*>(dx.data_ptr());
  launch_lane_rows<Shape::per>(dx.device().index, dx.numel() / d, [=] __device__(std::int64_t r, int lane) {
    const std::int64_t base = r * d;
    const LaneRow<T, Shape::per, Shape::full> xr(px + base, d, lane);
    LaneRow<T, Shape::per, Shape::full> gr(pg + base, d, lane);
    const M mu = pm != nullptr ? pm[r] : M(0), rs = pr[r];
    auto g = [&](int t) {  // formulas::masked_grad of dy, times w
      const std::int64_t j = gr.index(t);
      const M dyj = formulas::mask_product(gr[t], dy_mask, base + j);
      return pw != nullptr ? dyj * M(pw[j]) : dyj;
    };
    auto xhat = [&](int t) { return (xr[t] - mu) * rs; };
    M s = M(0), sx = M(0);
    xr.each([&](int t) {
      const M gt = g(t);
      if constexpr (Shape::per > 0) gr.v[t] = gt;
      if (pm != nullptr) s += gt;
      sx += gt * xhat(t);
    });
    const M mean_g = pm != nullptr ? warp_lane_sum(s) / M(d) : M(0);
    const M mean_gx = warp_lane_sum(sx) / M(d);
    xr.each([&](int t) {
      const std::int64_t j = base + xr.index(t);
      const M gt = Shape::per > 0 ? gr.v[t] : g(t);
      pd[j] = formulas::fold_pending(T(rs * ((gt - mean_g) - xhat(t) * mean_gx)), pp, j);
    });
  });
}

// norm_backward_launch and the first stage of the weight and bias gradients
// in one launch (norm_backward_chunks): a block per chunk of kNormChunkRows
// rows, a warp per row (warp w: rows w and w + 32, both loaded before either
// is reduced) computing dx as norm_backward_launch does (the same formulas and
// order) and parking its terms dy * xhat (NormWeightPartial's) and dy
// (NormBiasPartial's) in shared memory; then four threads per column and
// parameter sum the chunk's terms exactly as column_sum_short_kernel does
// (lane l: 0 + t[l] + t[l + 32], missing rows +0; thread q holds lanes q + 4m;
// the tree's levels 16, 8, 4 in registers, 2 and 1 by shuffles): the same
// partials, written without reading dy and x a second time. With pd, also
// dx's own chunk partials in that order (what a column sum of dx, a bias
// gradient downstream, would compute first: kernels/deferred.h).
constexpr int kChunkThreads = 1024;
constexpr int kChunkRows = static_cast<int>(kNormChunkRows);
constexpr int kChunkRowsPerWarp = kChunkRows / (kChunkThreads / 32);
static_assert(kChunkRows == 64 && kChunkRowsPerWarp == 2, "the partial sums' lane order assumes chunks of 64 rows");

template <class T, int kPer>
__global__ void __launch_bounds__(kChunkThreads)
    norm_backward_chunk_kernel(const T* __restrict__ x, const T* __restrict__ w, const op_math_t<T>* __restrict__ mean,
                               const op_math_t<T>* __restrict__ rstd, const T* __restrict__ dy,
                               const std::uint32_t* __restrict__ dy_mask, const T* __restrict__ dx_pending,
                               T* __restrict__ dx, op_math_t<T>* __restrict__ pw, op_math_t<T>* __restrict__ pb,
                               op_math_t<T>* __restrict__ pd, std::int64_t rows) {
  ::qgrad::cuda::wait_for_prior_kernels();
  using M = op_math_t<T>;
  constexpr int d = 32 * kPer;
  extern __shared__ __align__(16) unsigned char chunk_smem[];
  M* tw = reinterpret_cast<M*>(chunk_smem);  // [kChunkRows][d]
  M* tb = tw + kChunkRows * d;
  M* td = tb + kChunkRows * d;  // only with pd
  const std::int64_t row0 = std::int64_t{blockIdx.x} * kChunkRows;
  const int n = static_cast<int>(rows - row0 < kChunkRows ? rows - row0 : kChunkRows);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  M dyv[kChunkRowsPerWarp][kPer], xv[kChunkRowsPerWarp][kPer];
#pragma unroll
  for (int h = 0; h < kChunkRowsPerWarp; ++h) {
    const int k = warp + 32 * h;
    const std::int64_t base = (row0 + (k < n ? k : 0)) * d;  // past the last row: row0's, not used
#pragma unroll
    for (int t = 0; t < kPer; ++t) {
      dyv[h][t] = formulas::masked_grad(dy, dy_mask, base + lane + 32 * t);
      xv[h][t] = M(x[base + lane + 32 * t]);
    }
  }
#pragma unroll
  for (int h = 0; h < kChunkRowsPerWarp; ++h) {
    const int k = warp + 32 * h;
    if (k >= n) {  // past the last row: the +0 terms column_sum_short_kernel adds
#pragma unroll
      for (int t = 0; t < kPer; ++t) {
        tw[k * d + lane + 32 * t] = tb[k * d + lane + 32 * t] = M(0);
        if (pd != nullptr) td[k * d + lane + 32 * t] = M(0);
      }
      continue;
    }
    const std::int64_t r = row0 + k, base = r * d;
    const M mu = mean != nullptr ? mean[r] : M(0), rs = rstd[r];
    M g[kPer], xh[kPer];
    M s = M(0), sx = M(0);
#pragma unroll
    for (int t = 0; t < kPer; ++t) {
      g[t] = w != nullptr ? dyv[h][t] * M(w[lane + 32 * t]) : dyv[h][t];
      xh[t] = (xv[h][t] - mu) * rs;
      if (mean != nullptr) s += g[t];
      sx += g[t] * xh[t];
    }
    const M mean_g = mean != nullptr ? warp_lane_sum(s) / M(d) : M(0);
    const M mean_gx = warp_lane_sum(sx) / M(d);
#pragma unroll
    for (int t = 0; t < kPer; ++t) {
      const int j = lane + 32 * t;
      const T dxj = formulas::fold_pending(T(rs * ((g[t] - mean_g) - xh[t] * mean_gx)), dx_pending, base + j);
      dx[base + j] = dxj;
      if (pd != nullptr) td[k * d + j] = M(dxj);
      tw[k * d + j] = dyv[h][t] * xh[t];
      tb[k * d + j] = dyv[h][t];
    }
  }
  __syncthreads();
  constexpr int kGroup = 4, kHeld = 32 / kGroup;
  static_assert((d * kGroup) % 32 == 0, "a warp's groups stay within one round");
  const int sums = (pd != nullptr ? 3 : 2) * d;  // columns of tw, tb (and td)
  for (int first = 0; first < sums * kGroup; first += kChunkThreads) {
    // Threads past the last sum (a round of 3d) repeat it without writing:
    // whole warps, so the shuffles below see every lane.
    const int raw = (first + static_cast<int>(threadIdx.x)) / kGroup, q = static_cast<int>(threadIdx.x) % kGroup;
    const int c = raw < sums ? raw : sums - 1;
    const M* t = c < d ? tw + c : c < 2 * d ? tb + (c - d) : td + (c - 2 * d);
    M acc[kHeld];
#pragma unroll
    for (int m = 0; m < kHeld; ++m) {
      const int l = q + kGroup * m;
      acc[m] = M(0) + t[l * d];
      acc[m] += t[(l + 32) * d];
    }
#pragma unroll
    for (int level = 0; level < 3; ++level) {  // lanes + 16, + 8, + 4: held here
      const int h = (kHeld / 2) >> level;
#pragma unroll
      for (int m = 0; m < kHeld / 2; ++m)
        if (m < h) acc[m] += acc[m + h];
    }
    const M from2 = __shfl_down_sync(0xffffffffu, acc[0], 2, kGroup);
    if (q < 2) acc[0] += from2;
    const M from1 = __shfl_down_sync(0xffffffffu, acc[0], 1, kGroup);
    M* out = c < d ? pw : c < 2 * d ? pb : pd;
    if (q == 0 && raw < sums && out != nullptr) out[std::int64_t{blockIdx.x} * d + c % d] = acc[0] + from1;
  }
}

template <class T, int kPer>
void norm_backward_chunk_launch(const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                                const Tensor& dy, const std::uint32_t* dy_mask, const Tensor& dx_pending,
                                const Tensor& dx, const Tensor& pw, const Tensor& pb, const Tensor& pd,
                                std::int64_t rows) {
  using M = op_math_t<T>;
  constexpr int kTermBytes = kChunkRows * 32 * kPer * static_cast<int>(sizeof(M));  // one [chunk rows][d] array
  constexpr auto kernel = norm_backward_chunk_kernel<T, kPer>;
  const int dev = dx.device().index;
  allow_dynamic_smem<kernel>(dev, 3 * kTermBytes);
  const int smem = (pd.defined() ? 3 : 2) * kTermBytes;
  ::qgrad::cuda::launch_kernel(dev, kernel, static_cast<unsigned>((rows + kChunkRows - 1) / kChunkRows),
                               kChunkThreads, smem, static_cast<const T*>(x.data_ptr()),
                               w.defined() ? static_cast<const T*>(w.data_ptr()) : nullptr,
                               mean.defined() ? static_cast<const M*>(mean.data_ptr()) : nullptr,
                               static_cast<const M*>(rstd.data_ptr()), static_cast<const T*>(dy.data_ptr()), dy_mask,
                               dx_pending.defined() ? static_cast<const T*>(dx_pending.data_ptr()) : nullptr,
                               static_cast<T*>(dx.data_ptr()), pw.defined() ? static_cast<M*>(pw.data_ptr()) : nullptr,
                               pb.defined() ? static_cast<M*>(pb.data_ptr()) : nullptr,
                               pd.defined() ? static_cast<M*>(pd.data_ptr()) : nullptr, rows);
}

template <class T>
bool norm_backward_chunks_impl(const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                               const Tensor& dy, const std::uint32_t* dy_mask, const Tensor& dx, const Tensor& pw,
                               const Tensor& pb, const Tensor& pd, std::int64_t d, const Tensor& dx_pending) {
  const std::int64_t rows = x.numel() / d;
  if (rows == 0 || rows / kChunkRows >= 0x7fffffff || (!pw.defined() && !pb.defined())) return false;
  switch (d) {
    case 128:
      norm_backward_chunk_launch<T, 4>(x, w, mean, rstd, dy, dy_mask, dx_pending, dx, pw, pb, pd, rows);
      return true;
    case 256:
      norm_backward_chunk_launch<T, 8>(x, w, mean, rstd, dy, dy_mask, dx_pending, dx, pw, pb, pd, rows);
      return true;
    default: return false;
  }
}

// Held rows (Shape::per > 0) keep their exps in the registers of x.
template <class T, class Shape>
void softmax_launch(const Tensor& x, const Tensor& y, std::int64_t n) {
  using M = op_math_t<T>;
  const T* px = static_cast<const T*>(x.data_ptr());
  T* py = static_cast<T*>(y.data_ptr());
  launch_lane_rows<Shape::per>(y.device().index, y.numel() / n, [=] __device__(std::int64_t r, int lane) {
    LaneRow<T, Shape::per, Shape::full> xr(px + r * n, n, lane);
    M m = M(px[r * n]);
    xr.each([&](int t) { m = formulas::max_nan(m, xr[t]); });
    const M mx = warp_max(m);
    M s = M(0);
    xr.each([&](int t) {
      const M e = formulas::exp_m(xr[t] - mx);
      s += e;
      if constexpr (Shape::per > 0) xr.v[t] = e;
    });
    const M sum = warp_lane_sum(s);
    xr.each([&](int t) {
      const M e = Shape::per > 0 ? xr.v[t] : formulas::exp_m(xr[t] - mx);
      py[r * n + xr.index(t)] = T(e / sum);
    });
  });
}

template <class T, class Shape>
void softmax_backward_launch(const Tensor& y, const Tensor& dy, const Tensor& dx, std::int64_t n) {
  using M = op_math_t<T>;
  const T* py = static_cast<const T*>(y.data_ptr());
  const T* pg = static_cast<const T*>(dy.data_ptr());
  T* pd = static_cast<T*>(dx.data_ptr());
  launch_lane_rows<Shape::per>(dx.device().index, dx.numel() / n, [=] __device__(std::int64_t r, int lane) {
    const std::int64_t base = r * n;
    const LaneRow<T, Shape::per, Shape::full> yr(py + base, n, lane), gr(pg + base, n, lane);
    M s = M(0);
    yr.each([&](int t) { s += gr[t] * yr[t]; });
    const M dot = warp_lane_sum(s);
    yr.each([&](int t) { pd[base + yr.index(t)] = T(yr[t] * (gr[t] - dot)); });
  });
}

}  // namespace

void layer_norm_warp_rows(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y, const Tensor& mean,
                          const Tensor& rstd, std::int64_t d, double eps) {
  dispatch_floating(y.dtype(), "layer_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    with_lane_row<T>(d, [&](auto shape) { layer_norm_launch<T, decltype(shape)>(x, w, b, y, mean, rstd, d, eps); });
  });
}
void rms_norm_warp_rows(const Tensor& x, const Tensor& w, const Tensor& y, const Tensor& rstd, std::int64_t d,
                        double eps) {
  dispatch_floating(y.dtype(), "rms_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    with_lane_row<T>(d, [&](auto shape) { rms_norm_launch<T, decltype(shape)>(x, w, y, rstd, d, eps); });
  });
}
void norm_backward_warp_rows(const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                             const Tensor& dy, const Tensor& dx, std::int64_t d, const std::uint32_t* dy_mask,
                             const Tensor& dx_pending) {
  dispatch_floating(dx.dtype(), "norm_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    with_lane_row<T>(d, [&](auto shape) {
      using Shape = decltype(shape);
      using Walked = LaneRowShape<0, false>;
      norm_backward_launch<T, std::conditional_t<Shape::full, Shape, Walked>>(x, w, mean, rstd, dy, dx, d, dy_mask,
                                                                              dx_pending);
    });
  });
}
bool norm_backward_chunks(const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd, const Tensor& dy,
                          const std::uint32_t* dy_mask, const Tensor& dx, const Tensor& pw, const Tensor& pb,
                          const Tensor& pd, std::int64_t d, const Tensor& dx_pending) {
  switch (x.dtype()) {  // math in f32 (f64's terms would take twice the shared memory)
    case DType::f32:
      return norm_backward_chunks_impl<float>(x, w, mean, rstd, dy, dy_mask, dx, pw, pb, pd, d, dx_pending);
    case DType::bf16:
      return norm_backward_chunks_impl<bfloat16>(x, w, mean, rstd, dy, dy_mask, dx, pw, pb, pd, d, dx_pending);
    case DType::f16:
      return norm_backward_chunks_impl<half>(x, w, mean, rstd, dy, dy_mask, dx, pw, pb, pd, d, dx_pending);
    default: return false;
  }
}
bool layer_norm_fake_quantize_dynamic_rows(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y,
                                           const Tensor& mean, const Tensor& rstd, std::uint32_t* mask,
                                           const NormQuantRows& a) {
  if (x.numel() == 0 || a.d <= 0 || x.numel() % a.d != 0 || x.numel() / a.d > (std::int64_t{1} << 31) / 32)
    return false;
  switch (x.dtype()) {
    case DType::f32: return layer_norm_fake_quantize_impl<float>(x, w, b, y, mean, rstd, mask, a);
    case DType::bf16: return layer_norm_fake_quantize_impl<bfloat16>(x, w, b, y, mean, rstd, mask, a);
    case DType::f16: return layer_norm_fake_quantize_impl<half>(x, w, b, y, mean, rstd, mask, a);
    default: return false;
  }
}

void softmax_warp_rows(const Tensor& x, const Tensor& y, std::int64_t n) {
  dispatch_floating(y.dtype(), "softmax", [&](auto tag) {
    using T = typename decltype(tag)::type;
    with_lane_row<T>(n, [&](auto shape) { softmax_launch<T, decltype(shape)>(x, y, n); });
  });
}
void softmax_backward_warp_rows(const Tensor& y, const Tensor& dy, const Tensor& dx, std::int64_t n) {
  dispatch_floating(dx.dtype(), "softmax_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    with_lane_row<T>(n, [&](auto shape) { softmax_backward_launch<T, decltype(shape)>(y, dy, dx, n); });
  });
}

}  // namespace qgrad::kernels::cuda
