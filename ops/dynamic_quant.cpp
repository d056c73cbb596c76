#include "qgrad/ops/dynamic_quant.h"

#include "qgrad/kernels/dynamic_quant.h"
#include "qgrad/ops/check.h"
#include "qgrad/ops/factory.h"

namespace qgrad {

namespace {

constexpr const char* kOp = "dynamic_range_quantize";

void dtype_range(DType d, std::int64_t& lo, std::int64_t& hi) {
  lo = d == DType::s8 ? -128 : 0;
  hi = d == DType::s8 ? 127 : 255;
}

}  // namespace

DynamicQuantized dynamic_range_quantize(const Tensor& x, QuantScope scope, QuantMode mode, DType out_dtype) {
  std::int64_t lo = 0, hi = 0;
  dtype_range(out_dtype, lo, hi);
  return dynamic_range_quantize(x, scope, mode, out_dtype, lo, hi);
}

DynamicQuantized dynamic_range_quantize(const Tensor& x, QuantScope scope, QuantMode mode, DType out_dtype,
                                        std::int64_t qmin, std::int64_t qmax) {
  check::floating(x, kOp, "x");
  QGRAD_CHECK(out_dtype == DType::s8 || out_dtype == DType::u8, kOp, "out_dtype", "expected s8 or u8, got ",
              dtype_name(out_dtype));
  std::int64_t dlo = 0, dhi = 0;
  dtype_range(out_dtype, dlo, dhi);
  QGRAD_CHECK(qmin >= dlo && qmax <= dhi && qmin < qmax, kOp, "qmin/qmax", "range [", qmin, ", ", qmax,
              "] must satisfy ", dlo, " <= qmin < qmax <= ", dhi, " for ", dtype_name(out_dtype));
  QGRAD_CHECK(mode == QuantMode::asymmetric || qmin >= 0 || qmax > 0, kOp, "qmax",
              "a symmetric signed range needs qmax > 0");
  const Shape& shape = x.shape();
  const std::int64_t rank = x.dim();
  kernels::AxisLayout lay;
  std::int64_t group = 0;  // 0: one segment per channel of lay
  Shape scale_shape;
  switch (scope.kind) {
    case QuantScope::tensor:
      lay = kernels::AxisLayout::of(shape, -1);
      break;
    case QuantScope::channel: {
      QGRAD_CHECK(rank >= 1, kOp, "x", "channel scope needs rank >= 1");
      lay = kernels::AxisLayout::of(shape, check::axis(scope.axis, rank, kOp));
      scale_shape = {lay.channels};
      break;
    }
    case QuantScope::token: {
      QGRAD_CHECK(rank >= 1, kOp, "x", "token scope needs rank >= 1 (rows of the last axis)");
      lay = kernels::AxisLayout::of(shape, rank - 1);
      group = lay.channels;
      scale_shape = Shape(shape.begin(), shape.end() - 1);
      break;
    }
    case QuantScope::group: {
      QGRAD_CHECK(rank >= 1, kOp, "x", "group scope needs rank >= 1");
      const std::int64_t ax = check::axis(scope.axis, rank, kOp);
      QGRAD_CHECK(scope.group_size >= 1, kOp, "group_size", "must be >= 1, got ", scope.group_size);
      QGRAD_CHECK(shape[static_cast<std::size_t>(ax)] % scope.group_size == 0, kOp, "group_size", "size ",
                  shape[static_cast<std::size_t>(ax)], " of axis ", ax, " is not a multiple of ", scope.group_size);
      lay = kernels::AxisLayout::of(shape, ax);
      group = scope.group_size;
      scale_shape = shape;
      scale_shape[static_cast<std::size_t>(ax)] = lay.channels / scope.group_size;
      break;
    }
    default:
      throw Error(kOp, "scope", "unknown scope");
  }
  const TensorOptions on = TensorOptions{}.with_device(x.device());
  DynamicQuantized r;
  r.q = Tensor::empty(shape, TensorOptions(on).with_dtype(out_dtype));
  r.scale = Tensor::empty(scale_shape, TensorOptions(on).with_dtype(x.dtype() == DType::f64 ? DType::f64 : DType::f32));
  r.zero_point = Tensor::empty(scale_shape, TensorOptions(on).with_dtype(DType::s32));
  if (x.numel() == 0) {  // empty segments: scale 1, zero point 0
    r.scale = full(scale_shape, 1.0, TensorOptions(on).with_dtype(r.scale.dtype()));
    r.zero_point = zeros(scale_shape, TensorOptions(on).with_dtype(DType::s32));
    return r;
  }
  const kernels::QuantSpec spec{mode == QuantMode::symmetric, static_cast<int>(qmin), static_cast<int>(qmax)};
  if (group != 0 && lay.inner == 1 && group == lay.channels) {  // rows [outer, D]
    kernels::quantize_rows_dynamic(x, lay.channels, spec, r.q, lay.channels, r.scale, r.zero_point);
  } else {
    kernels::dynamic_quantize(x, lay, group, spec, r.q, r.scale, r.zero_point);
  }
  return r;
}

}  // namespace qgrad
