// Scalar formulas of the quantization ops, shared by the CPU and CUDA
// kernels (the build forbids FMA contraction on both sides, so every
// product and sum here rounds once, identically on both devices).
//
// Conventions, following PyTorch 2.11's CPU kernels:
// - inv_scale = 1.0f / scale in float; the forward multiplies by it.
// - x * inv_scale in op math (float for f32/f16/bf16, double for f64),
//   rounded half to even (nearbyint), then the zero point is added: the
//   integer q = nearbyint(x * inv_scale) + zp, computed exactly (the
//   rounded value is clamped to +-2^32 first, so +-inf and huge values map
//   to far out-of-range integers without undefined behaviour).
// - fake quant: y = (clamp(q, qmin, qmax) - zp) * scale (the product as
//   PyTorch takes it, see dequant_value); in-range mask qmin <= q <= qmax.
//   q is exact; PyTorch forms zp + nearbyint(v) in op math, which is the same
//   integer while |q| <= 2^24 (so bit-exactness with PyTorch holds for every
//   range within +-2^24).
// - NaN input: y = NaN and mask 0 (PyTorch maps NaN to qmin); quantize to an
//   integer maps NaN to qmin with mask 0.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "qgrad/core/half.h"
#include "qgrad/kernels/formulas/activation.h"
#include "qgrad/kernels/layout.h"

namespace qgrad::formulas {

// ---- rounding and exact integer conversion ----
// Round half to even. On the host, instead of std::nearbyint (a libm call
// that saves and restores the floating-point environment, without SSE4.1
// the slowest part of a CPU quantize kernel): adding and subtracting 2^23
// (2^52 for double) rounds |v| < 2^23 to an integer in the default
// rounding mode, ties to even, the same value as nearbyint; larger values,
// infinities and NaN are returned as they are (they are integers or not
// numbers), and the sign is copied so -0.4 gives -0.0 as nearbyint does.
template <class F>
inline F host_round_half_even(F v) {
  constexpr F big = std::is_same_v<F, float> ? F(8388608.0f) : F(4503599627370496.0);
  if (!(std::fabs(v) < big)) return v;
  const F r = v >= F(0) ? (v + big) - big : (v - big) + big;
  return std::copysign(r, v);
}

QGRAD_HD float round_half_even(float v) {
#if defined(__CUDA_ARCH__)
  return rintf(v);
#else
  return host_round_half_even(v);
#endif
}
QGRAD_HD double round_half_even(double v) {
#if defined(__CUDA_ARCH__)
  return rint(v);
#else
  return host_round_half_even(v);
#endif
}

// An integer-valued (or infinite) M to int64, clamped to +-2^32: beyond
// that every q is out of any int32 range [qmin, qmax] anyway.
template <class M>
QGRAD_HD std::int64_t to_clamped_int(M r) {
  const M lim = M(4294967296.0);
  r = r < -lim ? -lim : (r > lim ? lim : r);
  return static_cast<std::int64_t>(r);
}

QGRAD_HD std::int64_t clamp_i64(std::int64_t q, std::int64_t lo, std::int64_t hi) {
  return q < lo ? lo : (q > hi ? hi : q);
}

// A double rounded once to storage type T (16-bit types through float, as
// PyTorch's c10::Half(double) does).
template <class T>
QGRAD_HD T from_double(double v) {
  if constexpr (std::is_same_v<T, double>) return v;
  else if constexpr (std::is_same_v<T, float>) return static_cast<float>(v);
  else return T(static_cast<float>(v));
}

QGRAD_HD float inv_scale_of(float scale) { return 1.0f / scale; }

template <class T>
QGRAD_HD bool is_nan(T v) {
  return !(v == v);
}

// q = nearbyint(x * inv_scale) + zp, exactly; `nan` set for NaN inputs.
template <class M>
QGRAD_HD std::int64_t quant_index(M x, float inv_scale, std::int32_t zp, bool& nan) {
  const M v = x * static_cast<M>(inv_scale);
  nan = is_nan(v);
  if (nan) return 0;
  return to_clamped_int(round_half_even(v)) + zp;
}

// (q - zp) * scale, the product as PyTorch's CPU kernels take it:
// - kDoubleProduct (fake_quantize_per_channel_affine: std::fmin/fmax promote
//   to double): in f64, rounded once to T (16-bit types through f32);
// - otherwise (fake_quantize_per_tensor_affine, dequantize except to f64: int64 * float):
//   float(q - zp) * scale in f32, then widened or narrowed to T; so an f64
//   per-tensor fake quantize has f32-precision values, as in PyTorch.
// For T computed in f32 and |q - zp| <= 2^24 the two are the same number.
template <class T, bool kDoubleProduct>
QGRAD_HD T dequant_value(std::int64_t q, std::int32_t zp, float scale) {
  const std::int64_t k = q - zp;
  if constexpr (kDoubleProduct) {
    if constexpr (!std::is_same_v<T, double>) {
      if (k >= -16777216 && k <= 16777216) return T(static_cast<float>(static_cast<std::int32_t>(k)) * scale);
    }
    return from_double<T>(static_cast<double>(k) * static_cast<double>(scale));
  } else {
    const float y = static_cast<float>(k) * scale;
    if constexpr (std::is_same_v<T, double>) return static_cast<double>(y);
    else return T(y);
  }
}

// ---- per-channel parameters ----
struct ChannelParams {
  float scale = 1.0f;
  float inv_scale = 1.0f;
  std::int32_t zp = 0;
};

// Where the parameters come from: device/host arrays [channels], or the
// host scalars when the pointers are null.
struct ParamSource {
  const float* scale = nullptr;
  const std::int32_t* zp = nullptr;
  float scale_value = 1.0f;
  std::int32_t zp_value = 0;
  QGRAD_HD ChannelParams get(std::int64_t c) const {
    ChannelParams p;
    p.scale = scale ? scale[c] : scale_value;
    p.zp = zp ? zp[c] : zp_value;
    p.inv_scale = inv_scale_of(p.scale);
    return p;
  }
};

// ---- elementwise ops of the quantize kernels (kernels/quantize.h) ----
// Each maps one input element (and its mask bit, for backward ops) to one
// output element (and its mask bit, for forward ops). kParams: needs the
// element's channel parameters; kReadsMask / kWritesMask: mask traffic.

// clamp(q, qmin, qmax) of storage value x, with bit = qmin <= q <= qmax;
// returns false (bit 0) for NaN.
template <class T>
QGRAD_HD bool clamped_quant(T x, const ChannelParams& p, std::int64_t qmin, std::int64_t qmax, std::int64_t& qc,
                            bool& bit) {
  bool nan;
  const std::int64_t q = quant_index(static_cast<op_math_t<T>>(x), p.inv_scale, p.zp, nan);
  bit = !nan && qmin <= q && q <= qmax;
  qc = clamp_i64(q, qmin, qmax);
  return !nan;
}

// Integers strictly inside +-2^24 are exact floats, and so is every sum of
// two of them that stays inside: the float forms below use this.
inline constexpr std::int64_t kExactFloatInt = std::int64_t{1} << 24;
QGRAD_HD bool float_exact_int(std::int64_t v) { return v > -kExactFloatInt && v < kExactFloatInt; }

// fake quantize: y = (clamp(q) - zp) * scale; bit = qmin <= q <= qmax.
// float_form: the same value and bit in float op math, for parameters with
// float_form_exact (qmin, qmax and zp inside +-2^24, qmin - zp and qmax - zp
// within +-2^24: every integer format). q and its clamp are formed in float
// as QuantizeOp's float form argues (the same q and bit); qc - zp is then an
// exact float, so the product is dequant_value's |q - zp| <= 2^24 one. The
// int64 conversion and arithmetic of the general form made CUDA's per-token
// row kernels instruction-bound (dev/cuda/row_fq_forms.cu); the elementwise
// engine keeps the general form (memory-bound, and no faster in the float
// one: docs/benchmarks.md, thirteenth session).
template <class T, bool kDoubleProduct>
struct FakeQuantOp {
  using In = T;
  using Out = T;
  static constexpr bool kParams = true, kReadsMask = false, kWritesMask = true;
  static constexpr bool kHasFloatForm = std::is_same_v<op_math_t<T>, float>;
  std::int64_t qmin, qmax;
  QGRAD_HD Out operator()(In x, const ChannelParams& p, bool, bool& bit) const {
    std::int64_t qc;
    return clamped_quant(x, p, qmin, qmax, qc, bit) ? dequant_value<T, kDoubleProduct>(qc, p.zp, p.scale) : x;
  }
  QGRAD_HD bool float_form_exact(const ChannelParams& p) const {
    return kHasFloatForm && float_exact_int(qmin) && float_exact_int(qmax) && float_exact_int(p.zp) &&
           qmin - p.zp >= -kExactFloatInt && qmax - p.zp <= kExactFloatInt;
  }
  // Requires float_form_exact(p).
  QGRAD_HD Out float_form(In x, const ChannelParams& p, bool& bit) const {
    static_assert(kHasFloatForm, "FakeQuantOp::float_form: f32, f16 and bf16 only");
    const float v = static_cast<float>(x) * p.inv_scale;
    const float lo = static_cast<float>(qmin), hi = static_cast<float>(qmax), z = static_cast<float>(p.zp);
    const float r = round_half_even(v) + z;
    bit = r >= lo && r <= hi;  // false for NaN
    const T y = T((fminf(fmaxf(r, lo), hi) - z) * p.scale);
    // NaN: y = x, bit 0 (clamped_quant's NaN case); a select, not a branch
    // (one instruction fewer an element in the fused pooling).
    return v != v ? x : y;
  }
  // float_form where `exact` (float_form_exact(p), decided once a row), else the general form.
  QGRAD_HD Out row_value(In x, const ChannelParams& p, bool exact, bool& bit) const {
    if constexpr (kHasFloatForm) {
      if (exact) return float_form(x, p, bit);
    }
    return (*this)(x, p, false, bit);
  }
};

// relu(fake quantize) as one op: y = relu(FakeQuantOp's y) (formulas::relu:
// NaN kept), bit = FakeQuantOp's bit and y > 0 (relu_mask). The values are
// the composition's; its backward, a select on the bit (relu's), gives +0
// where the composition gives dy * 0 (q > qmax: -0 for a negative dy, NaN
// for a non-finite one).
template <class T, bool kDoubleProduct>
struct FakeQuantReluOp : FakeQuantOp<T, kDoubleProduct> {
  using Base = FakeQuantOp<T, kDoubleProduct>;
  using typename Base::In;
  using typename Base::Out;
  QGRAD_HD static Out apply_relu(Out y, bool& bit) {
    using M = op_math_t<T>;
    bit = bit && relu_mask(M(y));
    return T(relu(M(y)));
  }
  QGRAD_HD Out operator()(In x, const ChannelParams& p, bool b, bool& bit) const {
    return apply_relu(Base::operator()(x, p, b, bit), bit);
  }
  QGRAD_HD Out float_form(In x, const ChannelParams& p, bool& bit) const {
    return apply_relu(Base::float_form(x, p, bit), bit);
  }
  QGRAD_HD Out row_value(In x, const ChannelParams& p, bool exact, bool& bit) const {
    return apply_relu(Base::row_value(x, p, exact, bit), bit);
  }
};

// quantize to integer type I: clamp(q, qmin, qmax) (qmin/qmax: I's range).
// In float op math with qmin, qmax and zp inside +-2^24 the integer q is
// formed in float instead of int64 (the 64-bit conversion and arithmetic made
// the CUDA kernel instruction-bound, 75% of copy): r = nearbyint(v) + zp is
// exact while |r| < 2^24, and beyond that rounds to a float of magnitude >=
// 2^24, which clamps to the same bound with the same 0 bit; NaN compares
// false (bit 0) and fmaxf maps it to qmin; +-inf clamp as +-2^32 did. So both
// forms give the same q and bit for every input.
template <class T, class I>
struct QuantizeOp {
  using In = T;
  using Out = I;
  static constexpr bool kParams = true, kReadsMask = false, kWritesMask = true;
  static constexpr bool kHasFloatForm = std::is_same_v<op_math_t<T>, float>;
  std::int64_t qmin, qmax;
  QGRAD_HD Out operator()(In x, const ChannelParams& p, bool, bool& bit) const {
    if constexpr (kHasFloatForm) {
      if (float_form_exact(p)) return float_form(x, p, bit);
    }
    std::int64_t qc;
    return static_cast<I>(clamped_quant(x, p, qmin, qmax, qc, bit) ? qc : qmin);
  }
  QGRAD_HD bool float_form_exact(const ChannelParams& p) const {
    return kHasFloatForm && float_exact_int(qmin) && float_exact_int(qmax) && float_exact_int(p.zp);
  }
  // Requires float_form_exact(p).
  QGRAD_HD Out float_form(In x, const ChannelParams& p, bool& bit) const {
    const float lo = static_cast<float>(qmin), hi = static_cast<float>(qmax);
    const float r = round_half_even(static_cast<float>(x) * p.inv_scale) + static_cast<float>(p.zp);
    bit = r >= lo && r <= hi;
    return static_cast<I>(static_cast<std::int32_t>(fminf(fmaxf(r, lo), hi)));
  }
};

// dequantize: y = (q - zp) * scale. An f64 output holds the exact f64
// product (|q - zp| < 2^33 times a 24-bit scale fits 53 bits) on every
// scope; other outputs take the product as PyTorch does (dequant_value).
template <class I, class T, bool kDoubleProduct>
struct DequantizeOp {
  using In = I;
  using Out = T;
  static constexpr bool kParams = true, kReadsMask = false, kWritesMask = false;
  // 8/16-bit q and a zero point inside +-2^24: float(q) - float(zp) is
  // float(q - zp), rounded once, as dequant_value forms it from int64
  // (whose conversion is a slow instruction on CUDA); then the same
  // product (for f32 results the two product forms are the same number).
  static constexpr bool kHasFloatForm = sizeof(I) <= 2 && !std::is_same_v<T, double>;
  std::int64_t qmin, qmax;
  QGRAD_HD Out operator()(In q, const ChannelParams& p, bool, bool& bit) const {
    if constexpr (kHasFloatForm) {
      if (float_form_exact(p)) return float_form(q, p, bit);
    }
    return dequant_value<T, kDoubleProduct || std::is_same_v<T, double>>(static_cast<std::int64_t>(q), p.zp, p.scale);
  }
  QGRAD_HD bool float_form_exact(const ChannelParams& p) const { return kHasFloatForm && float_exact_int(p.zp); }
  // Requires float_form_exact(p).
  QGRAD_HD Out float_form(In q, const ChannelParams& p, bool&) const {
    return T((static_cast<float>(q) - static_cast<float>(p.zp)) * p.scale);
  }
};

// straight-through backward of fake quantize: dx = dy * mask.
template <class T>
struct FakeQuantGradOp {
  using In = T;
  using Out = T;
  static constexpr bool kParams = false, kReadsMask = true, kWritesMask = false;
  std::int64_t qmin, qmax;
  QGRAD_HD Out operator()(In dy, const ChannelParams&, bool bit, bool&) const {
    using M = op_math_t<T>;
    return T(static_cast<M>(dy) * static_cast<M>(bit ? 1 : 0));  // as PyTorch's dy * mask: -0.0 kept
  }
};

// backward of quantize: dx = dy / scale * mask.
template <class T>
struct QuantizeGradOp {
  using In = T;
  using Out = T;
  static constexpr bool kParams = true, kReadsMask = true, kWritesMask = false;
  std::int64_t qmin, qmax;
  QGRAD_HD Out operator()(In dy, const ChannelParams& p, bool bit, bool&) const {
    using M = op_math_t<T>;
    return T((static_cast<M>(dy) / static_cast<M>(p.scale)) * static_cast<M>(bit ? 1 : 0));
  }
};

// backward of dequantize: dq = dy * scale.
template <class T>
struct DequantizeGradOp {
  using In = T;
  using Out = T;
  static constexpr bool kParams = true, kReadsMask = false, kWritesMask = false;
  std::int64_t qmin, qmax;
  QGRAD_HD Out operator()(In dy, const ChannelParams& p, bool, bool&) const {
    using M = op_math_t<T>;
    return T(static_cast<M>(dy) * static_cast<M>(p.scale));
  }
};

// ---- learnable fake quantize (LSQ) ----
// The zero point used by forward and backward alike:
// clamp(nearbyint(float(zp)), qmin, qmax); NaN gives qmin. (PyTorch's
// backward uses (int64)(zp + 0.5f) instead, so the two can disagree there.)
template <class Z>
QGRAD_HD std::int32_t lsq_zero_point(Z zp, std::int64_t qmin, std::int64_t qmax) {
  const float z = static_cast<float>(zp);
  if (is_nan(z)) return static_cast<std::int32_t>(qmin);
  return static_cast<std::int32_t>(clamp_i64(to_clamped_int(round_half_even(z)), qmin, qmax));
}

template <class M>
struct LsqGrad {
  M dx, ds, dz;
};

// PyTorch's per-element LSQ gradients (_fake_quantize_grad_learnable_*),
// with its multiplication order, in op math M; g = grad_factor.
template <class M>
QGRAD_HD LsqGrad<M> lsq_grad(M x, M dy, const ChannelParams& p, std::int64_t qmin, std::int64_t qmax, M g) {
  bool nan;
  const std::int64_t q = quant_index(x, p.inv_scale, p.zp, nan);
  LsqGrad<M> r{M(0), M(0), M(0)};
  if (nan) return r;
  if (q < qmin || q > qmax) {
    r.dx = dy * M(0);
    r.dz = ((dy * M(-1)) * static_cast<M>(p.scale)) * g;
    r.ds = (dy * static_cast<M>((q < qmin ? qmin : qmax) - p.zp)) * g;
  } else {
    r.dx = dy * M(1);
    const M xfq = static_cast<M>(q - p.zp) * static_cast<M>(p.scale);
    r.ds = ((dy * (xfq - x)) * static_cast<M>(p.inv_scale)) * g;
  }
  return r;
}

// The deterministic two-stage reduction of LSQ's scale and zero-point
// gradients, identical on CPU and CUDA: each channel's elements (in
// channel-local order j = outer * inner + i) are cut into chunks of
// kLsqChunk; in a chunk, "thread" t of kLsqThreads sums j = t, t + 256, ...
// in order, then the 256 partials combine by the tree p[t] += p[t + s] for
// s = 128, 64, ..., 1 (stage 1, fused with dx). Stage 2 combines a
// channel's chunk sums the same way: "thread" t sums chunks t, t + 256, ...
// in order, then the same tree. Neither stage depends on the thread count.
inline constexpr int kLsqThreads = 256;
inline constexpr std::int64_t kLsqChunk = 8192;

// Offset of channel-local element j of channel c (AxisLayout::offset_in_channel)
// without a division in the two common layouts: one outer slice (per
// tensor, or channels on axis 0) and inner == 1 (last axis).
QGRAD_HD std::int64_t lsq_offset(const kernels::AxisLayout& l, std::int64_t j, std::int64_t c) {
  if (l.outer == 1) return c * l.inner + j;
  if (l.inner == 1) return j * l.channels + c;
  return l.offset_in_channel(j, c);
}

}  // namespace qgrad::formulas
