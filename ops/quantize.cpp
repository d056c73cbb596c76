// Quantization ops: validation, forward kernel, saved state and backward
// rule of each op in one place. Formulas: kernels/formulas/quantize.h.
#include "qgrad/ops/quantize.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "qgrad/autograd/node.h"
#include "qgrad/kernels/bitmask.h"
#include "qgrad/kernels/deferred.h"
#include "qgrad/kernels/quantize.h"
#include "qgrad/ops/check.h"
#include "qgrad/ops/elementwise.h"
#include "qgrad/ops/straight_through.h"

namespace qgrad {

std::int64_t quant_min_of(DType dtype) {
  return dispatch_int8(dtype, "quantize", [](auto tag) {
    return static_cast<std::int64_t>(std::numeric_limits<typename decltype(tag)::type>::min());
  });
}
std::int64_t quant_max_of(DType dtype) {
  return dispatch_int8(dtype, "quantize", [](auto tag) {
    return static_cast<std::int64_t>(std::numeric_limits<typename decltype(tag)::type>::max());
  });
}

namespace detail {

Tensor new_mask(const Tensor& x) {
  return Tensor::empty({bitmask_words(x.numel())}, TensorOptions{}.with_dtype(DType::s32).with_device(x.device()));
}

std::uint32_t* mask_words(const Tensor& mask) {
  return mask.defined() ? static_cast<std::uint32_t*>(mask.data_ptr()) : nullptr;
}

void record_masked_backward(const char* op, Tensor& out, const Tensor& x, const Tensor& mask) {
  const bool leaf = gradient_deferrable(x);
  record(
      op, out, {x},
      [mask, leaf, dt = x.dtype()](const Tensor& g) {
        // In x's dtype: g's, or (fake_quantize_dynamic_batch's out_dtype) one whose values x's holds exactly.
        Tensor dx = Tensor::empty(g.shape(), TensorOptions{}.with_dtype(dt).with_device(g.device()));
        kernels::masked_gradient(g, mask, dx, leaf ? deferred_gradient_passes() : nullptr);
        return std::vector<Tensor>{dx};
      },
      mask.nbytes());
  // Into a leaf: g is read only by the queued mask pass (a cast above, as
  // mixed precision's of a fake-quantized weight, may stay queued too).
  out.grad_fn()->reads_gradient_deferred = leaf;
}

}  // namespace detail

namespace {

using detail::mask_words;
using detail::new_mask;

// Resolved quantization parameters: where the kernel reads them and how
// an element finds its channel. Holds the parameter tensors alive.
struct Scope {
  formulas::ParamSource source;
  kernels::AxisLayout layout;  // element i uses channel layout.channel(i); per tensor: one channel
  bool product_in_f64 = false;  // per channel/token/group: see formulas::dequant_value
  Tensor scale, zp;  // detached; undefined for host scalars
  std::size_t bytes() const { return scale.defined() ? scale.nbytes() + zp.nbytes() : 0; }
  kernels::QuantParams params(std::int64_t qmin, std::int64_t qmax) const {
    return {layout, source, qmin, qmax, product_in_f64};
  }
};

TensorOptions like(const Tensor& t, DType dtype) { return TensorOptions{}.with_dtype(dtype).with_device(t.device()); }

void check_range(std::int64_t qmin, std::int64_t qmax, const char* op) {
  constexpr std::int64_t lo = std::numeric_limits<std::int32_t>::min(), hi = std::numeric_limits<std::int32_t>::max();
  QGRAD_CHECK(qmin >= lo && qmin <= hi, op, "qmin", "must fit in int32, got ", qmin);
  QGRAD_CHECK(qmax >= lo && qmax <= hi, op, "qmax", "must fit in int32, got ", qmax);
  QGRAD_CHECK(qmin < qmax, op, "qmax", "qmin must be < qmax, got qmin ", qmin, ", qmax ", qmax);
}

void check_int8(DType dtype, const char* op, const char* arg) {
  QGRAD_CHECK(dtype == DType::s8 || dtype == DType::u8, op, arg, "expected s8 or u8, got ", dtype_name(dtype));
}

void check_scale_value(double scale, const char* op) {
  check::finite_positive(scale, op, "scale");
  const float f = static_cast<float>(scale);
  QGRAD_CHECK(std::isfinite(f) && f > 0 && std::isfinite(1.0f / f), op, "scale",
              "must be a finite positive f32 with a finite reciprocal, got ", scale);
}

void check_zp_value(std::int64_t zp, std::int64_t qmin, std::int64_t qmax, const char* op) {
  QGRAD_CHECK(zp >= qmin && zp <= qmax, op, "zero_point", "must lie in [", qmin, ", ", qmax, "], got ", zp);
}

Scope scalar_scope(double scale, std::int64_t zp, std::int64_t qmin, std::int64_t qmax, const char* op) {
  check_scale_value(scale, op);
  check_zp_value(zp, qmin, qmax, op);
  Scope s;
  s.source.scale_value = static_cast<float>(scale);
  s.source.zp_value = static_cast<std::int32_t>(zp);
  return s;
}

// Tensor qparams: f32 scale and s32 zero point of `shape` (per tensor: any
// shape of one element) on `ref`'s device. Values checked when on the CPU.
Scope tensor_scope(const Tensor& ref, const Tensor& scale, const Tensor& zp, const Shape* shape, std::int64_t qmin,
                   std::int64_t qmax, const char* op, bool check_values = true) {
  check::dtype_is(scale, DType::f32, op, "scale");
  check::dtype_is(zp, DType::s32, op, "zero_point");
  check::same_device(scale, ref, op, "scale");
  check::same_device(zp, ref, op, "zero_point");
  if (shape) {
    QGRAD_CHECK(scale.shape() == *shape, op, "scale", "expected shape ", shape_str(*shape), ", got ",
                shape_str(scale.shape()));
    QGRAD_CHECK(zp.shape() == *shape, op, "zero_point", "expected shape ", shape_str(*shape), ", got ",
                shape_str(zp.shape()));
  } else {
    QGRAD_CHECK(scale.numel() == 1, op, "scale", "expected one element, got shape ", shape_str(scale.shape()));
    QGRAD_CHECK(zp.numel() == 1, op, "zero_point", "expected one element, got shape ", shape_str(zp.shape()));
  }
  if (check_values && !scale.is_cuda()) {
    const float* s = scale.data<float>();
    const std::int32_t* z = zp.data<std::int32_t>();
    for (std::int64_t i = 0; i < scale.numel(); ++i) check_scale_value(s[i], op);
    for (std::int64_t i = 0; i < zp.numel(); ++i) check_zp_value(z[i], qmin, qmax, op);
  }
  Scope sc;
  sc.scale = scale.detach();
  sc.zp = zp.detach();
  sc.source.scale = sc.scale.data<float>();
  sc.source.zp = sc.zp.data<std::int32_t>();
  return sc;
}


// Fake quantize with straight-through backward: saves only the bit mask.
// With `obs`, the observer update that writes sc's qparams runs first (the
// same launch on CUDA). With relu, relu(fake quantize) in the same pass
// (formulas::FakeQuantReluOp): the mask bit also needs y > 0 and the
// backward selects on it, as relu's does (dx = bit ? dy : +0).
Tensor fake_quant_forward(const char* name, const Tensor& x, const Scope& sc, std::int64_t qmin, std::int64_t qmax,
                          const kernels::ObserveArgs* obs = nullptr, bool relu = false) {
  Tensor out = Tensor::empty(x.shape(), like(x, x.dtype()));
  const bool need = any_requires_grad({x});
  Tensor mask = need ? new_mask(x) : Tensor();
  if (obs) kernels::observe_fake_quantize(x, out, sc.params(qmin, qmax), mask_words(mask), *obs, relu);
  else kernels::fake_quantize(x, out, sc.params(qmin, qmax), mask_words(mask), relu);
  if (need && relu) detail::record_relu_backward(name, out, x, mask);
  else if (need) detail::record_masked_backward(name, out, x, mask);
  return out;
}

// Quantize to s8/u8: saves the bit mask and the qparams; the gradient
// travels in x's dtype.
Tensor quantize_forward(const char* name, const Tensor& x, const Scope& sc, DType dtype) {
  const std::int64_t qmin = quant_min_of(dtype), qmax = quant_max_of(dtype);
  Tensor out = Tensor::empty(x.shape(), like(x, dtype));
  const bool need = any_requires_grad({x});
  Tensor mask = need ? new_mask(x) : Tensor();
  kernels::quantize(x, out, sc.params(qmin, qmax), mask_words(mask));
  if (need) {
    const DType xd = x.dtype();
    record(
        name, out, {x},
        [mask, sc, xd](const Tensor& g) {
          Tensor gx = g.dtype() == xd ? g : g.to(xd);
          Tensor dx = Tensor::empty(gx.shape(), like(gx, xd));
          kernels::quantize_backward(gx, dx, sc.params(0, 0), mask_words(mask));
          return std::vector<Tensor>{dx};
        },
        mask.nbytes() + sc.bytes(), xd, true);
  }
  return out;
}

// Dequantize from s8/u8: saves the qparams; dq = dy * scale in out_dtype.
Tensor dequantize_forward(const char* name, const Tensor& q, const Scope& sc, DType out_dtype) {
  Tensor out = Tensor::empty(q.shape(), like(q, out_dtype));
  kernels::dequantize(q, out, sc.params(0, 0));
  if (any_requires_grad({q})) {
    record(
        name, out, {q},
        [sc](const Tensor& g) {
          Tensor dq = Tensor::empty(g.shape(), like(g, g.dtype()));
          kernels::dequantize_backward(g, dq, sc.params(0, 0));
          return std::vector<Tensor>{dq};
        },
        sc.bytes());
  }
  return out;
}

void check_quant_input(const Tensor& x, DType dtype, const char* op) {
  check::floating(x, op, "x");
  check_int8(dtype, op, "dtype");
}

void check_dequant_input(const Tensor& q, DType out_dtype, const char* op) {
  check::defined(q, op, "q");
  check_int8(q.dtype(), op, "q");
  QGRAD_CHECK(is_floating(out_dtype), op, "out_dtype", "expected a floating dtype, got ", dtype_name(out_dtype));
}

// Per-channel layout of `x` along `axis` (validated): scope dims.
Scope channel_scope(const Tensor& x, const Tensor& scale, const Tensor& zp, std::int64_t axis, std::int64_t qmin,
                    std::int64_t qmax, const char* op, bool check_values = true) {
  QGRAD_CHECK(x.dim() >= 1, op, "x", "expected rank >= 1, got a scalar");
  const std::int64_t ax = check::axis(axis, x.dim(), op);
  const Shape shape{x.shape()[static_cast<std::size_t>(ax)]};
  Scope sc = tensor_scope(x, scale, zp, &shape, qmin, qmax, op, check_values);
  sc.layout = kernels::AxisLayout::of(x.shape(), ax);
  sc.product_in_f64 = true;
  return sc;
}

// One channel per row of the last axis: scale shape x.shape[:-1].
Scope token_scope(const Tensor& x, const Tensor& scale, const Tensor& zp, std::int64_t qmin, std::int64_t qmax,
                  const char* op, bool check_values = true) {
  QGRAD_CHECK(x.dim() >= 1, op, "x", "expected rank >= 1, got a scalar");
  const Shape shape(x.shape().begin(), x.shape().end() - 1);
  Scope sc = tensor_scope(x, scale, zp, &shape, qmin, qmax, op, check_values);
  sc.layout = kernels::AxisLayout{1, shape_numel(shape), x.shape().back()};
  sc.product_in_f64 = true;
  return sc;
}

Scope group_scope(const Tensor& x, const Tensor& scale, const Tensor& zp, std::int64_t group_size, std::int64_t qmin,
                  std::int64_t qmax, const char* op, bool check_values = true) {
  QGRAD_CHECK(x.dim() >= 1, op, "x", "expected rank >= 1, got a scalar");
  QGRAD_CHECK(group_size > 0, op, "group_size", "must be > 0, got ", group_size);
  const std::int64_t d = x.shape().back();
  QGRAD_CHECK(d % group_size == 0, op, "group_size", "last dim ", d, " is not a multiple of ", group_size);
  Shape shape = x.shape();
  shape.back() = d / group_size;
  Scope sc = tensor_scope(x, scale, zp, &shape, qmin, qmax, op, check_values);
  sc.layout = kernels::AxisLayout{1, x.numel() / group_size, group_size};
  sc.product_in_f64 = true;
  return sc;
}

using I64 = std::int64_t;

// The qparams of `scope` for x (validated: shapes, dtypes, device, values on
// the CPU unless check_values is false). The group scope runs along the last axis.
Scope scope_of(QuantScope scope, const Tensor& x, const Tensor& scale, const Tensor& zp, I64 qmin, I64 qmax,
               const char* op, bool check_values = true) {
  switch (scope.kind) {
    case QuantScope::tensor: return tensor_scope(x, scale, zp, nullptr, qmin, qmax, op, check_values);
    case QuantScope::channel: return channel_scope(x, scale, zp, scope.axis, qmin, qmax, op, check_values);
    case QuantScope::token: return token_scope(x, scale, zp, qmin, qmax, op, check_values);
    case QuantScope::group: {
      QGRAD_CHECK(x.dim() >= 1, op, "x", "expected rank >= 1, got a scalar");
      const I64 ax = check::axis(scope.axis, x.dim(), op);
      QGRAD_CHECK(ax == x.dim() - 1, op, "scope", "per_group runs along the last axis (", x.dim() - 1, "), got axis ",
                  scope.axis);
      return group_scope(x, scale, zp, scope.group_size, qmin, qmax, op, check_values);
    }
  }
  throw Error(op, "scope", "unknown scope kind " + std::to_string(static_cast<int>(scope.kind)));
}

// The views under which (q - zp) and the scale of `scope` broadcast against
// each other (the scope already validated).
struct ScaleViews {
  Shape q, s;
};
ScaleViews scale_views(QuantScope scope, const Tensor& q, const Tensor& scale) {
  switch (scope.kind) {
    case QuantScope::channel: {
      const I64 ax = scope.axis < 0 ? scope.axis + q.dim() : scope.axis;
      Shape sv(static_cast<std::size_t>(q.dim() - ax), 1);
      sv[0] = q.shape()[static_cast<std::size_t>(ax)];
      return {q.shape(), sv};
    }
    case QuantScope::token: {
      Shape sv = q.shape();
      sv.back() = 1;
      return {q.shape(), sv};
    }
    case QuantScope::group: {
      Shape qv = q.shape(), sv = scale.shape();
      qv.back() /= scope.group_size;
      qv.push_back(scope.group_size);
      sv.push_back(1);
      return {qv, sv};
    }
    default: return {q.shape(), Shape{}};
  }
}

// ---- LSQ ----
Tensor lsq_forward(const char* name, const Tensor& x, const Tensor& scale, const Tensor& zp, const Shape* shape,
                   const kernels::AxisLayout& layout, std::int64_t qmin, std::int64_t qmax, double grad_factor) {
  check::floating(scale, name, "scale");
  check::floating(zp, name, "zero_point");
  check::same_device(scale, x, name, "scale");
  check::same_device(zp, x, name, "zero_point");
  if (shape) {
    QGRAD_CHECK(scale.shape() == *shape, name, "scale", "expected shape ", shape_str(*shape), ", got ",
                shape_str(scale.shape()));
    QGRAD_CHECK(zp.shape() == *shape, name, "zero_point", "expected shape ", shape_str(*shape), ", got ",
                shape_str(zp.shape()));
  } else {
    QGRAD_CHECK(scale.numel() == 1, name, "scale", "expected one element, got shape ", shape_str(scale.shape()));
    QGRAD_CHECK(zp.numel() == 1, name, "zero_point", "expected one element, got shape ", shape_str(zp.shape()));
  }
  check_range(qmin, qmax, name);
  QGRAD_CHECK(std::isfinite(grad_factor), name, "grad_factor", "must be finite, got ", grad_factor);
  if (!scale.is_cuda()) {
    for (double s : scale.detach().to(DType::f64).to_vector<double>()) check_scale_value(s, name);
    for (double z : zp.detach().to(DType::f64).to_vector<double>())
      QGRAD_CHECK(!std::isnan(z), name, "zero_point", "must not be NaN");
  }
  Scope sc;
  sc.scale = scale.detach().to(DType::f32);
  sc.zp = Tensor::empty({layout.channels}, like(x, DType::s32));
  kernels::lsq_round_zero_point(zp.detach(), sc.zp, qmin, qmax);
  sc.source.scale = sc.scale.data<float>();
  sc.source.zp = sc.zp.data<std::int32_t>();
  sc.layout = layout;
  sc.product_in_f64 = shape != nullptr;  // PyTorch: per tensor -> fake_quantize_per_tensor, per channel -> _per_channel
  Tensor out = Tensor::empty(x.shape(), like(x, x.dtype()));
  kernels::fake_quantize(x, out, sc.params(qmin, qmax), nullptr);
  if (any_requires_grad({x, scale, zp})) {
    const Tensor xd = x.detach();
    record(
        name, out, {x, scale, zp},
        [xd, sc, qmin, qmax, grad_factor, s_shape = scale.shape(), s_dtype = scale.dtype(),
         z_shape = zp.shape(), z_dtype = zp.dtype()](const Tensor& g) {
          const DType m = xd.dtype() == DType::f64 ? DType::f64 : DType::f32;
          kernels::LsqArgs a;
          a.x = xd;
          a.dy = g.dtype() == xd.dtype() ? g : g.to(xd.dtype());
          a.scale = sc.scale;
          a.zp = sc.zp;
          a.dx = Tensor::empty(xd.shape(), like(xd, xd.dtype()));
          a.ds = Tensor::empty({sc.layout.channels}, like(xd, m));
          a.dz = Tensor::empty({sc.layout.channels}, like(xd, m));
          a.layout = sc.layout;
          a.qmin = qmin;
          a.qmax = qmax;
          a.grad_factor = grad_factor;
          kernels::lsq_backward(a);
          return std::vector<Tensor>{a.dx, a.ds.to(s_dtype).reshape(s_shape), a.dz.to(z_dtype).reshape(z_shape)};
        },
        x.nbytes() + sc.bytes());
  }
  return out;
}

}  // namespace

void check::per_tensor_qparams(const Tensor& ref, const Tensor& scale, const Tensor& zero_point, std::int64_t qmin,
                               std::int64_t qmax, const char* op, bool check_values) {
  check_range(qmin, qmax, op);
  tensor_scope(ref, scale, zero_point, nullptr, qmin, qmax, op, check_values);
}

void check::observer_update(const Tensor& ref, const ObserverUpdate& u, std::int64_t channels, const char* op) {
  const Shape c{channels};
  for (const auto& [t, arg] : {std::pair{&u.run_min, "run_min"}, std::pair{&u.run_max, "run_max"}}) {
    check::dtype_is(*t, DType::f32, op, arg);
    check::same_device(*t, ref, op, arg);
    QGRAD_CHECK(t->shape() == c, op, arg, "expected shape ", shape_str(c), ", got ", shape_str(t->shape()));
  }
  QGRAD_CHECK(std::isfinite(u.averaging_constant) && u.averaging_constant <= 1.0, op, "averaging_constant",
              "must be < 0 (min/max) or in [0, 1], got ", u.averaging_constant);
}

// ---- fake quantize ----
Tensor fake_quantize_per_tensor(const Tensor& x, double scale, std::int64_t zero_point, std::int64_t qmin,
                                std::int64_t qmax) {
  const char* op = "fake_quantize_per_tensor";
  check::floating(x, op, "x");
  check_range(qmin, qmax, op);
  const Scope sc = scalar_scope(scale, zero_point, qmin, qmax, op);
  return fake_quant_forward(op, x, sc, qmin, qmax);
}

namespace {
Tensor fake_quantize_op(const char* op, const Tensor& x, const Tensor& scale, const Tensor& zero_point,
                        QuantScope scope, std::int64_t qmin, std::int64_t qmax, bool check_values = true,
                        bool relu = false) {
  check::floating(x, op, "x");
  check_range(qmin, qmax, op);
  return fake_quant_forward(op, x, scope_of(scope, x, scale, zero_point, qmin, qmax, op, check_values), qmin, qmax,
                            nullptr, relu);
}
}  // namespace

Tensor fake_quantize(const Tensor& x, const Tensor& scale, const Tensor& zero_point, QuantScope scope,
                     std::int64_t qmin, std::int64_t qmax) {
  return fake_quantize_op("fake_quantize", x, scale, zero_point, scope, qmin, qmax);
}

Tensor detail::fake_quantize_computed_qparams(const char* op, const Tensor& x, const Tensor& scale,
                                              const Tensor& zero_point, QuantScope scope, std::int64_t qmin,
                                              std::int64_t qmax) {
  return fake_quantize_op(op, x, scale, zero_point, scope, qmin, qmax, false);
}

Tensor fake_quantize_per_tensor(const Tensor& x, const Tensor& scale, const Tensor& zero_point, std::int64_t qmin,
                                std::int64_t qmax) {
  return fake_quantize_op("fake_quantize_per_tensor", x, scale, zero_point, QuantScope::per_tensor(), qmin, qmax);
}

Tensor fake_quantize_relu_per_tensor(const Tensor& x, const Tensor& scale, const Tensor& zero_point,
                                     std::int64_t qmin, std::int64_t qmax) {
  return fake_quantize_op("fake_quantize_relu_per_tensor", x, scale, zero_point, QuantScope::per_tensor(), qmin, qmax,
                          true, true);
}

Tensor fake_quantize_per_channel(const Tensor& x, const Tensor& scale, const Tensor& zero_point, std::int64_t axis,
                                 std::int64_t qmin, std::int64_t qmax) {
  return fake_quantize_op("fake_quantize_per_channel", x, scale, zero_point, QuantScope::per_channel(axis), qmin,
                          qmax);
}

namespace {

// The observer arguments, validated against x's channels (1 per tensor).
kernels::ObserveArgs observe_args(const Tensor& x, const Scope& sc, std::int64_t axis, const ObserverUpdate& u,
                                  const char* op) {
  check::observer_update(x, u, std::max<std::int64_t>(sc.layout.channels, 1), op);
  kernels::ObserveArgs o;
  o.run_min = u.run_min;
  o.run_max = u.run_max;
  o.scale = sc.scale;
  o.zero_point = sc.zp;
  o.axis = axis;
  o.averaging_constant = u.averaging_constant;
  o.symmetric = u.symmetric;
  o.symmetric_zero_point = u.symmetric_zero_point;
  return o;
}

// The per-tensor observer-fused op, with or without the relu.
Tensor observe_per_tensor(const char* op, const Tensor& x, const Tensor& scale, const Tensor& zero_point,
                          std::int64_t qmin, std::int64_t qmax, const ObserverUpdate& observer, bool relu) {
  check::floating(x, op, "x");
  check_range(qmin, qmax, op);
  const Scope sc = tensor_scope(x, scale, zero_point, nullptr, qmin, qmax, op, false);
  const kernels::ObserveArgs o = observe_args(x, sc, -1, observer, op);
  return fake_quant_forward(op, x, sc, qmin, qmax, &o, relu);
}

}  // namespace

Tensor observe_fake_quantize_per_tensor(const Tensor& x, const Tensor& scale, const Tensor& zero_point,
                                        std::int64_t qmin, std::int64_t qmax, const ObserverUpdate& observer) {
  return observe_per_tensor("observe_fake_quantize_per_tensor", x, scale, zero_point, qmin, qmax, observer, false);
}

Tensor observe_fake_quantize_relu_per_tensor(const Tensor& x, const Tensor& scale, const Tensor& zero_point,
                                             std::int64_t qmin, std::int64_t qmax, const ObserverUpdate& observer) {
  return observe_per_tensor("observe_fake_quantize_relu_per_tensor", x, scale, zero_point, qmin, qmax, observer,
                            true);
}

Tensor observe_fake_quantize_per_channel(const Tensor& x, const Tensor& scale, const Tensor& zero_point,
                                         std::int64_t axis, std::int64_t qmin, std::int64_t qmax,
                                         const ObserverUpdate& observer) {
  const char* op = "observe_fake_quantize_per_channel";
  check::floating(x, op, "x");
  check_range(qmin, qmax, op);
  const Scope sc = channel_scope(x, scale, zero_point, axis, qmin, qmax, op, false);
  const kernels::ObserveArgs o = observe_args(x, sc, check::axis(axis, x.dim(), op), observer, op);
  return fake_quant_forward(op, x, sc, qmin, qmax, &o);
}

std::vector<Tensor> observe_fake_quantize_per_channel_batch(const std::vector<ChannelObserveArgs>& items) {
  const char* op = "observe_fake_quantize_per_channel_batch";
  QGRAD_CHECK(!items.empty(), op, "items", "expected at least one tensor");
  // Each item as observe_fake_quantize_per_channel checks it, the error naming items[i].
  std::vector<Scope> scopes;
  std::vector<kernels::ObserveArgs> observers;
  for (std::size_t i = 0; i < items.size(); ++i) {
    const ChannelObserveArgs& it = items[i];
    const std::string prefix = "items[" + std::to_string(i) + "].";
    check::item(
        op,
        [&] {
          const char* one = "observe_fake_quantize_per_channel";
          check::floating(it.x, one, "x");
          check_range(it.qmin, it.qmax, one);
          scopes.push_back(channel_scope(it.x, it.scale, it.zero_point, it.axis, it.qmin, it.qmax, one, false));
          observers.push_back(observe_args(it.x, scopes.back(), check::axis(it.axis, it.x.dim(), one), it.observer, one));
        },
        [&](const std::string& arg) { return prefix + arg; });
  }
  // No observer state shared between items.
  const auto state = [&](std::size_t i) {
    const ChannelObserveArgs& it = items[i];
    return std::array<std::pair<const char*, const Tensor*>, 4>{{{"run_min", &it.observer.run_min},
                                                                 {"run_max", &it.observer.run_max},
                                                                 {"scale", &it.scale},
                                                                 {"zero_point", &it.zero_point}}};
  };
  const auto overlap = [](const Tensor& a, const Tensor& b) {
    const auto* pa = static_cast<const char*>(a.data_ptr());
    const auto* pb = static_cast<const char*>(b.data_ptr());
    return a.device() == b.device() && a.nbytes() > 0 && b.nbytes() > 0 && pa < pb + b.nbytes() && pb < pa + a.nbytes();
  };
  for (std::size_t j = 1; j < items.size(); ++j)
    for (std::size_t i = 0; i < j; ++i)
      for (const auto& [name_j, tj] : state(j))
        for (const auto& [name_i, ti] : state(i))
          QGRAD_CHECK(!overlap(*tj, *ti), op, "items[" + std::to_string(j) + "]." + name_j, "shares memory with items[",
                      i, "].", name_i, ": each tensor needs its own observer state");
  std::vector<Tensor> out(items.size()), masks(items.size());
  std::vector<kernels::ObserveLaunch> launches;
  for (std::size_t i = 0; i < items.size(); ++i) {
    const Tensor& x = items[i].x;
    out[i] = Tensor::empty(x.shape(), like(x, x.dtype()));
    if (any_requires_grad({x})) masks[i] = new_mask(x);
    launches.push_back({{kernels::QuantKernel::fake_quantize, x, out[i], nullptr, mask_words(masks[i]),
                         scopes[i].params(items[i].qmin, items[i].qmax)},
                        observers[i]});
  }
  kernels::observe_fake_quantize_batch(launches);
  for (std::size_t i = 0; i < items.size(); ++i)
    if (masks[i].defined()) detail::record_masked_backward(op, out[i], items[i].x, masks[i]);
  return out;
}

Tensor fake_quantize_learnable_per_tensor(const Tensor& x, const Tensor& scale, const Tensor& zero_point,
                                          std::int64_t qmin, std::int64_t qmax, double grad_factor) {
  const char* op = "fake_quantize_learnable_per_tensor";
  check::floating(x, op, "x");
  return lsq_forward(op, x, scale, zero_point, nullptr, kernels::AxisLayout::of(x.shape(), -1), qmin, qmax,
                     grad_factor);
}

Tensor fake_quantize_learnable_per_channel(const Tensor& x, const Tensor& scale, const Tensor& zero_point,
                                           std::int64_t axis, std::int64_t qmin, std::int64_t qmax,
                                           double grad_factor) {
  const char* op = "fake_quantize_learnable_per_channel";
  check::floating(x, op, "x");
  QGRAD_CHECK(x.dim() >= 1, op, "x", "expected rank >= 1, got a scalar");
  const std::int64_t ax = check::axis(axis, x.dim(), op);
  const Shape shape{x.shape()[static_cast<std::size_t>(ax)]};
  return lsq_forward(op, x, scale, zero_point, &shape, kernels::AxisLayout::of(x.shape(), ax), qmin, qmax,
                     grad_factor);
}

// ---- quantize / dequantize ----
namespace {
// Validates, resolves the scope for the integer dtype's range, runs.
template <class ScopeFn>
Tensor quantize_op(const char* op, const Tensor& x, DType dtype, ScopeFn&& scope) {
  check_quant_input(x, dtype, op);
  return quantize_forward(op, x, scope(quant_min_of(dtype), quant_max_of(dtype), op), dtype);
}
template <class ScopeFn>
Tensor dequantize_op(const char* op, const Tensor& q, DType out_dtype, ScopeFn&& scope) {
  check_dequant_input(q, out_dtype, op);
  return dequantize_forward(op, q, scope(quant_min_of(q.dtype()), quant_max_of(q.dtype()), op), out_dtype);
}
// Dequantize with a scale tensor. When the scale requires grad or is not f32
// (any floating dtype), y = (q - zp) * scale runs through mul, so the scale gets
// dscale = sum of dy * (q - zp) over its broadcast; (q - zp) comes exactly
// from the kernel, and the product is taken in f32 (f64 when the output or
// the scale is f64), then converted: the same values as the kernel path
// except for f64 outputs with an f32 scale (f64 product here).
template <class ScopeFn>
Tensor dequantize_tensor_op(const char* op, const Tensor& q, const Tensor& scale, DType out_dtype, QuantScope qscope,
                            ScopeFn&& scope) {
  check_dequant_input(q, out_dtype, op);
  const I64 lo = quant_min_of(q.dtype()), hi = quant_max_of(q.dtype());
  const bool composite = any_requires_grad({scale}) ||
                         (scale.defined() && is_floating(scale.dtype()) && scale.dtype() != DType::f32);
  if (!composite) return dequantize_forward(op, q, scope(scale, lo, hi, op), out_dtype);
  check::floating(scale, op, "scale");
  Scope sc = scope(scale.detach().to(DType::f32), lo, hi, op);  // validates shape, device, values
  sc.source.scale = nullptr;
  sc.source.scale_value = 1.0f;
  const DType m = out_dtype == DType::f64 || scale.dtype() == DType::f64 ? DType::f64 : DType::f32;
  const ScaleViews v = scale_views(qscope, q, scale);
  Tensor k = dequantize_forward(op, q, sc, m);
  return mul(k.reshape(v.q), scale.to(m).reshape(v.s)).reshape(q.shape()).to(out_dtype);
}
// quantize / dequantize over `scope` with tensor qparams.
Tensor quantize_scope_op(const char* op, const Tensor& x, const Tensor& scale, const Tensor& zero_point,
                         QuantScope scope, DType dtype) {
  return quantize_op(op, x, dtype,
                     [&](I64 lo, I64 hi, const char* o) { return scope_of(scope, x, scale, zero_point, lo, hi, o); });
}
Tensor dequantize_scope_op(const char* op, const Tensor& q, const Tensor& scale, const Tensor& zero_point,
                           QuantScope scope, DType out_dtype) {
  return dequantize_tensor_op(op, q, scale, out_dtype, scope, [&](const Tensor& s, I64 lo, I64 hi, const char* o) {
    return scope_of(scope, q, s, zero_point, lo, hi, o);
  });
}
}  // namespace

Tensor quantize(const Tensor& x, const Tensor& scale, const Tensor& zero_point, QuantScope scope, DType dtype) {
  return quantize_scope_op("quantize", x, scale, zero_point, scope, dtype);
}

Tensor dequantize(const Tensor& q, const Tensor& scale, const Tensor& zero_point, QuantScope scope, DType out_dtype) {
  return dequantize_scope_op("dequantize", q, scale, zero_point, scope, out_dtype);
}

Tensor quantize_per_tensor(const Tensor& x, double scale, std::int64_t zero_point, DType dtype) {
  return quantize_op("quantize_per_tensor", x, dtype,
                     [&](I64 lo, I64 hi, const char* op) { return scalar_scope(scale, zero_point, lo, hi, op); });
}

Tensor quantize_per_tensor(const Tensor& x, const Tensor& scale, const Tensor& zero_point, DType dtype) {
  return quantize_scope_op("quantize_per_tensor", x, scale, zero_point, QuantScope::per_tensor(), dtype);
}

Tensor dequantize_per_tensor(const Tensor& q, double scale, std::int64_t zero_point, DType out_dtype) {
  return dequantize_op("dequantize_per_tensor", q, out_dtype,
                       [&](I64 lo, I64 hi, const char* op) { return scalar_scope(scale, zero_point, lo, hi, op); });
}

Tensor dequantize_per_tensor(const Tensor& q, const Tensor& scale, const Tensor& zero_point, DType out_dtype) {
  return dequantize_scope_op("dequantize_per_tensor", q, scale, zero_point, QuantScope::per_tensor(), out_dtype);
}

Tensor quantize_per_channel(const Tensor& x, const Tensor& scale, const Tensor& zero_point, std::int64_t axis,
                            DType dtype) {
  return quantize_scope_op("quantize_per_channel", x, scale, zero_point, QuantScope::per_channel(axis), dtype);
}

Tensor dequantize_per_channel(const Tensor& q, const Tensor& scale, const Tensor& zero_point, std::int64_t axis,
                              DType out_dtype) {
  return dequantize_scope_op("dequantize_per_channel", q, scale, zero_point, QuantScope::per_channel(axis),
                             out_dtype);
}

// Per token keeps its [N, D] contract (the token scope takes any rank).
Tensor quantize_per_token(const Tensor& x, const Tensor& scale, const Tensor& zero_point, DType dtype) {
  return quantize_op("quantize_per_token", x, dtype, [&](I64 lo, I64 hi, const char* op) {
    check::rank_is(x, 2, op, "x");
    return token_scope(x, scale, zero_point, lo, hi, op);
  });
}

Tensor dequantize_per_token(const Tensor& q, const Tensor& scale, const Tensor& zero_point, DType out_dtype) {
  return dequantize_tensor_op("dequantize_per_token", q, scale, out_dtype, QuantScope::per_token(),
                              [&](const Tensor& s, I64 lo, I64 hi, const char* op) {
                                check::rank_is(q, 2, op, "x");
                                return token_scope(q, s, zero_point, lo, hi, op);
                              });
}

Tensor quantize_per_group(const Tensor& x, const Tensor& scale, const Tensor& zero_point, std::int64_t group_size,
                          DType dtype) {
  return quantize_scope_op("quantize_per_group", x, scale, zero_point, QuantScope::per_group(-1, group_size), dtype);
}

Tensor dequantize_per_group(const Tensor& q, const Tensor& scale, const Tensor& zero_point, std::int64_t group_size,
                            DType out_dtype) {
  return dequantize_scope_op("dequantize_per_group", q, scale, zero_point, QuantScope::per_group(-1, group_size),
                             out_dtype);
}

}  // namespace qgrad
