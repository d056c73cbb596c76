// Kernels of dynamic-range quantization (ops/dynamic_quant.h) and of the
// activation quantization of quantized_linear (ops/quantized_linear.h).
#pragma once

#include <cstdint>

#include "qgrad/core/macros.h"
#include "qgrad/core/tensor.h"
#include "qgrad/kernels/layout.h"

namespace qgrad::kernels {

// The quantization segments of a tensor in an [outer, channels, inner]
// layout (kernels/layout.h):
//   group == 0: one segment per channel (reduces over outer and inner); the
//               tensor scope is the layout {1, 1, numel};
//   group > 0:  one segment per (o, c / group, i): `group` consecutive
//               channels of one line; the token scope is the layout of the
//               last axis with group = channels (one segment per row).
QGRAD_HD std::int64_t segment_count(const AxisLayout& l, std::int64_t group) {
  return group == 0 ? l.channels : l.outer * (l.channels / group) * l.inner;
}
QGRAD_HD std::int64_t segment_of(const AxisLayout& l, std::int64_t group, std::int64_t i) {
  const std::int64_t in = i % l.inner;
  const std::int64_t c = (i / l.inner) % l.channels;
  if (group == 0) return c;
  const std::int64_t o = i / (l.inner * l.channels);
  return (o * (l.channels / group) + c / group) * l.inner + in;
}
// Offset of element 0 of segment s (group > 0); its elements are l.inner apart.
QGRAD_HD std::int64_t segment_base(const AxisLayout& l, std::int64_t group, std::int64_t s) {
  const std::int64_t groups = l.channels / group;
  const std::int64_t i = s % l.inner, g = (s / l.inner) % groups, o = s / (l.inner * groups);
  return (o * l.channels + g * group) * l.inner + i;
}

// Quantization range and mode.
struct QuantSpec {
  bool symmetric = true;
  int qmin = -128, qmax = 127;
};

// The kernels, declared once for the dispatcher (kernels::) and each device
// (kernels::cpu::, kernels::cuda::):
//
// dynamic_quantize: q (s8/u8, x's shape), scale (f32, or f64 for an f64 x;
//   [segment_count]) and zero_point (s32 [segment_count]) from x (floating)
//   in `layout` split by `group` (segment_of), one device.
// quantize_rows_dynamic: row-wise dynamic quantization of x viewed as
//   [rows, D] into q (s8/u8) with row stride ldq >= D; columns [D, ldq) of q
//   are written 0. zero_point may be undefined (symmetric only).
// quantize_rows_static: static per-tensor quantization of x [rows, D] into
//   s8 q [rows, ldq]: q = clamp(nearbyint(x * (1/scale)) + zp, qmin, qmax) - zp
//   (pad columns 0). scale (f32, 1 element) and zero_point (s32, 1 element)
//   live on x's device (read by the kernel, never by the host) or on the
//   host (read there).
// column_absmax_update: SmoothQuant calibration, amax[j] = max(amax[j],
//   max_r |x[r, j]|) over the finite values of x viewed [rows, D]; amax f32
//   [D] on x's device.
#define QGRAD_DYNAMIC_QUANT_KERNELS                                                                                   \
  void dynamic_quantize(const Tensor& x, const AxisLayout& layout, std::int64_t group, const QuantSpec& spec,        \
                        const Tensor& q, const Tensor& scale, const Tensor& zero_point);                              \
  void quantize_rows_dynamic(const Tensor& x, std::int64_t D, const QuantSpec& spec, const Tensor& q,                 \
                             std::int64_t ldq, const Tensor& scale, const Tensor& zero_point);                        \
  void quantize_rows_static(const Tensor& x, std::int64_t D, const Tensor& scale, const Tensor& zero_point, int qmin, \
                            int qmax, const Tensor& q, std::int64_t ldq);                                             \
  void column_absmax_update(const Tensor& x, std::int64_t D, const Tensor& amax);

QGRAD_DYNAMIC_QUANT_KERNELS

namespace cpu {
QGRAD_DYNAMIC_QUANT_KERNELS

// body(r) for r in [0, rows), OpenMP-parallel when rows * cost_per_row
// reaches the CPU grain (each row is written by one thread).
template <class F>
void parallel_rows(std::int64_t rows, std::int64_t cost_per_row, F&& body) {
#if defined(_OPENMP) && !defined(__CUDACC__)
  if (rows > 1 && rows * cost_per_row >= 32768) {
#pragma omp parallel for schedule(static)
    for (std::int64_t r = 0; r < rows; ++r) body(r);
    return;
  }
#endif
  (void)cost_per_row;
  for (std::int64_t r = 0; r < rows; ++r) body(r);
}
}  // namespace cpu

namespace cuda {
QGRAD_DYNAMIC_QUANT_KERNELS
}  // namespace cuda

}  // namespace qgrad::kernels
