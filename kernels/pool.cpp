// The 2-d poolings, one source for both devices (kernels/loop.h). Forward:
// one index per output, scanning its window in row-major order. Backward:
// one index per input element, gathering from the outputs whose window holds
// it in increasing (oh, ow) order, in op math; no atomics, so CPU and CUDA
// give the same bits.
#include "qgrad/kernels/pool.h"

#include <limits>

#include "qgrad/kernels/loop.h"
#include "qgrad/kernels/reduce.h"

namespace qgrad::kernels {

namespace {

using formulas::ceil_div_clip0;
using formulas::min_i64;

template <class T>
struct MaxPoolForward {
  const T* x;
  T* y;
  std::int64_t* idx;  // null: values only
  Pool2dGeometry g;
  QGRAD_HD void operator()(std::int64_t o) const {
    using M = op_math_t<T>;
    const std::int64_t per_plane = g.oh * g.ow;
    const std::int64_t plane = o / per_plane, r = o - plane * per_plane;
    const std::int64_t oh = r / g.ow, ow = r - (r / g.ow) * g.ow;
    const formulas::Span hs = formulas::max_pool_span(oh, g.ih, g.kh, g.sh, g.ph, g.dh);
    const formulas::Span ws = formulas::max_pool_span(ow, g.iw, g.kw, g.sw, g.pw, g.dw);
    const T* p = x + plane * g.ih * g.iw;
    M best = -std::numeric_limits<M>::infinity();
    std::int64_t arg = hs.lo * g.iw + ws.lo;
    for (std::int64_t h = hs.lo; h < hs.hi; h += g.dh)
      for (std::int64_t w = ws.lo; w < ws.hi; w += g.dw) {
        const M v = M(p[h * g.iw + w]);
        if (v > best || v != v) {
          best = v;
          arg = h * g.iw + w;
        }
      }
    y[o] = T(best);
    if (idx) idx[o] = arg;
  }
};

// The outputs along one axis whose window may hold input row `i`: those
// starting at most (k - 1) * d rows above it, [lo, hi] clipped to [0, out).
struct OutRange {
  std::int64_t lo, hi;  // inclusive; empty when lo > hi
};
QGRAD_HD OutRange out_range(std::int64_t i, std::int64_t out, std::int64_t span, std::int64_t s, std::int64_t p) {
  return {ceil_div_clip0(i + p - span + 1, s), min_i64((i + p) / s, out - 1)};
}

template <class T>
struct MaxPoolBackward {
  const T* dy;
  const std::int64_t* idx;
  T* dx;
  Pool2dGeometry g;
  QGRAD_HD void operator()(std::int64_t i) const {
    using M = op_math_t<T>;
    const std::int64_t per_plane = g.ih * g.iw;
    const std::int64_t plane = i / per_plane, r = i - plane * per_plane;
    const std::int64_t h = r / g.iw, w = r - (r / g.iw) * g.iw;
    const OutRange hr = out_range(h, g.oh, (g.kh - 1) * g.dh + 1, g.sh, g.ph);
    const OutRange wr = out_range(w, g.ow, (g.kw - 1) * g.dw + 1, g.sw, g.pw);
    const std::int64_t base = plane * g.oh * g.ow;
    M acc = M(0);
    for (std::int64_t oh = hr.lo; oh <= hr.hi; ++oh)
      for (std::int64_t ow = wr.lo; ow <= wr.hi; ++ow) {
        const std::int64_t o = base + oh * g.ow + ow;
        if (idx[o] == r) acc += M(dy[o]);
      }
    dx[i] = T(acc);
  }
};

template <class T>
struct AvgPoolForward {
  const T* x;
  T* y;
  Pool2dGeometry g;
  bool count_include_pad;
  QGRAD_HD void operator()(std::int64_t o) const {
    using M = op_math_t<T>;
    const std::int64_t per_plane = g.oh * g.ow;
    const std::int64_t plane = o / per_plane, r = o - plane * per_plane;
    const formulas::AvgWindow win = formulas::avg_pool_window(g, r / g.ow, r - (r / g.ow) * g.ow, count_include_pad);
    if (win.divisor == 0) {
      y[o] = T(M(0));
      return;
    }
    const T* p = x + plane * g.ih * g.iw;
    M acc = M(0);
    for (std::int64_t h = win.h0; h < win.h1; ++h)
      for (std::int64_t w = win.w0; w < win.w1; ++w) acc += M(p[h * g.iw + w]);
    y[o] = T(acc / M(win.divisor));
  }
};

template <class T>
struct AvgPoolBackward {
  const T* dy;
  T* dx;
  Pool2dGeometry g;
  bool count_include_pad;
  QGRAD_HD void operator()(std::int64_t i) const {
    using M = op_math_t<T>;
    const std::int64_t per_plane = g.ih * g.iw;
    const std::int64_t plane = i / per_plane, r = i - plane * per_plane;
    const std::int64_t h = r / g.iw, w = r - (r / g.iw) * g.iw;
    const OutRange hr = out_range(h, g.oh, g.kh, g.sh, g.ph);
    const OutRange wr = out_range(w, g.ow, g.kw, g.sw, g.pw);
    const std::int64_t base = plane * g.oh * g.ow;
    M acc = M(0);
    for (std::int64_t oh = hr.lo; oh <= hr.hi; ++oh)
      for (std::int64_t ow = wr.lo; ow <= wr.hi; ++ow) {
        const formulas::AvgWindow win = formulas::avg_pool_window(g, oh, ow, count_include_pad);
        if (h < win.h0 || h >= win.h1 || w < win.w0 || w >= win.w1) continue;
        acc += M(dy[base + oh * g.ow + ow]) / M(win.divisor);
      }
    dx[i] = T(acc);
  }
};

template <class T>
struct AdaptiveAvgForward {
  const T* x;
  T* y;
  Pool2dGeometry g;
  QGRAD_HD void operator()(std::int64_t o) const {
    using M = op_math_t<T>;
    const std::int64_t per_plane = g.oh * g.ow;
    const std::int64_t plane = o / per_plane, r = o - plane * per_plane;
    const std::int64_t oh = r / g.ow, ow = r - (r / g.ow) * g.ow;
    const std::int64_t h0 = formulas::adaptive_start(oh, g.ih, g.oh), h1 = formulas::adaptive_end(oh, g.ih, g.oh);
    const std::int64_t w0 = formulas::adaptive_start(ow, g.iw, g.ow), w1 = formulas::adaptive_end(ow, g.iw, g.ow);
    const T* p = x + plane * g.ih * g.iw;
    M acc = M(0);
    for (std::int64_t h = h0; h < h1; ++h)
      for (std::int64_t w = w0; w < w1; ++w) acc += M(p[h * g.iw + w]);
    y[o] = T(acc / M((h1 - h0) * (w1 - w0)));
  }
};

// Output o holds input row i exactly when
// floor(i * out / in) <= o < ceil((i + 1) * out / in).
template <class T>
struct AdaptiveAvgBackward {
  const T* dy;
  T* dx;
  Pool2dGeometry g;
  QGRAD_HD void operator()(std::int64_t i) const {
    using M = op_math_t<T>;
    const std::int64_t per_plane = g.ih * g.iw;
    const std::int64_t plane = i / per_plane, r = i - plane * per_plane;
    const std::int64_t h = r / g.iw, w = r - (r / g.iw) * g.iw;
    const std::int64_t oh0 = formulas::adaptive_start(h, g.oh, g.ih), oh1 = formulas::adaptive_end(h, g.oh, g.ih);
    const std::int64_t ow0 = formulas::adaptive_start(w, g.ow, g.iw), ow1 = formulas::adaptive_end(w, g.ow, g.iw);
    const std::int64_t base = plane * g.oh * g.ow;
    M acc = M(0);
    for (std::int64_t oh = oh0; oh < oh1; ++oh) {
      const std::int64_t kh = formulas::adaptive_end(oh, g.ih, g.oh) - formulas::adaptive_start(oh, g.ih, g.oh);
      for (std::int64_t ow = ow0; ow < ow1; ++ow) {
        const std::int64_t kw = formulas::adaptive_end(ow, g.iw, g.ow) - formulas::adaptive_start(ow, g.iw, g.ow);
        acc += M(dy[base + oh * g.ow + ow]) / M(kh * kw);
      }
    }
    dx[i] = T(acc);
  }
};

}  // namespace

void max_pool2d(const Tensor& x, const Tensor& y, const Tensor& indices, const Pool2dGeometry& g) {
  dispatch_floating(y.dtype(), "max_pool2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    std::int64_t* idx = indices.defined() ? static_cast<std::int64_t*>(indices.data_ptr()) : nullptr;
    for_each_index(y.device(), y.numel(),
                   MaxPoolForward<T>{static_cast<const T*>(x.data_ptr()), static_cast<T*>(y.data_ptr()), idx, g},
                   "max_pool2d");
  });
}

void max_pool2d_backward(const Tensor& dy, const Tensor& indices, const Tensor& dx, const Pool2dGeometry& g) {
  dispatch_floating(dx.dtype(), "max_pool2d_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    for_each_index(dx.device(), dx.numel(),
                   MaxPoolBackward<T>{static_cast<const T*>(dy.data_ptr()),
                                      static_cast<const std::int64_t*>(indices.data_ptr()),
                                      static_cast<T*>(dx.data_ptr()), g},
                   "max_pool2d_backward");
  });
}

void avg_pool2d(const Tensor& x, const Tensor& y, const Pool2dGeometry& g, bool count_include_pad) {
  dispatch_floating(y.dtype(), "avg_pool2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    for_each_index(
        y.device(), y.numel(),
        AvgPoolForward<T>{static_cast<const T*>(x.data_ptr()), static_cast<T*>(y.data_ptr()), g, count_include_pad},
        "avg_pool2d");
  });
}

void avg_pool2d_backward(const Tensor& dy, const Tensor& dx, const Pool2dGeometry& g, bool count_include_pad) {
  dispatch_floating(dx.dtype(), "avg_pool2d_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    for_each_index(dx.device(), dx.numel(),
                   AvgPoolBackward<T>{static_cast<const T*>(dy.data_ptr()), static_cast<T*>(dx.data_ptr()), g,
                                      count_include_pad},
                   "avg_pool2d_backward");
  });
}

void adaptive_avg_pool2d(const Tensor& x, const Tensor& y, const Pool2dGeometry& g) {
  if (g.oh == 1 && g.ow == 1) {
    // Global pooling: the mean of each plane, a row reduction (on CUDA a
    // block per plane once planes are long; kernels/cuda/reduce.cu). Same
    // formula as the loop below (sum in order, one division) on the CPU.
    sum_axis(x, y, AxisLayout{g.planes, g.ih * g.iw, 1}, true);
    return;
  }
  dispatch_floating(y.dtype(), "adaptive_avg_pool2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    for_each_index(y.device(), y.numel(),
                   AdaptiveAvgForward<T>{static_cast<const T*>(x.data_ptr()), static_cast<T*>(y.data_ptr()), g},
                   "adaptive_avg_pool2d");
  });
}

void adaptive_avg_pool2d_backward(const Tensor& dy, const Tensor& dx, const Pool2dGeometry& g) {
  dispatch_floating(dx.dtype(), "adaptive_avg_pool2d_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    for_each_index(dx.device(), dx.numel(),
                   AdaptiveAvgBackward<T>{static_cast<const T*>(dy.data_ptr()), static_cast<T*>(dx.data_ptr()), g},
                   "adaptive_avg_pool2d_backward");
  });
}

}  // namespace qgrad::kernels
