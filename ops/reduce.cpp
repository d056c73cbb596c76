// sum, mean, argmax: validation, forward, saved state and backward.
#include "qgrad/ops/reduce.h"

#include "qgrad/autograd/node.h"
#include "qgrad/kernels/reduce.h"
#include "qgrad/ops/check.h"

namespace qgrad {

using kernels::AxisLayout;

namespace {

// The shared body of sum and mean. axis < 0 after normalisation (kAll)
// reduces everything. Backward: dx = expand(dy) (· 1/n for mean). Saves
// nothing but shapes.
constexpr std::int64_t kAll = -1;

Tensor reduce_sum(const char* op, const Tensor& x, std::int64_t axis, bool keepdim, bool mean) {
  check::floating(x, op, "x");
  AxisLayout v{1, x.numel(), 1};
  Shape out_shape;
  if (axis != kAll) {
    v = kernels::AxisLayout::of(x.shape(), axis);
    out_shape = x.shape();
    if (keepdim) out_shape[static_cast<std::size_t>(axis)] = 1;
    else out_shape.erase(out_shape.begin() + axis);
  }
  QGRAD_CHECK(!mean || v.channels > 0, op, "x", "mean over zero elements (shape ", shape_str(x.shape()), ")");
  Tensor out = Tensor::empty(out_shape, TensorOptions{}.with_dtype(x.dtype()).with_device(x.device()));
  kernels::sum_axis(x, out, v, mean);
  if (any_requires_grad({x})) {
    const double scale = mean ? 1.0 / static_cast<double>(v.channels) : 1.0;
    record(op, out, {x}, [v, scale, shape = x.shape()](const Tensor& g) {
      Tensor dx = Tensor::empty(shape, TensorOptions{}.with_dtype(g.dtype()).with_device(g.device()));
      kernels::expand_axis(g, dx, v, scale);
      return std::vector<Tensor>{dx};
    });
  }
  return out;
}

std::int64_t checked_axis(const Tensor& x, std::int64_t axis, const char* op) {
  check::defined(x, op, "x");
  return check::axis(axis, x.dim(), op);
}

}  // namespace

Tensor sum(const Tensor& x) { return reduce_sum("sum", x, kAll, false, false); }
Tensor mean(const Tensor& x) { return reduce_sum("mean", x, kAll, false, true); }
Tensor sum(const Tensor& x, std::int64_t axis, bool keepdim) {
  return reduce_sum("sum", x, checked_axis(x, axis, "sum"), keepdim, false);
}
Tensor mean(const Tensor& x, std::int64_t axis, bool keepdim) {
  return reduce_sum("mean", x, checked_axis(x, axis, "mean"), keepdim, true);
}

Tensor argmax(const Tensor& x, std::int64_t axis) {
  constexpr const char* op = "argmax";
  const std::int64_t ax = checked_axis(x, axis, op);
  check::floating(x, op, "x");
  QGRAD_CHECK(x.size(ax) > 0, op, "x", "argmax over an empty axis (shape ", shape_str(x.shape()), ")");
  Shape out_shape = x.shape();
  out_shape.erase(out_shape.begin() + ax);
  Tensor out = Tensor::empty(out_shape, TensorOptions{}.with_dtype(DType::s64).with_device(x.device()));
  kernels::argmax_axis(x, out, kernels::AxisLayout::of(x.shape(), ax));
  return out;
}

}  // namespace qgrad
