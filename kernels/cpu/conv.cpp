// The CPU convolution: im2col + the Eigen GEMM (kernels/cpu/linalg.cpp,
// gemm_raw), in op_math_t (16-bit operands widened to f32 once, results
// rounded once).
//
// Per image n and group g, with K = (c / groups) · kh · kw rows of the im2col
// matrix col [K, oh · ow] (zero where the window reads padding):
//   forward          y[n, g]  = W_g [o/g, K] · col
//   input gradient   dcol     = W_gᵀ · dy[n, g], scattered back (col2im)
//   weight gradient  dW_gᵀ   += col · dy[n, g]ᵀ  (n = 0, 1, ... in order)
// A 1x1, stride 1, unpadded convolution uses the input itself as col.
//
// Threads: the forward and the input gradient run one task per (n, g), each
// writing its own slice; the weight gradient one task per (g, block of
// kRowBlock rows of K), each summing over the batch in order. Every element
// is computed by one task in a fixed order and the GEMM's blocks do not
// depend on the thread count, so the results do not either.
#include "qgrad/kernels/cpu/conv.h"

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "qgrad/kernels/cpu/gemm.h"
#include "qgrad/kernels/cpu/parallel.h"
#include "qgrad/kernels/dispatch.h"

namespace qgrad::kernels::cpu {

namespace {

constexpr std::int64_t kRowBlock = 64;                      // rows of K per weight-gradient task
constexpr std::int64_t kParallelMacs = std::int64_t{1} << 22;  // below this, one thread

// The operand in op math: the tensor's own data, or a widened copy.
template <class T, class M = op_math_t<T>>
const M* math_in(const Tensor& t, std::vector<M>& buf) {
  if constexpr (std::is_same_v<T, M>) {
    (void)buf;
    return static_cast<const M*>(t.data_ptr());
  } else {
    const T* p = static_cast<const T*>(t.data_ptr());
    buf.resize(static_cast<std::size_t>(t.numel()));
    parallel_for(t.numel(), [&](std::int64_t i) { buf[static_cast<std::size_t>(i)] = M(p[i]); });
    return buf.data();
  }
}
// Where a result in op math goes: the tensor itself, or a buffer (holding
// the tensor's values when they are accumulated onto) that math_out_finish
// rounds into it.
template <class T, class M = op_math_t<T>>
M* math_out(const Tensor& t, std::vector<M>& buf, bool accumulate = false) {
  if constexpr (std::is_same_v<T, M>) {
    (void)buf;
    (void)accumulate;
    return static_cast<M*>(t.data_ptr());
  } else {
    if (accumulate) {
      math_in<T>(t, buf);
      return buf.data();
    }
    buf.assign(static_cast<std::size_t>(t.numel()), M(0));
    return buf.data();
  }
}
template <class T, class M = op_math_t<T>>
void math_out_finish(const Tensor& t, const std::vector<M>& buf) {
  if constexpr (!std::is_same_v<T, M>) {
    T* p = static_cast<T*>(t.data_ptr());
    parallel_for(t.numel(), [&](std::int64_t i) { p[i] = T(buf[static_cast<std::size_t>(i)]); });
  } else {
    (void)t;
    (void)buf;
  }
}

// Calls body(task, scratch) for task in [0, tasks), each thread with its own
// `scratch_len` elements of scratch; in parallel when there are several
// tasks and at least kParallelMacs multiply-adds in all.
template <class M, class F>
void run_tasks(std::int64_t tasks, std::int64_t macs, std::int64_t scratch_len, F&& body) {
  int threads = 1;
#if defined(_OPENMP)
  const bool parallel = tasks > 1 && macs >= kParallelMacs;
  if (parallel) threads = std::max(1, std::min<int>(omp_get_max_threads(), static_cast<int>(tasks)));
#endif
  std::vector<M> scratch(static_cast<std::size_t>(threads * scratch_len));
#if defined(_OPENMP)
  if (threads > 1) {
#pragma omp parallel for schedule(static) num_threads(threads)
    for (std::int64_t t = 0; t < tasks; ++t)
      body(t, scratch.data() + static_cast<std::size_t>(omp_get_thread_num()) * static_cast<std::size_t>(scratch_len));
    return;
  }
#endif
  for (std::int64_t t = 0; t < tasks; ++t) body(t, scratch.data());
}

// Rows [r0, r1) of the im2col matrix of one image's group: x is that
// group's [c/g, h, w] input, col [r1 - r0, oh · ow].
template <class M>
void im2col_rows(const Conv2dShape& s, const M* x, std::int64_t r0, std::int64_t r1, M* col) {
  const std::int64_t P = s.oh * s.ow;
  for (std::int64_t r = r0; r < r1; ++r) {
    const std::int64_t j = r % s.kw, i = (r / s.kw) % s.kh, c = r / (s.kw * s.kh);
    const M* xc = x + c * s.h * s.w;
    M* row = col + (r - r0) * P;
    for (std::int64_t a = 0; a < s.oh; ++a) {
      M* out = row + a * s.ow;
      const std::int64_t ih = a * s.sh - s.ph + i * s.dh;
      if (ih < 0 || ih >= s.h) {
        std::fill(out, out + s.ow, M(0));
        continue;
      }
      const M* xr = xc + ih * s.w;
      for (std::int64_t b = 0; b < s.ow; ++b) {
        const std::int64_t iw = b * s.sw - s.pw + j * s.dw;
        out[b] = iw >= 0 && iw < s.w ? xr[iw] : M(0);
      }
    }
  }
}

// dx += col2im(dcol): dx is one image's group [c/g, h, w], dcol [K, oh · ow];
// rows in order, so overlapping windows add in a fixed order.
template <class M>
void col2im_add(const Conv2dShape& s, const M* dcol, M* dx) {
  const std::int64_t P = s.oh * s.ow, K = s.patch();
  for (std::int64_t r = 0; r < K; ++r) {
    const std::int64_t j = r % s.kw, i = (r / s.kw) % s.kh, c = r / (s.kw * s.kh);
    M* xc = dx + c * s.h * s.w;
    const M* row = dcol + r * P;
    for (std::int64_t a = 0; a < s.oh; ++a) {
      const std::int64_t ih = a * s.sh - s.ph + i * s.dh;
      if (ih < 0 || ih >= s.h) continue;
      M* xr = xc + ih * s.w;
      const M* in = row + a * s.ow;
      for (std::int64_t b = 0; b < s.ow; ++b) {
        const std::int64_t iw = b * s.sw - s.pw + j * s.dw;
        if (iw >= 0 && iw < s.w) xr[iw] += in[b];
      }
    }
  }
}

template <class T>
void forward_impl(const Conv2dShape& s, const Tensor& x, const Tensor& weight, const Tensor& y, bool accumulate) {
  using M = op_math_t<T>;
  std::vector<M> bx, bw, by;
  const M* xp = math_in<T>(x, bx);
  const M* wp = math_in<T>(weight, bw);
  M* yp = math_out<T>(y, by, accumulate);
  const std::int64_t G = s.groups, Cg = s.c_per_group(), Og = s.o_per_group(), K = s.patch(), P = s.oh * s.ow;
  const bool pointwise = s.pointwise();
  run_tasks<M>(s.n * G, s.n * s.o * P * K, pointwise ? 0 : K * P, [&](std::int64_t task, M* col) {
    const std::int64_t n = task / G, g = task % G;
    const M* xg = xp + (n * s.c + g * Cg) * s.h * s.w;
    const M* src = xg;  // pointwise: the input's [c/g, h · w] is col
    if (!pointwise) {
      im2col_rows(s, xg, 0, K, col);
      src = col;
    }
    gemm_raw(GemmShape{1, Og, P, K, false, false}, wp + g * Og * K, src, yp + (n * s.o + g * Og) * P, accumulate);
  });
  math_out_finish<T>(y, by);
}

template <class T>
void backward_input_impl(const Conv2dShape& s, const Tensor& dy, const Tensor& weight, const Tensor& dx) {
  using M = op_math_t<T>;
  std::vector<M> bdy, bw, bdx;
  const M* dyp = math_in<T>(dy, bdy);
  const M* wp = math_in<T>(weight, bw);
  M* dxp = math_out<T>(dx, bdx);
  const std::int64_t G = s.groups, Cg = s.c_per_group(), Og = s.o_per_group(), K = s.patch(), P = s.oh * s.ow;
  const bool pointwise = s.pointwise();
  run_tasks<M>(s.n * G, s.n * s.o * P * K, pointwise ? 0 : K * P, [&](std::int64_t task, M* dcol) {
    const std::int64_t n = task / G, g = task % G;
    M* dxg = dxp + (n * s.c + g * Cg) * s.h * s.w;
    const GemmShape shape{1, K, P, Og, true, false};  // W_gᵀ [K, o/g] · dy [o/g, P]
    const M* dyg = dyp + (n * s.o + g * Og) * P;
    if (pointwise) {
      gemm_raw(shape, wp + g * Og * K, dyg, dxg, false);  // dx[n, g] is dcol
      return;
    }
    gemm_raw(shape, wp + g * Og * K, dyg, dcol, false);
    std::fill(dxg, dxg + Cg * s.h * s.w, M(0));
    col2im_add(s, dcol, dxg);
  });
  math_out_finish<T>(dx, bdx);
}

template <class T>
void backward_weight_impl(const Conv2dShape& s, const Tensor& x, const Tensor& dy, const Tensor& dweight) {
  using M = op_math_t<T>;
  std::vector<M> bx, bdy;
  const M* xp = math_in<T>(x, bx);
  const M* dyp = math_in<T>(dy, bdy);
  const std::int64_t G = s.groups, Cg = s.c_per_group(), Og = s.o_per_group(), K = s.patch(), P = s.oh * s.ow;
  const bool pointwise = s.pointwise();
  const std::int64_t blocks = (K + kRowBlock - 1) / kRowBlock;
  // dWᵀ per group, [K, o/g]: each task owns rows [r0, r1) of one group.
  std::vector<M> dwt(static_cast<std::size_t>(G * K * Og), M(0));
  run_tasks<M>(G * blocks, s.n * s.o * P * K, pointwise ? 0 : kRowBlock * P, [&](std::int64_t task, M* col) {
    const std::int64_t g = task / blocks, r0 = (task % blocks) * kRowBlock, r1 = std::min(K, r0 + kRowBlock);
    M* out = dwt.data() + (g * K + r0) * Og;
    for (std::int64_t n = 0; n < s.n; ++n) {
      const M* xg = xp + (n * s.c + g * Cg) * s.h * s.w;
      const M* rows = xg + r0 * P;  // pointwise: the input's channels r0.. are the rows
      if (!pointwise) {
        im2col_rows(s, xg, r0, r1, col);
        rows = col;
      }
      // dWᵀ[r0:r1, :] += col[r0:r1, P] · dy[n, g]ᵀ  (dy[n, g] is [o/g, P])
      gemm_raw(GemmShape{1, r1 - r0, Og, P, false, true}, rows, dyp + (n * s.o + g * Og) * P, out, true);
    }
  });
  T* dw = static_cast<T*>(dweight.data_ptr());
  parallel_for(s.o * K, [&](std::int64_t i) {
    const std::int64_t o = i / K, r = i % K, g = o / Og, ol = o % Og;
    dw[i] = T(dwt[static_cast<std::size_t>((g * K + r) * Og + ol)]);
  });
}

}  // namespace

void conv2d_forward(const Conv2dShape& s, const Tensor& x, const Tensor& weight, const Tensor& y, bool accumulate) {
  dispatch_floating(y.dtype(), "conv2d",
                    [&](auto tag) { forward_impl<typename decltype(tag)::type>(s, x, weight, y, accumulate); });
}

void conv2d_backward_input(const Conv2dShape& s, const Tensor& dy, const Tensor& weight, const Tensor& dx) {
  dispatch_floating(dx.dtype(), "conv2d",
                    [&](auto tag) { backward_input_impl<typename decltype(tag)::type>(s, dy, weight, dx); });
}

void conv2d_backward_weight(const Conv2dShape& s, const Tensor& x, const Tensor& dy, const Tensor& dweight) {
  dispatch_floating(dweight.dtype(), "conv2d",
                    [&](auto tag) { backward_weight_impl<typename decltype(tag)::type>(s, x, dy, dweight); });
}

}  // namespace qgrad::kernels::cpu
