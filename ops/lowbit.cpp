// Int4 and FP8 quantization ops: validation, forward kernel, saved state and
// backward rule of each op in one place. Formulas: kernels/formulas/lowbit.h
// (FP8, int4 qparams) and kernels/formulas/quantize.h (int4 values, shared
// with the int8 ops).
#include "qgrad/ops/lowbit.h"

#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "qgrad/autograd/node.h"
#include "qgrad/kernels/bitmask.h"
#include "qgrad/kernels/deferred.h"
#include "qgrad/kernels/lowbit.h"
#include "qgrad/kernels/observer.h"
#include "qgrad/kernels/quantize.h"
#include "qgrad/kernels/transformer.h"
#include "qgrad/ops/check.h"
#include "qgrad/ops/straight_through.h"
#include "qgrad/ops/elementwise.h"
#include "qgrad/ops/factory.h"

namespace qgrad {

namespace {

using detail::mask_words;
using detail::new_mask;
using detail::record_masked_backward;

using I64 = std::int64_t;

TensorOptions like(const Tensor& t, DType dtype) { return TensorOptions{}.with_dtype(dtype).with_device(t.device()); }

// How the elements of x split into blocks sharing one scale (and zero point):
// element i is in block layout.channel(i); the qparams have shape `qshape`
// (per tensor: any shape of one element); the blocks' min/max come from the
// observer kernel over `view` around `axis` (< 0: one block).
struct Blocks {
  kernels::AxisLayout layout;
  Shape qshape;
  bool any_one_element = false;  // per tensor: qparams of any shape with one element
  Shape view;
  I64 axis = -1;
  // The broadcast views of the values and the scale (composite dequantize).
  Shape value_view, scale_view;
};

Blocks group_blocks(const Shape& shape, I64 group_size, const char* op) {
  QGRAD_CHECK(!shape.empty(), op, "x", "expected rank >= 1, got a scalar");
  QGRAD_CHECK(group_size > 0, op, "group_size", "must be > 0, got ", group_size);
  const I64 d = shape.back();
  QGRAD_CHECK(d % group_size == 0, op, "group_size", "last dim ", d, " is not a multiple of the group size ",
              group_size);
  const I64 n = shape_numel(shape, op);
  Blocks b;
  b.layout = kernels::AxisLayout{1, n / group_size, group_size};
  b.qshape = shape;
  b.qshape.back() = d / group_size;
  b.view = {n / group_size, group_size};
  b.axis = 0;
  b.value_view = b.qshape;
  b.value_view.push_back(group_size);
  b.scale_view = b.qshape;
  b.scale_view.push_back(1);
  return b;
}

Blocks scope_blocks(const Shape& shape, QuantScope scope, const char* op) {
  const I64 rank = static_cast<I64>(shape.size());
  const I64 n = shape_numel(shape, op);
  Blocks b;
  switch (scope.kind) {
    case QuantScope::tensor:
      b.layout = kernels::AxisLayout{1, 1, n};
      b.any_one_element = true;
      b.view = shape;
      b.axis = -1;
      b.value_view = shape;
      b.scale_view = {};
      return b;
    case QuantScope::channel: {
      QGRAD_CHECK(rank >= 1, op, "x", "expected rank >= 1, got a scalar");
      const I64 ax = check::axis(scope.axis, rank, op);
      b.layout = kernels::AxisLayout::of(shape, ax);
      b.qshape = {shape[static_cast<std::size_t>(ax)]};
      b.view = shape;
      b.axis = ax;
      b.value_view = shape;
      b.scale_view = Shape(static_cast<std::size_t>(rank - ax), 1);
      b.scale_view[0] = b.qshape[0];
      return b;
    }
    case QuantScope::token: {
      QGRAD_CHECK(rank >= 1, op, "x", "expected rank >= 1, got a scalar");
      const I64 d = shape.back();
      const Shape rows(shape.begin(), shape.end() - 1);
      const I64 r = shape_numel(rows, op);
      b.layout = kernels::AxisLayout{1, r, d};
      b.qshape = rows;
      b.view = {r, d};
      b.axis = 0;
      b.value_view = shape;
      b.scale_view = rows;
      b.scale_view.push_back(1);
      return b;
    }
    case QuantScope::group: {
      QGRAD_CHECK(rank >= 1, op, "x", "expected rank >= 1, got a scalar");
      const I64 ax = check::axis(scope.axis, rank, op);
      QGRAD_CHECK(ax == rank - 1, op, "scope", "per_group runs along the last axis (", rank - 1, "), got axis ",
                  scope.axis);
      return group_blocks(shape, scope.group_size, op);
    }
  }
  throw Error(op, "scope", "unknown scope kind " + std::to_string(static_cast<int>(scope.kind)));
}

// Per-block min and max (f32 [C]) of x on its device, by the observer kernel.
void block_minmax(const Tensor& x, const Blocks& b, Tensor& mn, Tensor& mx) {
  mn = full({b.layout.channels}, INFINITY, like(x, DType::f32));
  mx = full({b.layout.channels}, -INFINITY, like(x, DType::f32));
  if (x.numel() > 0) kernels::observer_minmax(x.detach().reshape(b.view), mn, mx, b.axis, -1.0);
}

void check_qparam_shape(const Tensor& t, const Blocks& b, const char* op, const char* arg) {
  if (b.any_one_element)
    QGRAD_CHECK(t.numel() == 1, op, arg, "expected one element, got shape ", shape_str(t.shape()));
  else
    QGRAD_CHECK(t.shape() == b.qshape, op, arg, "expected shape ", shape_str(b.qshape), ", got ", shape_str(t.shape()));
}

// A given scale: floating (f32 for the kernel path) of the blocks' shape on
// `ref`'s device; CPU-resident values finite and > 0 with a finite
// reciprocal (CUDA-resident values are not read: that would need a sync).
void check_scale(const Tensor& scale, const Tensor& ref, const Blocks& b, const char* op, bool f32_only) {
  if (f32_only) check::dtype_is(scale, DType::f32, op, "scale");
  else check::floating(scale, op, "scale");
  check::same_device(scale, ref, op, "scale");
  check_qparam_shape(scale, b, op, "scale");
  if (!scale.is_cuda())
    for (double s : scale.detach().to(DType::f64).to_vector<double>()) {
      const auto f = static_cast<float>(s);
      QGRAD_CHECK(std::isfinite(s) && s > 0 && std::isfinite(f) && f > 0 && std::isfinite(1.0f / f), op, "scale",
                  "must be a finite positive f32 with a finite reciprocal, got ", s);
    }
}

// ---- int4 ----

struct Int4Range {
  int qmin, qmax;
};
Int4Range int4_range(DType qtype, const char* op, const char* arg) {
  QGRAD_CHECK(is_packed_int4(qtype), op, arg, "expected s4 or u4, got ", dtype_name(qtype));
  return qtype == DType::s4 ? Int4Range{-8, 7} : Int4Range{0, 15};
}

void check_zero_point(const Tensor& zp, const Tensor& ref, const Blocks& b, Int4Range r, const char* op) {
  check::dtype_is(zp, DType::s32, op, "zero_point");
  check::same_device(zp, ref, op, "zero_point");
  check_qparam_shape(zp, b, op, "zero_point");
  if (!zp.is_cuda())
    for (std::int32_t z : zp.to_vector<std::int32_t>())
      QGRAD_CHECK(z >= r.qmin && z <= r.qmax, op, "zero_point", "must lie in [", r.qmin, ", ", r.qmax, "], got ", z);
}

void check_even_last_dim(const Shape& shape, const char* op, const char* arg) {
  QGRAD_CHECK(shape.back() % 2 == 0, op, arg, "packed int4 needs an even last dimension (whole bytes per row), got ",
              shape_str(shape));
}

// The smallest normal of x's dtype (torchao's default eps), f32's for f64.
float int4_eps(DType dt) { return dt == DType::f16 ? 6.103515625e-05f : std::numeric_limits<float>::min(); }

kernels::QuantParams int4_params(const Blocks& b, const Tensor& scale, const Tensor& zp, Int4Range r) {
  kernels::QuantParams p;
  p.layout = b.layout;
  p.source.scale = static_cast<const float*>(scale.data_ptr());
  p.source.zp = static_cast<const std::int32_t*>(zp.data_ptr());
  p.qmin = r.qmin;
  p.qmax = r.qmax;
  p.product_in_f64 = false;  // torchao: (q - zp) * scale in f32
  return p;
}

Int4Qparams int4_qparams(const Tensor& x, const Blocks& b, QuantMode mode, Int4Range r) {
  Tensor mn, mx;
  block_minmax(x, b, mn, mx);
  Int4Qparams q{Tensor::empty(b.qshape, like(x, DType::f32)), Tensor::empty(b.qshape, like(x, DType::s32))};
  kernels::int4_qparams(mn, mx, q.scale, q.zero_point, r.qmin, r.qmax, mode == QuantMode::symmetric,
                        int4_eps(x.dtype()));
  return q;
}



// Fake quantize with validated qparams: the int8 ops' kernel (formulas::
// FakeQuantOp, f32 product), straight-through backward over the saved mask.
Tensor int4_fake_quant(const char* op, const Tensor& x, const Blocks& b, const Tensor& scale, const Tensor& zp,
                       Int4Range r) {
  Tensor out = Tensor::empty(x.shape(), like(x, x.dtype()));
  const bool need = any_requires_grad({x});
  Tensor mask = need ? new_mask(x) : Tensor();
  if (x.numel() > 0) kernels::fake_quantize(x, out, int4_params(b, scale, zp, r), mask_words(mask));
  if (need) record_masked_backward(op, out, x, mask);
  return out;
}

// ---- FP8 ----

DType check_fp8(DType fp8, const char* op, const char* arg) {
  QGRAD_CHECK(is_fp8(fp8), op, arg, "expected f8e4m3 or f8e5m2, got ", dtype_name(fp8));
  return fp8;
}

// FP8 needs FP8 tensor cores on a GPU (compute capability 8.9: Ada, Hopper
// and later); the ops refuse older GPUs rather than emulate what their
// inference counterparts cannot run.
void check_fp8_device(const Tensor& t, const char* op) {
  if (!t.is_cuda()) return;
  const int cc = cuda_compute_capability(t.device().index);
  QGRAD_CHECK(cc >= 89, op, "device", "FP8 needs a GPU with FP8 tensor cores (compute capability >= 8.9); ",
              t.device().str(), " has ", cc / 10, ".", cc % 10);
}

Tensor fp8_scale_of(const Tensor& x, const Blocks& b, DType fp8) {
  Tensor mn, mx;
  block_minmax(x, b, mn, mx);
  Tensor scale = Tensor::empty(b.any_one_element ? Shape{} : b.qshape, like(x, DType::f32));
  kernels::fp8_scale(mn, mx, scale, fp8);
  return scale;
}

Tensor fp8_fake_quant(const char* op, const Tensor& x, const Blocks& b, const Tensor& scale, DType fp8) {
  Tensor out = Tensor::empty(x.shape(), like(x, x.dtype()));
  if (x.numel() > 0) kernels::fp8_fake_quantize(x, out, scale.detach(), b.layout, fp8);
  if (any_requires_grad({x}))
    record(op, out, {x}, [](const Tensor& g) { return std::vector<Tensor>{g}; });
  return out;
}

// The composite dequantize for a scale that requires grad (or is not f32):
// k = (q - zp) exactly from the kernel with unit scales, times the scale
// through the broadcasting mul in M (f64 when the output or the scale is,
// else f32), then converted: dscale = sum of dy * k over each block.
Tensor composite_dequant(const Tensor& q, const Tensor& scale, const Blocks& b, DType out_dtype,
                         const std::function<Tensor(const Tensor& ones, DType m)>& unit) {
  const DType m = (out_dtype == DType::f64 || scale.dtype() == DType::f64) ? DType::f64 : DType::f32;
  Tensor ones_f32 = ones(b.any_one_element ? Shape{} : b.qshape, like(q, DType::f32));
  Tensor k = unit(ones_f32, m);
  Tensor y = mul(k.reshape(b.value_view), scale.to(m).reshape(b.scale_view)).reshape(q.shape());
  return y.to(out_dtype);
}

}  // namespace

// ---- int4 ----

Int4Qparams choose_qparams_int4(const Tensor& x, std::int64_t group_size, QuantMode mode, DType qtype) {
  const char* op = "choose_qparams_int4";
  check::floating(x, op, "x");
  const Int4Range r = int4_range(qtype, op, "qtype");
  check::quant_mode(mode, op);
  const Blocks b = group_blocks(x.shape(), group_size, op);
  return int4_qparams(x, b, mode, r);
}

Tensor fake_quantize_int4(const Tensor& x, std::int64_t group_size, QuantMode mode, DType qtype) {
  const char* op = "fake_quantize_int4";
  check::floating(x, op, "x");
  const Int4Range r = int4_range(qtype, op, "qtype");
  check::quant_mode(mode, op);
  const Blocks b = group_blocks(x.shape(), group_size, op);
  const Int4Qparams q = int4_qparams(x, b, mode, r);
  return int4_fake_quant(op, x, b, q.scale, q.zero_point, r);
}

Tensor fake_quantize_int4(const Tensor& x, const Tensor& scale, const Tensor& zero_point, std::int64_t group_size,
                          DType qtype) {
  const char* op = "fake_quantize_int4";
  check::floating(x, op, "x");
  const Int4Range r = int4_range(qtype, op, "qtype");
  const Blocks b = group_blocks(x.shape(), group_size, op);
  check_scale(scale, x, b, op, true);
  check_zero_point(zero_point, x, b, r, op);
  return int4_fake_quant(op, x, b, scale.detach(), zero_point.detach(), r);
}

Tensor quantize_int4(const Tensor& x, const Tensor& scale, const Tensor& zero_point, std::int64_t group_size,
                     DType qtype) {
  const char* op = "quantize_int4";
  check::floating(x, op, "x");
  const Int4Range r = int4_range(qtype, op, "qtype");
  const Blocks b = group_blocks(x.shape(), group_size, op);
  check_even_last_dim(x.shape(), op, "x");
  check_scale(scale, x, b, op, true);
  check_zero_point(zero_point, x, b, r, op);
  const Tensor s = scale.detach(), z = zero_point.detach();
  Tensor out = Tensor::empty(x.shape(), like(x, qtype));
  const bool need = any_requires_grad({x});
  Tensor mask = need ? new_mask(x) : Tensor();
  if (x.numel() > 0) kernels::int4_quantize(x, out, s, z, group_size, mask_words(mask));
  if (need) {
    const DType xd = x.dtype();
    record(
        op, out, {x},
        [mask, s, z, b, r, xd](const Tensor& g) {
          Tensor gx = g.dtype() == xd ? g : g.to(xd);
          Tensor dx = Tensor::empty(gx.shape(), like(gx, xd));
          kernels::quantize_backward(gx, dx, int4_params(b, s, z, r), mask_words(mask));
          return std::vector<Tensor>{dx};
        },
        mask.nbytes() + s.nbytes() + z.nbytes(), xd, true);
  }
  return out;
}

Tensor dequantize_int4(const Tensor& q, const Tensor& scale, const Tensor& zero_point, std::int64_t group_size,
                       DType out_dtype) {
  const char* op = "dequantize_int4";
  check::defined(q, op, "q");
  const Int4Range r = int4_range(q.dtype(), op, "q");
  QGRAD_CHECK(is_floating(out_dtype), op, "out_dtype", "expected a floating dtype, got ", dtype_name(out_dtype));
  const Blocks b = group_blocks(q.shape(), group_size, op);
  check_even_last_dim(q.shape(), op, "q");
  const bool composite = scale.defined() && (scale.requires_grad() || scale.dtype() != DType::f32);
  check_scale(scale, q, b, op, !composite);
  check_zero_point(zero_point, q, b, r, op);
  if (composite)
    return composite_dequant(q, scale, b, out_dtype, [&](const Tensor& unit, DType m) {
      return dequantize_int4(q, unit, zero_point, group_size, m);
    });
  const Tensor s = scale.detach(), z = zero_point.detach();
  Tensor out = Tensor::empty(q.shape(), like(q, out_dtype));
  if (q.numel() > 0) kernels::int4_dequantize(q, out, s, z, group_size);
  if (any_requires_grad({q}))
    record(
        op, out, {q},
        [s, z, b, r](const Tensor& g) {
          Tensor dq = Tensor::empty(g.shape(), like(g, g.dtype()));
          kernels::dequantize_backward(g, dq, int4_params(b, s, z, r));
          return std::vector<Tensor>{dq};
        },
        s.nbytes() + z.nbytes());
  return out;
}

// ---- FP8 ----

Tensor fp8_scale(const Tensor& x, QuantScope scope, DType fp8) {
  const char* op = "fp8_scale";
  check::floating(x, op, "x");
  check_fp8(fp8, op, "fp8");
  const Blocks b = scope_blocks(x.shape(), scope, op);
  check_fp8_device(x, op);
  return fp8_scale_of(x, b, fp8);
}

Tensor fake_quantize_fp8(const Tensor& x, QuantScope scope, DType fp8) {
  const char* op = "fake_quantize_fp8";
  check::floating(x, op, "x");
  check_fp8(fp8, op, "fp8");
  const Blocks b = scope_blocks(x.shape(), scope, op);
  check_fp8_device(x, op);
  return fp8_fake_quant(op, x, b, fp8_scale_of(x, b, fp8), fp8);
}

Tensor fake_quantize_fp8(const Tensor& x, const Tensor& scale, QuantScope scope, DType fp8) {
  const char* op = "fake_quantize_fp8";
  check::floating(x, op, "x");
  check_fp8(fp8, op, "fp8");
  const Blocks b = scope_blocks(x.shape(), scope, op);
  check_scale(scale, x, b, op, true);
  check_fp8_device(x, op);
  return fp8_fake_quant(op, x, b, scale, fp8);
}

Tensor quantize_fp8(const Tensor& x, const Tensor& scale, QuantScope scope, DType fp8) {
  const char* op = "quantize_fp8";
  check::floating(x, op, "x");
  check_fp8(fp8, op, "fp8");
  const Blocks b = scope_blocks(x.shape(), scope, op);
  check_scale(scale, x, b, op, true);
  check_fp8_device(x, op);
  const Tensor s = scale.detach();
  Tensor out = Tensor::empty(x.shape(), like(x, fp8));
  if (x.numel() > 0) kernels::fp8_quantize(x, out, s, b.layout);
  if (any_requires_grad({x})) {
    const DType xd = x.dtype();
    record(
        op, out, {x},
        [s, b, xd](const Tensor& g) {
          Tensor gx = g.dtype() == xd ? g : g.to(xd);
          Tensor dx = Tensor::empty(gx.shape(), like(gx, xd));
          kernels::fp8_scale_grad(gx, dx, s, b.layout, true);
          return std::vector<Tensor>{dx};
        },
        s.nbytes(), xd, true);
  }
  return out;
}

Tensor dequantize_fp8(const Tensor& q, const Tensor& scale, QuantScope scope, DType out_dtype) {
  const char* op = "dequantize_fp8";
  check::defined(q, op, "q");
  check_fp8(q.dtype(), op, "q");
  QGRAD_CHECK(is_floating(out_dtype), op, "out_dtype", "expected a floating dtype, got ", dtype_name(out_dtype));
  const Blocks b = scope_blocks(q.shape(), scope, op);
  const bool composite = scale.defined() && (scale.requires_grad() || scale.dtype() != DType::f32);
  check_scale(scale, q, b, op, !composite);
  check_fp8_device(q, op);
  if (composite)
    return composite_dequant(q, scale, b, out_dtype,
                             [&](const Tensor& unit, DType m) { return dequantize_fp8(q, unit, scope, m); });
  const Tensor s = scale.detach();
  Tensor out = Tensor::empty(q.shape(), like(q, out_dtype));
  if (q.numel() > 0) kernels::fp8_dequantize(q, out, s, b.layout);
  if (any_requires_grad({q}))
    record(
        op, out, {q},
        [s, b](const Tensor& g) {
          Tensor dq = Tensor::empty(g.shape(), like(g, g.dtype()));
          kernels::fp8_scale_grad(g, dq, s, b.layout, false);
          return std::vector<Tensor>{dq};
        },
        s.nbytes());
  return out;
}

// ---- affine qparams ----

namespace {
// choose_qparams_affine's arguments; returns eps as the f32 the formulas use.
float check_affine_args(const Tensor& x, QuantMode mode, std::int64_t qmin, std::int64_t qmax, double eps,
                        const char* op) {
  check::floating(x, op, "x");
  check::quant_mode(mode, op);
  return check::affine_range(qmin, qmax, eps, op);
}
}  // namespace

AffineQparams choose_qparams_affine(const Tensor& x, QuantScope scope, QuantMode mode, std::int64_t qmin,
                                    std::int64_t qmax, double eps) {
  const char* op = "choose_qparams_affine";
  const float e = check_affine_args(x, mode, qmin, qmax, eps, op);
  const Blocks b = scope_blocks(x.shape(), scope, op);
  Tensor mn, mx;
  block_minmax(x, b, mn, mx);
  const Shape qshape = b.any_one_element ? Shape{} : b.qshape;
  AffineQparams q{Tensor::empty(qshape, like(x, DType::f32)), Tensor::empty(qshape, like(x, DType::s32))};
  kernels::int4_qparams(mn, mx, q.scale, q.zero_point, static_cast<int>(qmin), static_cast<int>(qmax),
                        mode == QuantMode::symmetric, e);
  return q;
}

namespace {
// fake_quantize_dynamic's CUDA row kernel over prologue(x), when it applies
// (rows of per-token scope, or of channels on axis 0, of the kernel's
// lengths; not f64): the output, and the mask in *mask when x requires grad.
// Undefined where it does not apply (nothing written).
Tensor dynamic_rows(const Tensor& x, const Blocks& b, QuantScope scope, QuantMode mode, std::int64_t qmin,
                    std::int64_t qmax, float eps, kernels::RowPrologue prologue, Tensor* mask) {
  const bool rows = scope.kind == QuantScope::token || (scope.kind == QuantScope::channel && b.axis == 0);
  if (!x.is_cuda() || !rows || x.numel() == 0 || x.dtype() == DType::f64) return Tensor();
  const I64 row_len = scope.kind == QuantScope::token ? x.shape().back() : x.numel() / x.shape().front();
  Tensor out = Tensor::empty(x.shape(), like(x, x.dtype()));
  Tensor m = any_requires_grad({x}) ? new_mask(x) : Tensor();
  if (!kernels::fake_quantize_dynamic_rows(x, out, mask_words(m), row_len, static_cast<int>(qmin),
                                           static_cast<int>(qmax), mode == QuantMode::symmetric, eps, prologue))
    return Tensor();
  *mask = m;
  return out;
}
}  // namespace

Tensor fake_quantize_dynamic(const Tensor& x, QuantScope scope, QuantMode mode, std::int64_t qmin, std::int64_t qmax,
                             double eps) {
  const char* op = "fake_quantize_dynamic";
  const float e = check_affine_args(x, mode, qmin, qmax, eps, op);
  const Blocks b = scope_blocks(x.shape(), scope, op);
  Tensor mask;
  Tensor out = dynamic_rows(x, b, scope, mode, qmin, qmax, e, kernels::RowPrologue::none, &mask);
  if (out.defined()) {
    if (mask.defined()) record_masked_backward(op, out, x, mask);
    return out;
  }
  const AffineQparams q = choose_qparams_affine(x.detach(), scope, mode, qmin, qmax, eps);
  return detail::fake_quantize_computed_qparams(op, x, q.scale, q.zero_point, scope, qmin, qmax);
}

std::vector<Tensor> fake_quantize_dynamic_batch(const std::vector<Tensor>& xs, QuantScope scope, QuantMode mode,
                                                std::int64_t qmin, std::int64_t qmax, double eps,
                                                std::optional<DType> out_dtype) {
  const char* op = "fake_quantize_dynamic_batch";
  QGRAD_CHECK(!xs.empty(), op, "xs", "expected at least one tensor");
  QGRAD_CHECK(!out_dtype || is_floating(*out_dtype), op, "out_dtype", "expected a floating dtype, got ",
              dtype_name(*out_dtype));
  check::quant_mode(mode, op);
  const float e = check::affine_range(qmin, qmax, eps, op);
  // Each tensor as fake_quantize_dynamic checks it, the error naming xs[i].
  std::vector<Blocks> blocks;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const std::string arg = "xs[" + std::to_string(i) + "]";
    check::floating(xs[i], op, arg.c_str());
    check::item(
        op, [&] { blocks.push_back(scope_blocks(xs[i].shape(), scope, op)); },
        [&](const std::string& a) { return a == "x" ? arg : a; });
  }
  // The tensors the row kernel may take, grouped by device, dtype and row length.
  const bool row_scope = scope.kind == QuantScope::token || scope.kind == QuantScope::channel;
  std::map<std::tuple<int, int, I64>, std::vector<std::size_t>> groups;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const Tensor& x = xs[i];
    const bool rows = scope.kind == QuantScope::token || blocks[i].axis == 0;
    if (!row_scope || !rows || !x.is_cuda() || x.numel() == 0 || x.dtype() == DType::f64) continue;
    const I64 row_len = scope.kind == QuantScope::token ? x.shape().back() : x.numel() / x.shape().front();
    groups[{x.device().index, static_cast<int>(x.dtype()), row_len}].push_back(i);
  }
  std::vector<Tensor> out(xs.size()), masks(xs.size());
  for (const auto& [key, members] : groups) {
    std::vector<kernels::RowsBatchItem> items;
    for (const std::size_t i : members) {
      out[i] = Tensor::empty(xs[i].shape(), like(xs[i], xs[i].dtype()));
      if (any_requires_grad({xs[i]})) masks[i] = new_mask(xs[i]);
      items.push_back({xs[i], out[i], mask_words(masks[i])});
    }
    if (!kernels::fake_quantize_dynamic_rows_batch(items, std::get<2>(key), static_cast<int>(qmin),
                                                   static_cast<int>(qmax), mode == QuantMode::symmetric, e))
      for (const std::size_t i : members) out[i] = masks[i] = Tensor();  // left to fake_quantize_dynamic below
  }
  // The outputs cast to out_dtype in one launch a device (to_batch's queue);
  // a row-kernel output whose gradient casts back exactly takes the cast into
  // its own node (the mask pass reads the gradient in out_dtype). to_batch
  // casts the others (its own cast nodes) and leaves these as they are.
  kernels::DeferredPasses casts;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    if (!out[i].defined()) {
      out[i] = fake_quantize_dynamic(xs[i], scope, mode, qmin, qmax, eps);
      continue;
    }
    if (out_dtype && *out_dtype != out[i].dtype() &&
        kernels::masked_gradient_exact_cast(*out_dtype, xs[i].dtype())) {
      Tensor cast = Tensor::empty(out[i].shape(), like(out[i], *out_dtype));
      casts.cast(out[i], cast);
      out[i] = cast;
    }
    if (masks[i].defined()) record_masked_backward(op, out[i], xs[i], masks[i]);
  }
  casts.flush();
  return out_dtype ? to_batch(out, *out_dtype) : out;
}

Tensor gelu_fake_quantize_dynamic(const Tensor& x, GeluApproximate approximate, QuantScope scope, QuantMode mode,
                                  std::int64_t qmin, std::int64_t qmax, double eps) {
  const char* op = "gelu_fake_quantize_dynamic";
  const float e = check_affine_args(x, mode, qmin, qmax, eps, op);
  QGRAD_CHECK(approximate == GeluApproximate::none || approximate == GeluApproximate::tanh, op, "approximate",
              "expected none or tanh");
  const Blocks b = scope_blocks(x.shape(), scope, op);
  const bool tanh = approximate == GeluApproximate::tanh;
  Tensor mask;
  Tensor out = dynamic_rows(x, b, scope, mode, qmin, qmax, e,
                            tanh ? kernels::RowPrologue::gelu_tanh : kernels::RowPrologue::gelu, &mask);
  if (!out.defined()) return fake_quantize_dynamic(gelu(x, approximate), scope, mode, qmin, qmax, eps);
  if (mask.defined())
    record(
        op, out, {x},
        [sx = x.detach(), mask, tanh](const Tensor& g) {
          Tensor dx = Tensor::empty(g.shape(), like(g, g.dtype()));
          kernels::gelu_backward(g, sx, dx, tanh, mask_words(mask));
          return std::vector<Tensor>{dx};
        },
        x.nbytes() + mask.nbytes());
  return out;
}

}  // namespace qgrad
