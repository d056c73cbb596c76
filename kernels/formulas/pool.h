// Window geometry of the 2-d poolings (PyTorch's index formulas), shared by
// the forward and backward loop bodies of kernels/pool.cpp on both devices.
#pragma once

#include <cstdint>
#include <limits>

#include "qgrad/core/half.h"
#include "qgrad/kernels/formulas/dynamic_quant.h"

namespace qgrad::formulas {

// One pooling over planes of [planes, ih, iw] into [planes, oh, ow].
struct Pool2dGeometry {
  std::int64_t planes = 0, ih = 0, iw = 0, oh = 0, ow = 0;
  std::int64_t kh = 1, kw = 1, sh = 1, sw = 1, ph = 0, pw = 0, dh = 1, dw = 1;
};

QGRAD_HD std::int64_t min_i64(std::int64_t a, std::int64_t b) { return a < b ? a : b; }
QGRAD_HD std::int64_t max_i64(std::int64_t a, std::int64_t b) { return a < b ? b : a; }

// Rows [lo, hi) along one axis of the input that window `o` covers, before
// clipping: the window starts at o * stride - pad.
struct Span {
  std::int64_t lo, hi;
};

// max_pool2d along one axis (PyTorch's cpu_max_pool): the dilated window
// clipped to the input, its first row moved up by whole dilation steps.
QGRAD_HD Span max_pool_span(std::int64_t o, std::int64_t in, std::int64_t k, std::int64_t s, std::int64_t p,
                                   std::int64_t d) {
  std::int64_t lo = o * s - p;
  const std::int64_t hi = min_i64(lo + (k - 1) * d + 1, in);
  while (lo < 0) lo += d;
  return {lo, hi};
}

// avg_pool2d's window of output (oh, ow) clipped to the input, and its
// divisor (PyTorch's cpu_avg_pool): with count_include_pad the window
// clipped only to the padded input (so a ceil_mode window hanging past the
// padding counts only the part inside it), else the elements inside the
// input. An empty window has divisor 0 (its output is 0).
struct AvgWindow {
  std::int64_t h0, h1, w0, w1, divisor;
};
QGRAD_HD AvgWindow avg_pool_window(const Pool2dGeometry& g, std::int64_t oh, std::int64_t ow,
                                          bool count_include_pad) {
  std::int64_t h0 = oh * g.sh - g.ph, w0 = ow * g.sw - g.pw;
  std::int64_t h1 = min_i64(h0 + g.kh, g.ih + g.ph), w1 = min_i64(w0 + g.kw, g.iw + g.pw);
  const std::int64_t padded = (h1 - h0) * (w1 - w0);
  h0 = max_i64(h0, 0);
  w0 = max_i64(w0, 0);
  h1 = min_i64(h1, g.ih);
  w1 = min_i64(w1, g.iw);
  if (h0 >= h1 || w0 >= w1) return {h0, h0, w0, w0, 0};
  return {h0, h1, w0, w1, count_include_pad ? padded : (h1 - h0) * (w1 - w0)};
}

// adaptive_avg_pool2d along one axis: output o of `out` covers input rows
// [floor(o * in / out), ceil((o + 1) * in / out)).
QGRAD_HD std::int64_t adaptive_start(std::int64_t o, std::int64_t in, std::int64_t out) { return (o * in) / out; }
QGRAD_HD std::int64_t adaptive_end(std::int64_t o, std::int64_t in, std::int64_t out) {
  return ((o + 1) * in + out - 1) / out;
}

// ---- integer (s8 / u8) pooling: PyTorch's quantized CPU kernels ----
// An s8 / u8 tensor holds the quantized values of a tensor whose zero point
// is 0 (symmetric qint8, or quint8 after a ReLU); the output keeps the
// input's scale and zero point, so the scale cancels.

// The smallest value of M (-inf for floating types, NaN aside).
template <class M>
QGRAD_HD M pool_lowest() {
  if constexpr (std::numeric_limits<M>::has_infinity) return -std::numeric_limits<M>::infinity();
  else return std::numeric_limits<M>::lowest();
}
template <class M>
QGRAD_HD bool pool_is_nan(M v) {
  if constexpr (std::numeric_limits<M>::has_quiet_NaN) return v != v;
  else return false;
}

template <class Q>
QGRAD_HD Q saturate_int(float r) {
  constexpr float lo = static_cast<float>(std::numeric_limits<Q>::lowest());
  constexpr float hi = static_cast<float>(std::numeric_limits<Q>::max());
  return static_cast<Q>(r < lo ? lo : (r > hi ? hi : r));
}

// avg_pool2d (aten/src/ATen/native/quantized/cpu/AveragePool2d.cpp,
// avg_pool2d_out_frame): the multiplier float(1.0 / divisor) rounded from
// double, the int sum converted to float, one float product, rounded half to
// even, clamped to Q.
template <class Q>
QGRAD_HD Q quantized_avg(std::int64_t sum, std::int64_t divisor) {
  const float multiplier = static_cast<float>(1.0 / static_cast<double>(divisor));
  return saturate_int<Q>(round_even(static_cast<float>(sum) * multiplier));
}

// adaptive_avg_pool2d (AdaptiveAveragePooling.cpp,
// adaptive_avg_pool_single_out_frame): the multiplier (1.0f / kh) / kw in
// float, then as above.
template <class Q>
QGRAD_HD Q quantized_adaptive_avg(std::int64_t sum, std::int64_t kh, std::int64_t kw) {
  const float multiplier = (1.0f / static_cast<float>(kh)) / static_cast<float>(kw);
  return saturate_int<Q>(round_even(static_cast<float>(sum) * multiplier));
}

}  // namespace qgrad::formulas
