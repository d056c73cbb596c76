// Argument checks shared by the ops. Each throws qgrad::Error naming the op
// and the argument, and runs before anything is allocated or written.
#pragma once

#include <cmath>
#include <string>

#include "qgrad/core/tensor.h"
#include "qgrad/ops/dynamic_quant.h"  // QuantMode

namespace qgrad {
struct ActivationQuant;  // ops/quantized_linear.h
struct ObserverUpdate;   // ops/quantize.h
}

namespace qgrad::check {

inline void defined(const Tensor& t, const char* op, const char* arg) {
  QGRAD_CHECK(t.defined(), op, arg, "undefined tensor");
}
inline void floating(const Tensor& t, const char* op, const char* arg) {
  defined(t, op, arg);
  QGRAD_CHECK(is_floating(t.dtype()), op, arg, "expected a floating dtype (f32, f64, f16, bf16), got ",
              dtype_name(t.dtype()));
}
inline void dtype_is(const Tensor& t, DType d, const char* op, const char* arg) {
  defined(t, op, arg);
  QGRAD_CHECK(t.dtype() == d, op, arg, "expected dtype ", dtype_name(d), ", got ", dtype_name(t.dtype()));
}
inline void same_dtype(const Tensor& t, const Tensor& ref, const char* op, const char* arg) {
  QGRAD_CHECK(t.dtype() == ref.dtype(), op, arg, "dtype ", dtype_name(t.dtype()), " differs from ",
              dtype_name(ref.dtype()));
}
inline void same_device(const Tensor& t, const Tensor& ref, const char* op, const char* arg) {
  QGRAD_CHECK(t.device() == ref.device(), op, arg, "tensor is on ", t.device().str(), " but the op runs on ",
              ref.device().str());
}
inline void rank_is(const Tensor& t, std::int64_t r, const char* op, const char* arg) {
  QGRAD_CHECK(t.dim() == r, op, arg, "expected rank ", r, ", got shape ", shape_str(t.shape()));
}
inline void non_empty(const Tensor& t, const char* op, const char* arg) {
  QGRAD_CHECK(t.numel() > 0, op, arg, "empty tensor (shape ", shape_str(t.shape()), ")");
}
// Normalises a possibly negative axis into [0, rank).
inline std::int64_t axis(std::int64_t axis, std::int64_t rank, const char* op, const char* arg = "axis") {
  QGRAD_CHECK(axis >= -rank && axis < rank, op, arg, "axis ", axis, " out of range for rank ", rank);
  return axis < 0 ? axis + rank : axis;
}
inline void finite_positive(double v, const char* op, const char* arg) {
  QGRAD_CHECK(std::isfinite(v) && v > 0, op, arg, "must be finite and > 0, got ", v);
}
inline void quant_mode(QuantMode mode, const char* op) {
  QGRAD_CHECK(mode == QuantMode::symmetric || mode == QuantMode::asymmetric, op, "mode", "unknown mode ",
              static_cast<int>(mode));
}
// choose_qparams_affine's integer range and eps (ops/lowbit.h; the dynamic
// fake quants check them alike): qmin < qmax within [-2^24, 2^24] (integers
// exact in f32: qmax - qmin is an f32 divisor), eps a finite positive f32
// with a finite reciprocal. Returns eps as that f32.
inline float affine_range(std::int64_t qmin, std::int64_t qmax, double eps, const char* op) {
  constexpr std::int64_t lim = std::int64_t{1} << 24;
  QGRAD_CHECK(qmin >= -lim && qmin <= lim, op, "qmin", "must lie in [-2^24, 2^24], got ", qmin);
  QGRAD_CHECK(qmax >= -lim && qmax <= lim, op, "qmax", "must lie in [-2^24, 2^24], got ", qmax);
  QGRAD_CHECK(qmin < qmax, op, "qmax", "qmin must be < qmax, got qmin ", qmin, ", qmax ", qmax);
  const auto e = static_cast<float>(eps);
  QGRAD_CHECK(std::isfinite(eps) && eps > 0 && std::isfinite(e) && e > 0 && std::isfinite(1.0f / e), op, "eps",
              "must be a finite positive f32 with a finite reciprocal, got ", eps);
  return e;
}

// The static per-tensor activation quantization of the int8 ops
// (quantized_linear, quantized_conv2d): scale f32 and zero point s32, one
// element each, on the host or on `dev`; qmin < qmax within [-128, 255],
// spanning at most 256 values; a host scale finite and > 0; a host zero
// point in [qmin, qmax] with [qmin - zp, qmax - zp] inside s8. Errors name
// `op` and "act.*". Defined in ops/quantized_linear.cpp.
void static_activation_quant(const ActivationQuant& act, Device dev, const char* op);

// Per-tensor tensor qparams, as fake_quantize_per_tensor checks them: qmin <
// qmax within int32; scale f32 and zero_point s32, one element each, on
// ref's device; on the CPU their values (scale finite, > 0 with a finite
// reciprocal; zero point in [qmin, qmax]). Defined in ops/quantize.cpp.
// check_values = false: not their values (an observer writes them first).
void per_tensor_qparams(const Tensor& ref, const Tensor& scale, const Tensor& zero_point, std::int64_t qmin,
                        std::int64_t qmax, const char* op, bool check_values = true);

// An observer's running range as observe_fake_quantize_per_tensor checks it:
// run_min and run_max f32 of shape [channels] on ref's device, the
// averaging constant finite and <= 1. Defined in ops/quantize.cpp.
void observer_update(const Tensor& ref, const ObserverUpdate& u, std::int64_t channels, const char* op);

// FP8 tensor cores: compute capability >= 8.9 (Ada, Hopper and later); `cc`
// as cuda_compute_capability gives it (major * 10 + minor). The FP8 ops
// refuse an older GPU rather than give a wrong answer; the check takes the
// capability as an argument so that tests can give it any value.
inline void fp8_tensor_cores(int cc, const Device& device, const char* op, const char* arg = "device") {
  QGRAD_CHECK(cc >= 89, op, arg, "FP8 tensor cores need sm_89+ (compute capability >= 8.9); ", device.str(), " has ",
              cc / 10, ".", cc % 10);
}

// The broadcast of two shapes (numpy rules), or an error naming the op.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);

// A batch op's checks of its i-th element, written as the single op's
// checks: runs check(); an Error it throws comes back under `op`, its
// argument renamed by rename(arg) (for example "x" -> "xs[2]"), its message kept.
template <class Check, class Rename>
void item(const char* op, Check&& check, Rename&& rename) {
  try {
    check();
  } catch (const Error& err) {
    const std::string prefix = err.op() + ": argument '" + err.arg() + "': ";
    const std::string what = err.what();
    throw Error(op, rename(err.arg()), what.rfind(prefix, 0) == 0 ? what.substr(prefix.size()) : what);
  }
}

}  // namespace qgrad::check
