// Scalar formulas of dynamic-range quantization, shared by the CPU and CUDA
// kernels (and by the activation quantization of quantized_linear), so both
// devices produce the same bits.
//
// Quantization math type M: float for f32, f16 and bf16 inputs (16-bit
// values are widened to float first, as PyTorch does), double for f64 inputs
// (scale, 1/scale and x * (1/scale) are all computed in double and the scale
// is stored as f64: nothing of an f64 input passes through float).
//
//   q = clamp(nearbyint(x * (1/scale)) + zp, qmin, qmax)     (PyTorch CPU quantize)
//
// Non-finite inputs, deterministically on both devices: the range reduction
// ignores them (min/max over finite values only, so one inf or NaN does not
// destroy the scale of its segment); quantizing maps +inf -> qmax,
// -inf -> qmin and NaN -> qmin (PyTorch's fake-quantize convention).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "qgrad/core/half.h"

namespace qgrad::formulas {

template <class T> using quant_math_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

// Round to nearest, ties to even (the default rounding mode on the host).
QGRAD_HD float round_even(float v) {
#if QGRAD_DEVICE_CODE && defined(__CUDA_ARCH__)
  return nearbyintf(v);
#else
  return std::nearbyint(v);
#endif
}
QGRAD_HD double round_even(double v) {
#if QGRAD_DEVICE_CODE && defined(__CUDA_ARCH__)
  return nearbyint(v);
#else
  return std::nearbyint(v);
#endif
}

template <class M>
QGRAD_HD bool is_finite_value(M v) {
  // false for NaN (every comparison is) and +-inf; fabs is exact everywhere
  // (one compare with an absolute-value operand on the GPU)
#if QGRAD_DEVICE_CODE && defined(__CUDA_ARCH__)
  return fabs(v) < std::numeric_limits<M>::infinity();
#else
  return std::fabs(v) < std::numeric_limits<M>::infinity();
#endif
}

// Running min/max of a segment over its finite values. Starts empty
// (lo = +inf, hi = -inf); min and max are exact and order-independent, so
// any reduction order (threads, blocks, atomics) gives the same result.
template <class M>
struct Range {
  M lo, hi;
  QGRAD_HD static Range empty() { return {std::numeric_limits<M>::infinity(), -std::numeric_limits<M>::infinity()}; }
  QGRAD_HD void add(M v) {
    const bool finite = is_finite_value(v);  // selects, not a branch
    lo = finite && v < lo ? v : lo;
    hi = finite && v > hi ? v : hi;
  }
  QGRAD_HD void merge(const Range& o) {
    lo = o.lo < lo ? o.lo : lo;
    hi = o.hi > hi ? o.hi : hi;
  }
};

// The quantization parameters of one segment.
template <class M>
struct QParams {
  M scale;
  std::int32_t zero_point;
};

// Symmetric: zp = 0 for a signed range (qmin < 0), the mid point
// (qmin + qmax + 1) / 2 for an unsigned one (128 for u8); scale =
// max|x| / (qmax - zp). Asymmetric: the range is widened to include 0
// (min(lo, 0), max(hi, 0), as PyTorch's calculate_qparams) and
// scale = (max - min) / (qmax - qmin), zp = clamp(qmin - nearbyint(min / scale), qmin, qmax).
// An all-zero (or empty, or all non-finite) segment gets scale 1; a nonzero
// scale is floored at the smallest normal number of M so 1/scale is finite.
template <class M>
QGRAD_HD QParams<M> qparams_from_range(Range<M> r, bool symmetric, int qmin, int qmax) {
  M lo = r.lo <= M(0) ? r.lo : M(0);
  M hi = r.hi >= M(0) ? r.hi : M(0);
  if (!(lo <= hi)) lo = hi = M(0);  // empty segment
  QParams<M> p;
  if (symmetric) {
    const int zp = qmin < 0 ? 0 : (qmin + qmax + 1) / 2;
    const M amax = -lo > hi ? -lo : hi;
    p.zero_point = zp;
    p.scale = amax / M(qmax - zp);
  } else {
    p.scale = (hi - lo) / M(qmax - qmin);
    p.zero_point = 0;
  }
  if (p.scale == M(0)) {
    p.scale = M(1);
  } else if (p.scale < std::numeric_limits<M>::min()) {
    p.scale = std::numeric_limits<M>::min();
  }
  if (!symmetric) {
    M z = M(qmin) - round_even(lo / p.scale);
    z = z < M(qmin) ? M(qmin) : (z > M(qmax) ? M(qmax) : z);
    p.zero_point = static_cast<std::int32_t>(z);
  }
  return p;
}

// 1/scale in M (the kernels multiply, never divide, as PyTorch's CPU path).
template <class M>
QGRAD_HD M inverse_scale(M scale) {
  return M(1) / scale;
}

// q = clamp(nearbyint(x * inv_scale) + zp, qmin, qmax); NaN -> qmin,
// +inf -> qmax, -inf -> qmin (the comparisons below are false for NaN).
template <class M>
QGRAD_HD int quantize_value(M x, M inv_scale, int zero_point, int qmin, int qmax) {
  const M r = round_even(x * inv_scale) + M(zero_point);
  // Selects, not branches (the row kernels quantize 64 values a thread);
  // below the range, or NaN: qmin.
  const M clamped = r >= M(qmax) ? M(qmax) : (r >= M(qmin) ? r : M(qmin));
  return static_cast<int>(clamped);
}

// quantize_value for float math and an 8-bit code, without a float-to-int
// conversion (the row kernels' form: on Hopper a conversion issues at a
// quarter of the arithmetic rate, and quantize_value takes two, FRND and
// F2I). Returns a word whose low byte is q - zero_point (two's complement);
// the caller adds zero_point where it is not 0. lo = qmin - zero_point,
// hi = qmax - zero_point.
//   p = x * inv_scale                  (the same product, rounded once)
//   c = min(max(p, lo), hi)            (max returns lo for NaN: NaN -> qmin)
//   c + 1.5 * 2^23                     (|c| <= 2^9, so the sum lies in
//                                       [2^23, 2^24), whose spacing is 1: the
//                                       add rounds c to nearest even, as
//                                       nearbyint, and leaves the integer n
//                                       in the low bits, 0x4B400000 + n)
// Clamping to the integers lo, hi before rounding equals rounding first,
// so q = clamp(nearbyint(p) + zp, qmin, qmax) as quantize_value, for every
// x (tests/test_dynamic_quant.cpp compares the two).
QGRAD_HD std::uint32_t quantize_byte(float x, float inv_scale, float lo, float hi) {
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23 (even, so ties stay to even)
  const float p = x * inv_scale;
#if QGRAD_DEVICE_CODE && defined(__CUDA_ARCH__)
  const float c = fminf(fmaxf(p, lo), hi);
#else
  const float c = std::fmin(std::fmax(p, lo), hi);
#endif
  return float_to_bits(c + kRound);
}

// Running abs-max over finite values (SmoothQuant calibration).
template <class M>
QGRAD_HD M absmax_update(M running, M v) {
  if (!is_finite_value(v)) return running;
  const M a = v < M(0) ? -v : v;
  return a > running ? a : running;
}

}  // namespace qgrad::formulas
