// max_pool2d, avg_pool2d, adaptive_avg_pool2d, batch_norm, flatten:
// validation, forward, saved state and backward.
#include "qgrad/ops/pool_norm.h"

#include <cmath>
#include <tuple>
#include <utility>

#include "qgrad/autograd/node.h"
#include "qgrad/kernels/batch_norm.h"
#include "qgrad/kernels/binary.h"
#include "qgrad/kernels/observer.h"
#include "qgrad/kernels/pool.h"
#include "qgrad/ops/check.h"
#include "qgrad/ops/elementwise.h"
#include "qgrad/ops/quantize.h"

namespace qgrad {

using kernels::AxisLayout;
using kernels::Pool2dGeometry;

namespace {

TensorOptions like(const Tensor& t, DType dtype) { return TensorOptions{}.with_dtype(dtype).with_device(t.device()); }

// Sizes, strides and paddings are kept below 2^31 so that no window
// arithmetic can overflow.
constexpr std::int64_t kMaxSize = std::int64_t(1) << 31;

bool in_range(Size2 s, std::int64_t lo) { return s.h >= lo && s.w >= lo && s.h < kMaxSize && s.w < kMaxSize; }

// x [N, C, H, W], floating or (the forward-only integer poolings) s8 / u8,
// non-empty.
void check_nchw(const char* op, const Tensor& x) {
  check::defined(x, op, "x");
  QGRAD_CHECK(is_floating(x.dtype()) || x.dtype() == DType::s8 || x.dtype() == DType::u8, op, "x",
              "expected a floating dtype (f32, f64, f16, bf16) or s8 / u8, got ", dtype_name(x.dtype()));
  QGRAD_CHECK(x.dim() == 4, op, "x", "expected rank 4 [N, C, H, W], got shape ", shape_str(x.shape()));
  check::non_empty(x, op, "x");
}

// PyTorch's pooling_output_shape for an input that holds the (dilated)
// kernel: floor or ceil of (in + 2p - span) / s, plus one, less a last
// window that would start in the right padding.
std::int64_t pool_output_size(std::int64_t in, std::int64_t span, std::int64_t s, std::int64_t p, bool ceil_mode) {
  std::int64_t out = (in + 2 * p - span + (ceil_mode ? s - 1 : 0)) / s + 1;
  if (ceil_mode && (out - 1) * s >= in + p) --out;
  return out;
}

// The geometry of max_pool2d / avg_pool2d, every argument checked.
Pool2dGeometry pool_geometry(const char* op, const Tensor& x, Size2 k, std::optional<Size2> stride, Size2 pad,
                             Size2 dil, bool ceil_mode) {
  check_nchw(op, x);
  const Size2 s = stride.value_or(k);
  QGRAD_CHECK(in_range(k, 1), op, "kernel_size", "must be in [1, 2^31), got (", k.h, ", ", k.w, ")");
  QGRAD_CHECK(in_range(s, 1), op, "stride", "must be in [1, 2^31), got (", s.h, ", ", s.w, ")");
  QGRAD_CHECK(in_range(dil, 1), op, "dilation", "must be in [1, 2^31), got (", dil.h, ", ", dil.w, ")");
  QGRAD_CHECK(pad.h >= 0 && pad.w >= 0 && pad.h <= k.h / 2 && pad.w <= k.w / 2, op, "padding",
              "must be in [0, kernel_size / 2], got (", pad.h, ", ", pad.w, ") for kernel_size (", k.h, ", ", k.w,
              ")");
  Pool2dGeometry g;
  g.planes = x.size(0) * x.size(1);
  g.ih = x.size(2);
  g.iw = x.size(3);
  const std::int64_t span_h = dil.h * (k.h - 1) + 1, span_w = dil.w * (k.w - 1) + 1;
  QGRAD_CHECK(span_h <= g.ih + 2 * pad.h && span_w <= g.iw + 2 * pad.w, op, "kernel_size", "the kernel spans (",
              span_h, ", ", span_w, ") but the padded input is only (", g.ih + 2 * pad.h, ", ", g.iw + 2 * pad.w,
              "): the output would be empty");
  g.oh = pool_output_size(g.ih, span_h, s.h, pad.h, ceil_mode);
  g.ow = pool_output_size(g.iw, span_w, s.w, pad.w, ceil_mode);
  QGRAD_CHECK(g.oh >= 1 && g.ow >= 1, op, "x", "zero-size output (", g.oh, ", ", g.ow, ")");
  g.kh = k.h;
  g.kw = k.w;
  g.sh = s.h;
  g.sw = s.w;
  g.ph = pad.h;
  g.pw = pad.w;
  g.dh = dil.h;
  g.dw = dil.w;
  return g;
}

Shape pooled_shape(const Tensor& x, const Pool2dGeometry& g) { return {x.size(0), x.size(1), g.oh, g.ow}; }

// The shared body of max_pool2d and max_pool2d_with_indices. Saves the s64
// indices (8 bytes per output), not x; backward gathers dy through them.
MaxPool2dResult max_pool(const char* op, const Tensor& x, Size2 k, std::optional<Size2> stride, Size2 pad, Size2 dil,
                         bool ceil_mode, bool want_indices) {
  const Pool2dGeometry g = pool_geometry(op, x, k, stride, pad, dil, ceil_mode);
  const bool grad = any_requires_grad({x});
  Tensor out = Tensor::empty(pooled_shape(x, g), like(x, x.dtype()));
  Tensor indices = want_indices || grad ? Tensor::empty(out.shape(), like(x, DType::s64)) : Tensor();
  kernels::max_pool2d(x, out, indices, g);
  if (grad)
    record(op, out, {x}, [indices, g, shape = x.shape()](const Tensor& dy) {
      Tensor dx = Tensor::empty(shape, like(dy, dy.dtype()));
      kernels::max_pool2d_backward(dy, indices, dx, g);
      return std::vector<Tensor>{dx};
    }, indices.nbytes());
  return {out, want_indices ? indices : Tensor()};
}

}  // namespace

Tensor fake_quantize_max_pool2d(const Tensor& x, const Tensor& scale, const Tensor& zero_point, std::int64_t qmin,
                                std::int64_t qmax, Size2 kernel_size, std::optional<Size2> stride, Size2 padding,
                                Size2 dilation, bool ceil_mode) {
  const char* op = "fake_quantize_max_pool2d";
  check::floating(x, op, "x");
  check::per_tensor_qparams(x, scale, zero_point, qmin, qmax, op);
  const Pool2dGeometry g = pool_geometry(op, x, kernel_size, stride, padding, dilation, ceil_mode);
  QGRAD_CHECK(g.ih * g.iw < (std::int64_t{1} << 31), op, "x", "planes of 2^31 or more elements are not supported, got ",
              g.ih, " x ", g.iw);
  Tensor out = Tensor::empty(pooled_shape(x, g), like(x, x.dtype()));
  Tensor codes = Tensor::empty(out.shape(), like(x, DType::s32));
  const formulas::ParamSource p{scale.data<float>(), zero_point.data<std::int32_t>()};
  kernels::fake_quantize_max_pool2d(x, out, codes, p, qmin, qmax, g);
  if (any_requires_grad({x}))
    record(op, out, {x}, [codes, g, shape = x.shape()](const Tensor& dy) {
      Tensor dx = Tensor::empty(shape, like(dy, dy.dtype()));
      kernels::fake_quantize_max_pool2d_backward(dy, codes, dx, g);
      return std::vector<Tensor>{dx};
    }, codes.nbytes());
  return out;
}

Tensor max_pool2d(const Tensor& x, Size2 kernel_size, std::optional<Size2> stride, Size2 padding, Size2 dilation,
                  bool ceil_mode) {
  return max_pool("max_pool2d", x, kernel_size, stride, padding, dilation, ceil_mode, false).output;
}

MaxPool2dResult max_pool2d_with_indices(const Tensor& x, Size2 kernel_size, std::optional<Size2> stride,
                                        Size2 padding, Size2 dilation, bool ceil_mode) {
  return max_pool("max_pool2d_with_indices", x, kernel_size, stride, padding, dilation, ceil_mode, true);
}

// Saves nothing but the geometry; backward gathers dy / divisor per input.
Tensor avg_pool2d(const Tensor& x, Size2 kernel_size, std::optional<Size2> stride, Size2 padding, bool ceil_mode,
                  bool count_include_pad) {
  constexpr const char* op = "avg_pool2d";
  const Pool2dGeometry g = pool_geometry(op, x, kernel_size, stride, padding, 1, ceil_mode);
  Tensor out = Tensor::empty(pooled_shape(x, g), like(x, x.dtype()));
  kernels::avg_pool2d(x, out, g, count_include_pad);
  if (any_requires_grad({x}))
    record(op, out, {x}, [g, count_include_pad, shape = x.shape()](const Tensor& dy) {
      Tensor dx = Tensor::empty(shape, like(dy, dy.dtype()));
      kernels::avg_pool2d_backward(dy, dx, g, count_include_pad);
      return std::vector<Tensor>{dx};
    });
  return out;
}

// Saves nothing but the geometry.
Tensor adaptive_avg_pool2d(const Tensor& x, Size2 output_size) {
  constexpr const char* op = "adaptive_avg_pool2d";
  check_nchw(op, x);
  QGRAD_CHECK(in_range(output_size, 1), op, "output_size", "must be in [1, 2^31), got (", output_size.h, ", ",
              output_size.w, ")");
  Pool2dGeometry g;
  g.planes = x.size(0) * x.size(1);
  g.ih = x.size(2);
  g.iw = x.size(3);
  g.oh = output_size.h;
  g.ow = output_size.w;
  Tensor out = Tensor::empty(pooled_shape(x, g), like(x, x.dtype()));
  kernels::adaptive_avg_pool2d(x, out, g);
  if (any_requires_grad({x}))
    record(op, out, {x}, [g, shape = x.shape()](const Tensor& dy) {
      Tensor dx = Tensor::empty(shape, like(dy, dy.dtype()));
      kernels::adaptive_avg_pool2d_backward(dy, dx, g);
      return std::vector<Tensor>{dx};
    });
  return out;
}

namespace {

// An optional per-channel tensor of batch_norm: undefined, or [C] of x's
// dtype and device.
void check_channel_tensor(const Tensor& t, const Tensor& x, const char* arg, const char* op = "batch_norm") {
  if (!t.defined()) return;
  check::floating(t, op, arg);
  check::same_dtype(t, x, op, arg);
  check::same_device(t, x, op, arg);
  QGRAD_CHECK(t.dim() == 1 && t.size(0) == x.size(1), op, arg, "expected shape [", x.size(1), "] (x's channels), got ",
              shape_str(t.shape()));
}

}  // namespace

Tensor batch_norm_scale_factor(const Tensor& weight, const Tensor& running_var, double eps) {
  constexpr const char* op = "batch_norm_scale_factor";
  check::floating(weight, op, "weight");
  check::floating(running_var, op, "running_var");
  check::same_dtype(running_var, weight, op, "running_var");
  check::same_device(running_var, weight, op, "running_var");
  QGRAD_CHECK(running_var.shape() == weight.shape(), op, "running_var", "expected weight's shape ",
              shape_str(weight.shape()), ", got ", shape_str(running_var.shape()));
  QGRAD_CHECK(std::isfinite(eps) && eps >= 0.0, op, "eps", "must be finite and >= 0, got ", eps);
  if (any_requires_grad({running_var})) return div(weight, ::qgrad::sqrt(add(running_var, eps)));
  Tensor f = Tensor::empty(weight.shape(), like(weight, weight.dtype()));
  Tensor std_dev = Tensor::empty(weight.shape(), like(weight, weight.dtype()));
  kernels::batch_norm_scale_factor(weight, running_var, eps, f, std_dev);
  // div's rule for its numerator: g / std (std saved: the batch norm that
  // follows moves running_var in place).
  if (any_requires_grad({weight}))
    record(op, f, {weight}, [std_dev](const Tensor& g) { return std::vector<Tensor>{div(g, std_dev)}; },
           std_dev.nbytes());
  return f;
}

// Saves scale (detached), and x (detached) when scale needs grad.
// The rule folds a gradient already pending for scale (a folded Conv-BN's
// scale factor is also the batch norm's divisor, whose gradient arrives
// first) into its own in the pass that writes it.
Tensor channel_mul(const Tensor& x, const Tensor& scale, std::int64_t axis) {
  constexpr const char* op = "channel_mul";
  check::floating(x, op, "x");
  QGRAD_CHECK(x.dim() >= 1, op, "x", "expected rank >= 1, got a scalar");
  const std::int64_t ax = check::axis(axis, x.dim(), op);
  QGRAD_CHECK(scale.defined(), op, "scale", "is required");
  check::floating(scale, op, "scale");
  check::same_dtype(scale, x, op, "scale");
  check::same_device(scale, x, op, "scale");
  QGRAD_CHECK(scale.dim() == 1 && scale.size(0) == x.size(ax), op, "scale", "expected shape [", x.size(ax),
              "] (x's size along axis ", ax, "), got ", shape_str(scale.shape()));
  Shape broadcast(x.shape().size() - static_cast<std::size_t>(ax), 1);  // [C, 1, ...]
  broadcast[0] = scale.size(0);
  Tensor out = Tensor::empty(x.shape(), like(x, x.dtype()));
  kernels::binary(formulas::BinaryOp::mul, x, scale.detach().reshape(broadcast), out);
  if (any_requires_grad({x, scale})) {
    const bool need_x = x.requires_grad(), need_s = scale.requires_grad();
    record_folding(
        op, out, {x, scale},
        [sx = need_s ? x.detach() : Tensor(), ss = scale.detach(), ax, broadcast, need_x, need_s](
            const Tensor& g, const std::vector<Tensor>& pending, std::vector<char>& folded) {
          const AxisLayout v = AxisLayout::of(g.shape(), ax);
          const Tensor p = need_s && pending.size() > 1 ? pending[1] : Tensor();
          if (p.defined()) folded[1] = 1;
          if (need_s && v.outer * v.inner < kernels::kAxisPassesMinReduction) {
            const TensorOptions o = like(g, g.dtype());
            Tensor dx = need_x ? Tensor::empty(g.shape(), o) : Tensor();
            Tensor ds = Tensor::empty(ss.shape(), o);
            kernels::channel_mul_backward(g, sx, ss, ax, p, dx, ds);
            return std::vector<Tensor>{dx, ds};
          }
          // Long channels: mul's rule as it is (sum_to_shape's axis passes).
          Tensor ds;
          if (need_s) {
            ds = sum_to_shape(mul(g, sx), broadcast).reshape(ss.shape());
            if (p.defined()) ds = add(p, ds);
          }
          return std::vector<Tensor>{need_x ? mul(g, ss.reshape(broadcast)) : Tensor(), ds};
        },
        scale.nbytes() + (need_s ? x.nbytes() : 0));
  }
  return out;
}

// Saves the divisor, and x (detached) when the divisor needs grad.
Tensor channel_div_add(const Tensor& x, const Tensor& divisor, const Tensor& bias) {
  constexpr const char* op = "channel_div_add";
  check::floating(x, op, "x");
  QGRAD_CHECK(x.dim() >= 2, op, "x", "expected rank >= 2 [N, C, ...], got shape ", shape_str(x.shape()));
  check::non_empty(x, op, "x");
  QGRAD_CHECK(divisor.defined(), op, "divisor", "is required");
  check_channel_tensor(divisor, x, "divisor", op);
  check_channel_tensor(bias, x, "bias", op);
  const AxisLayout v = AxisLayout::of(x.shape(), 1);
  Tensor out = Tensor::empty(x.shape(), like(x, x.dtype()));
  kernels::channel_div_add(x, v, divisor, bias, out);
  if (any_requires_grad({x, divisor, bias})) {
    const bool need_x = x.requires_grad(), need_d = divisor.requires_grad(),
               need_b = bias.defined() && bias.requires_grad();
    Tensor sx = need_d ? x.detach() : Tensor();
    record(op, out, {x, divisor, bias},
           [sx, sd = divisor.detach(), v, need_x, need_d, need_b](const Tensor& dy) {
             const TensorOptions o = like(dy, dy.dtype());
             Tensor dx = need_x ? Tensor::empty(dy.shape(), o) : Tensor();
             Tensor dd = need_d ? Tensor::empty({v.channels}, o) : Tensor();
             Tensor db = need_b ? Tensor::empty({v.channels}, o) : Tensor();
             kernels::channel_div_add_backward(dy, sx, v, sd, dx, dd, db);
             return std::vector<Tensor>{dx, dd, db};
           },
           divisor.nbytes() + (need_d ? x.nbytes() : 0));
  }
  return out;
}

namespace {

// batch_norm, with relu batch_norm_relu, with a divisor (defined)
// channel_div_add_batch_norm. Saves x (detached), weight, the per-channel
// mean and invstd in op math (batch statistics in training, running ones in
// evaluation), with relu the bias (to recompute relu's mask from x), and
// with a divisor the divisor and shift (to recompute the normalised input).
AxisLayout check_batch_norm(const char* op, const Tensor& x, const Tensor& divisor, const Tensor& shift,
                            const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                            const Tensor& running_var, bool training, double momentum, double eps,
                            const Tensor& num_batches_tracked) {
  check::floating(x, op, "x");
  QGRAD_CHECK(x.dim() >= 2, op, "x", "expected rank >= 2 [N, C, ...], got shape ", shape_str(x.shape()));
  check::non_empty(x, op, "x");
  check_channel_tensor(divisor, x, "divisor", op);  // both undefined unless fused
  check_channel_tensor(shift, x, "shift", op);
  check_channel_tensor(weight, x, "weight", op);
  check_channel_tensor(bias, x, "bias", op);
  check_channel_tensor(running_mean, x, "running_mean", op);
  check_channel_tensor(running_var, x, "running_var", op);
  QGRAD_CHECK(running_mean.defined() == running_var.defined(), op,
              running_mean.defined() ? "running_var" : "running_mean",
              "running_mean and running_var must be given together");
  QGRAD_CHECK(!running_mean.defined() || !running_mean.requires_grad(), op, "running_mean",
              "a running statistic is updated in place and must not require grad");
  QGRAD_CHECK(!running_var.defined() || !running_var.requires_grad(), op, "running_var",
              "a running statistic is updated in place and must not require grad");
  QGRAD_CHECK(training || running_mean.defined(), op, "running_mean",
              "evaluation (training = false) needs the running statistics");
  if (num_batches_tracked.defined()) {
    constexpr const char* arg = "num_batches_tracked";
    QGRAD_CHECK(num_batches_tracked.dtype() == DType::s64 && num_batches_tracked.numel() == 1, op, arg,
                "expected an s64 tensor of one element, got ", dtype_name(num_batches_tracked.dtype()), " ",
                shape_str(num_batches_tracked.shape()));
    check::same_device(num_batches_tracked, x, op, arg);
    QGRAD_CHECK(running_mean.defined(), op, arg, "counts batches only with the running statistics");
  }
  QGRAD_CHECK(std::isfinite(momentum) && momentum >= 0 && momentum <= 1, op, "momentum", "must be in [0, 1], got ",
              momentum);
  check::finite_positive(eps, op, "eps");
  const AxisLayout v = AxisLayout::of(x.shape(), 1);
  QGRAD_CHECK(!training || v.outer * v.inner > 1, op, "x", "training needs more than 1 value per channel, got shape ",
              shape_str(x.shape()));
  return v;
}

// The per-channel statistics in op math: mean and invstd.
std::pair<Tensor, Tensor> new_stats(const Tensor& x, std::int64_t channels) {
  const DType math = x.dtype() == DType::f64 ? DType::f64 : DType::f32;
  return {Tensor::empty({channels}, like(x, math)), Tensor::empty({channels}, like(x, math))};
}

kernels::DivAddPrologue prologue(const Tensor& divisor, const Tensor& shift) {
  const bool fused = divisor.defined();
  return {fused ? divisor.detach() : Tensor(), fused && shift.defined() ? shift.detach() : Tensor(), {}, {}};
}

// What batch_norm's backward keeps (x detached, weight, with relu the bias
// to recompute relu's mask, the statistics, the prologue), and that
// backward: gradients for {x, divisor, shift, weight, bias} (fused) or
// {x, weight, bias}.
struct BatchNormBackward {
  Tensor sx, sw, sb, mean, invstd;
  AxisLayout v;
  bool training = true, relu = false, fused = false;
  kernels::DivAddPrologue pre;
  bool need_x = false, need_w = false, need_b = false, need_d = false, need_s = false;

  BatchNormBackward(const Tensor& x, const Tensor& divisor, const Tensor& shift, const Tensor& weight,
                    const Tensor& bias, const Tensor& mean_, const Tensor& invstd_, const AxisLayout& v_,
                    bool training_, bool relu_, const kernels::DivAddPrologue& pre_)
      : sx(x.detach()), sw(weight.defined() ? weight.detach() : Tensor()),
        sb(relu_ && bias.defined() ? bias.detach() : Tensor()), mean(mean_), invstd(invstd_), v(v_),
        training(training_), relu(relu_), fused(divisor.defined()), pre(pre_) {
    const auto needs = [](const Tensor& t) { return t.defined() && t.requires_grad(); };
    need_x = x.requires_grad();
    need_w = needs(weight);
    need_b = needs(bias);
    need_d = needs(divisor);
    need_s = needs(shift);
  }
  std::vector<Tensor> inputs(const Tensor& x, const Tensor& divisor, const Tensor& shift, const Tensor& weight,
                             const Tensor& bias) const {
    return fused ? std::vector<Tensor>{x, divisor, shift, weight, bias} : std::vector<Tensor>{x, weight, bias};
  }
  std::int64_t saved_bytes() const {
    const auto bytes = [](const Tensor& t) { return t.defined() ? t.nbytes() : 0; };
    return bytes(sx) + bytes(mean) + bytes(invstd) + bytes(sw) + bytes(sb) + bytes(pre.divisor) + bytes(pre.shift);
  }
  std::vector<Tensor> operator()(const Tensor& dy) const {
    const TensorOptions o = like(sx, sx.dtype());
    Tensor dx = need_x ? Tensor::empty(sx.shape(), o) : Tensor();
    Tensor dw = need_w ? Tensor::empty({v.channels}, o) : Tensor();
    Tensor db = need_b ? Tensor::empty({v.channels}, o) : Tensor();
    kernels::DivAddPrologue g = pre;
    if (need_d) g.ddivisor = Tensor::empty({v.channels}, o);
    if (need_s) g.dshift = Tensor::empty({v.channels}, o);
    kernels::batch_norm_backward(dy, sx, v, mean, invstd, sw, training, dx, dw, db, relu, sb, g);
    if (fused) return std::vector<Tensor>{dx, g.ddivisor, g.dshift, dw, db};
    return std::vector<Tensor>{dx, dw, db};
  }
};

Tensor batch_norm_impl(const char* op, const Tensor& x, const Tensor& divisor, const Tensor& shift,
                       const Tensor& weight, const Tensor& bias, const Tensor& running_mean, const Tensor& running_var,
                       bool training, double momentum, double eps, const Tensor& num_batches_tracked, bool relu) {
  const AxisLayout v = check_batch_norm(op, x, divisor, shift, weight, bias, running_mean, running_var, training,
                                        momentum, eps, num_batches_tracked);
  Tensor mean, invstd;
  std::tie(mean, invstd) = new_stats(x, v.channels);
  const kernels::DivAddPrologue pre = prologue(divisor, shift);
  if (training)
    kernels::batch_norm_stats(x, v, momentum, eps, running_mean, running_var, mean, invstd, num_batches_tracked, pre);
  else kernels::batch_norm_eval_stats(running_mean, running_var, eps, mean, invstd);
  Tensor out = Tensor::empty(x.shape(), like(x, x.dtype()));
  kernels::batch_norm_apply(x, v, mean, invstd, weight, bias, out, relu, pre);
  const BatchNormBackward backward(x, divisor, shift, weight, bias, mean, invstd, v, training, relu, pre);
  const std::vector<Tensor> inputs = backward.inputs(x, divisor, shift, weight, bias);
  if (any_requires_grad(inputs)) record(op, out, inputs, backward, backward.saved_bytes());
  return out;
}

}  // namespace

Tensor batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                  const Tensor& running_var, bool training, double momentum, double eps,
                  const Tensor& num_batches_tracked) {
  return batch_norm_impl("batch_norm", x, Tensor(), Tensor(), weight, bias, running_mean, running_var, training,
                         momentum, eps, num_batches_tracked, false);
}

Tensor batch_norm_relu(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                       const Tensor& running_var, bool training, double momentum, double eps,
                       const Tensor& num_batches_tracked) {
  return batch_norm_impl("batch_norm_relu", x, Tensor(), Tensor(), weight, bias, running_mean, running_var, training,
                         momentum, eps, num_batches_tracked, true);
}

Tensor channel_div_add_batch_norm(const Tensor& x, const Tensor& divisor, const Tensor& shift, const Tensor& weight,
                                  const Tensor& bias, const Tensor& running_mean, const Tensor& running_var,
                                  bool training, bool relu, double momentum, double eps,
                                  const Tensor& num_batches_tracked) {
  const char* op = "channel_div_add_batch_norm";
  QGRAD_CHECK(divisor.defined(), op, "divisor", "is required");
  return batch_norm_impl(op, x, divisor, shift, weight, bias, running_mean, running_var, training, momentum, eps,
                         num_batches_tracked, relu);
}

Tensor batch_norm_relu_fake_quantize_max_pool2d(const Tensor& x, const BatchNormArgs& bn, const Tensor& scale,
                                                const Tensor& zero_point, std::int64_t qmin, std::int64_t qmax,
                                                const MaxPool2dArgs& pool, const ObserverUpdate* observer) {
  const char* op = "batch_norm_relu_fake_quantize_max_pool2d";
  const AxisLayout v = check_batch_norm(op, x, bn.divisor, bn.shift, bn.weight, bn.bias, bn.running_mean,
                                        bn.running_var, bn.training, bn.momentum, bn.eps, bn.num_batches_tracked);
  const Pool2dGeometry g =
      pool_geometry(op, x, pool.kernel_size, pool.stride, pool.padding, pool.dilation, pool.ceil_mode);
  QGRAD_CHECK(g.ih * g.iw < (std::int64_t{1} << 31), op, "x", "planes of 2^31 or more elements are not supported, got ",
              g.ih, " x ", g.iw);
  // With an observer, it writes scale and zero_point before they are read.
  check::per_tensor_qparams(x, scale, zero_point, qmin, qmax, op, observer == nullptr);
  if (observer) check::observer_update(x, *observer, 1, op);

  Tensor mean, invstd;
  std::tie(mean, invstd) = new_stats(x, v.channels);
  const kernels::DivAddPrologue pre = prologue(bn.divisor, bn.shift);
  const Tensor range = observer ? Tensor::empty({2 * v.channels}, like(x, DType::f32)) : Tensor();
  const kernels::ReluRange relu_range{range, bn.weight.defined() ? bn.weight.detach() : Tensor(),
                                      bn.bias.defined() ? bn.bias.detach() : Tensor()};
  if (bn.training) {
    kernels::batch_norm_stats(x, v, bn.momentum, bn.eps, bn.running_mean, bn.running_var, mean, invstd,
                              bn.num_batches_tracked, pre, observer ? &relu_range : nullptr);
  } else {
    kernels::batch_norm_eval_stats(bn.running_mean, bn.running_var, bn.eps, mean, invstd);
    if (observer) kernels::batch_norm_relu_range(x, v, mean, invstd, relu_range, pre);
  }
  if (observer) {
    // The min / max over the channels' extremes is the min / max of y.
    const kernels::ObserverQparams q{scale, zero_point, qmin, qmax, observer->symmetric,
                                     observer->symmetric_zero_point};
    kernels::observer_minmax(range, observer->run_min, observer->run_max, -1, observer->averaging_constant, &q);
  }
  Tensor out = Tensor::empty(pooled_shape(x, g), like(x, x.dtype()));
  Tensor codes = Tensor::empty(out.shape(), like(x, DType::s32));
  const formulas::ParamSource p{scale.data<float>(), zero_point.data<std::int32_t>()};
  const kernels::NormalizedInput normalized{mean,           invstd,         relu_range.weight, relu_range.bias,
                                            pre.divisor,    pre.shift,      v.channels};
  kernels::fake_quantize_max_pool2d(x, out, codes, p, qmin, qmax, g, &normalized);
  const BatchNormBackward bn_backward(x, bn.divisor, bn.shift, bn.weight, bn.bias, mean, invstd, v, bn.training,
                                      true, pre);
  const std::vector<Tensor> inputs = bn_backward.inputs(x, bn.divisor, bn.shift, bn.weight, bn.bias);
  if (any_requires_grad(inputs))
    record(op, out, inputs,
           [codes, g, bn_backward](const Tensor& dy) {
             // The pooling's and the fake quant's backward into y's gradient, then batch norm's.
             Tensor dnorm = Tensor::empty(bn_backward.sx.shape(), like(dy, dy.dtype()));
             kernels::fake_quantize_max_pool2d_backward(dy, codes, dnorm, g);
             return bn_backward(dnorm);
           },
           bn_backward.saved_bytes() + codes.nbytes());
  return out;
}

Tensor flatten(const Tensor& x, std::int64_t start_dim, std::int64_t end_dim) {
  constexpr const char* op = "flatten";
  check::defined(x, op, "x");
  const std::int64_t rank = x.dim() == 0 ? 1 : x.dim();  // a scalar flattens to [1], as in PyTorch
  const std::int64_t s = check::axis(start_dim, rank, op, "start_dim"), e = check::axis(end_dim, rank, op, "end_dim");
  QGRAD_CHECK(s <= e, op, "start_dim", "start_dim ", start_dim, " comes after end_dim ", end_dim);
  if (x.dim() == 0) return x.reshape({1});
  Shape shape(x.shape().begin(), x.shape().begin() + s);
  std::int64_t merged = 1;
  for (std::int64_t d = s; d <= e; ++d) merged *= x.size(d);
  shape.push_back(merged);
  shape.insert(shape.end(), x.shape().begin() + e + 1, x.shape().end());
  return x.reshape(shape);
}

}  // namespace qgrad
