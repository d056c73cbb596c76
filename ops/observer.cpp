#include "qgrad/ops/observer.h"

#include <cmath>

#include "qgrad/kernels/dynamic_quant.h"
#include "qgrad/kernels/observer.h"
#include "qgrad/ops/check.h"

namespace qgrad {

namespace {

// The running range: f32 [C] twins on one device. Returns C.
std::int64_t check_range(const ObserverUpdate& u, const char* op) {
  check::dtype_is(u.run_min, DType::f32, op, "run_min");
  check::dtype_is(u.run_max, DType::f32, op, "run_max");
  check::rank_is(u.run_min, 1, op, "run_min");
  QGRAD_CHECK(u.run_max.shape() == u.run_min.shape(), op, "run_max", "shape ", shape_str(u.run_max.shape()),
              " differs from run_min's ", shape_str(u.run_min.shape()));
  check::same_device(u.run_max, u.run_min, op, "run_max");
  QGRAD_CHECK(!std::isnan(u.averaging_constant) && u.averaging_constant <= 1.0, op, "averaging_constant",
              "must be <= 1 (negative: running min/max), got ", u.averaging_constant);
  return u.run_min.size(0);
}

void check_x(const Tensor& x, const ObserverUpdate& u, std::int64_t axis, std::int64_t channels, const char* op) {
  check::floating(x, op, "x");
  check::same_device(x, u.run_min, op, "x");
  if (axis < 0) {
    QGRAD_CHECK(channels == 1, op, "run_min", "a per-tensor range has one element, got ", channels);
    return;
  }
  QGRAD_CHECK(axis < x.dim(), op, "axis", "axis ", axis, " out of range for shape ", shape_str(x.shape()));
  QGRAD_CHECK(x.size(axis) == channels, op, "x", "expected ", channels, " channels on axis ", axis, ", got shape ",
              shape_str(x.shape()));
}

void check_qparams(const ObserverUpdate& u, const Tensor& scale, const Tensor& zero_point, std::int64_t qmin,
                   std::int64_t qmax, std::int64_t channels, const char* op) {
  check::dtype_is(scale, DType::f32, op, "scale");
  check::dtype_is(zero_point, DType::s32, op, "zero_point");
  QGRAD_CHECK(scale.shape() == Shape{channels}, op, "scale", "expected shape [", channels, "], got ",
              shape_str(scale.shape()));
  QGRAD_CHECK(zero_point.shape() == Shape{channels}, op, "zero_point", "expected shape [", channels, "], got ",
              shape_str(zero_point.shape()));
  check::same_device(scale, u.run_min, op, "scale");
  check::same_device(zero_point, u.run_min, op, "zero_point");
  QGRAD_CHECK(qmin < qmax && qmin >= -(std::int64_t{1} << 31) && qmax < (std::int64_t{1} << 31), op, "qmax",
              "need qmin < qmax within int32, got [", qmin, ", ", qmax, "]");
}

kernels::ObserverQparams kernel_qparams(const ObserverUpdate& u, const Tensor& scale, const Tensor& zero_point,
                                        std::int64_t qmin, std::int64_t qmax) {
  return {scale, zero_point, qmin, qmax, u.symmetric, u.symmetric_zero_point};
}

}  // namespace

void observe_minmax_(const Tensor& x, const ObserverUpdate& observer, std::int64_t axis) {
  const char* op = "observe_minmax_";
  const std::int64_t channels = check_range(observer, op);
  check_x(x, observer, axis, channels, op);
  kernels::observer_minmax(x, observer.run_min, observer.run_max, axis, observer.averaging_constant);
}

void observe_minmax_qparams_(const Tensor& x, const ObserverUpdate& observer, std::int64_t axis,
                             const Tensor& scale, const Tensor& zero_point, std::int64_t qmin, std::int64_t qmax) {
  const char* op = "observe_minmax_qparams_";
  const std::int64_t channels = check_range(observer, op);
  check_x(x, observer, axis, channels, op);
  check_qparams(observer, scale, zero_point, qmin, qmax, channels, op);
  const kernels::ObserverQparams q = kernel_qparams(observer, scale, zero_point, qmin, qmax);
  kernels::observer_minmax(x, observer.run_min, observer.run_max, axis, observer.averaging_constant, &q);
}

void observer_qparams_(const ObserverUpdate& observer, const Tensor& scale, const Tensor& zero_point,
                       std::int64_t qmin, std::int64_t qmax) {
  const char* op = "observer_qparams_";
  const std::int64_t channels = check_range(observer, op);
  check_qparams(observer, scale, zero_point, qmin, qmax, channels, op);
  kernels::observer_qparams(observer.run_min, observer.run_max, scale, zero_point, qmin, qmax, observer.symmetric,
                            observer.symmetric_zero_point);
}

void observe_absmax_(const Tensor& x, const Tensor& amax) {
  const char* op = "observe_absmax_";
  check::floating(x, op, "x");
  check::dtype_is(amax, DType::f32, op, "amax");
  check::rank_is(amax, 1, op, "amax");
  check::same_device(amax, x, op, "amax");
  QGRAD_CHECK(x.dim() >= 1 && x.size(-1) == amax.size(0), op, "x", "expected shape [..., ", amax.size(0), "], got ",
              shape_str(x.shape()));
  kernels::column_absmax_update(x, amax.size(0), amax);
}

}  // namespace qgrad
