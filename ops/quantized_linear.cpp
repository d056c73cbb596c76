#include "qgrad/ops/quantized_linear.h"

#include <cmath>

#include "qgrad/kernels/dynamic_quant.h"
#include "qgrad/kernels/qlinear.h"
#include "qgrad/ops/check.h"

namespace qgrad {

namespace {
constexpr const char* kOp = "quantized_linear";

// A one-element tensor on the host or on `dev`.
void check_scalar_tensor(const Tensor& t, DType d, Device dev, const char* op, const char* arg) {
  check::dtype_is(t, d, op, arg);
  QGRAD_CHECK(t.numel() == 1, op, arg, "expected one element, got shape ", shape_str(t.shape()));
  QGRAD_CHECK(t.device().is_cpu() || t.device() == dev, op, arg, "must be on the host or on ", dev.str(),
              ", got ", t.device().str());
}

void check_act(const ActivationQuant& act, Device dev, std::int64_t N) {
  QGRAD_CHECK(act.qmin < act.qmax, kOp, "act.qmin", "qmin ", act.qmin, " must be < qmax ", act.qmax);
  if (act.kind == ActivationQuant::dynamic_per_token && act.mode == QuantMode::asymmetric) {
    QGRAD_CHECK(act.qmin >= -128 && act.qmax <= 127, kOp, "act.qmin/qmax",
                "dynamic per-token asymmetric quantization stores s8: need -128 <= qmin < qmax <= 127, got [",
                act.qmin, ", ", act.qmax, "]");
    if (act.weight_row_sums.defined()) {
      check::dtype_is(act.weight_row_sums, DType::s32, kOp, "act.weight_row_sums");
      QGRAD_CHECK(act.weight_row_sums.device() == dev, kOp, "act.weight_row_sums", "must be on ", dev.str(),
                  ", got ", act.weight_row_sums.device().str());
      QGRAD_CHECK(act.weight_row_sums.shape() == Shape{N}, kOp, "act.weight_row_sums", "expected shape [", N,
                  "], got ", shape_str(act.weight_row_sums.shape()));
    }
    return;
  }
  QGRAD_CHECK(!act.weight_row_sums.defined(), kOp, "act.weight_row_sums",
              "only dynamic per-token asymmetric quantization uses weight row sums");
  if (act.kind == ActivationQuant::dynamic_per_token) {
    QGRAD_CHECK(act.qmin >= -128 && act.qmin < 0 && act.qmax > 0 && act.qmax <= 127, kOp, "act.qmin/qmax",
                "dynamic per-token quantization is symmetric s8: need -128 <= qmin < 0 < qmax <= 127, got [",
                act.qmin, ", ", act.qmax, "]");
    return;
  }
  QGRAD_CHECK(act.kind == ActivationQuant::static_per_tensor, kOp, "act.kind", "unknown activation quantization");
  check::static_activation_quant(act, dev, kOp);
}

}  // namespace

void check::static_activation_quant(const ActivationQuant& act, Device dev, const char* op) {
  QGRAD_CHECK(act.qmin < act.qmax, op, "act.qmin", "qmin ", act.qmin, " must be < qmax ", act.qmax);
  check_scalar_tensor(act.scale, DType::f32, dev, op, "act.scale");
  check_scalar_tensor(act.zero_point, DType::s32, dev, op, "act.zero_point");
  QGRAD_CHECK(act.qmin >= -128 && act.qmax <= 255 && act.qmax - act.qmin <= 255, op, "act.qmin/qmax",
              "range [", act.qmin, ", ", act.qmax, "] must lie in [-128, 255] and span at most 256 values");
  if (act.scale.device().is_cpu()) check::finite_positive(act.scale.item(), op, "act.scale");
  if (act.zero_point.device().is_cpu()) {
    const auto za = static_cast<std::int64_t>(act.zero_point.item());
    QGRAD_CHECK(za >= act.qmin && za <= act.qmax, op, "act.zero_point", "zero point ", za, " outside [", act.qmin,
                ", ", act.qmax, "]");
    QGRAD_CHECK(act.qmin - za >= -128 && act.qmax - za <= 127, op, "act.zero_point", "shifted range [",
                act.qmin - za, ", ", act.qmax - za, "] = [qmin - zp, qmax - zp] does not fit s8 [-128, 127]");
  }
}

ActivationQuant ActivationQuant::dynamic(QuantMode mode) {
  ActivationQuant a;
  a.mode = mode;
  return a;
}

ActivationQuant ActivationQuant::fixed(Tensor scale, Tensor zero_point, std::int64_t qmin, std::int64_t qmax) {
  ActivationQuant a;
  a.kind = static_per_tensor;
  a.scale = std::move(scale);
  a.zero_point = std::move(zero_point);
  a.qmin = qmin;
  a.qmax = qmax;
  return a;
}

Tensor quantized_linear(const Tensor& x, const Tensor& w_q, const Tensor& w_scale, const Tensor& bias,
                        const ActivationQuant& act, DType out_dtype) {
  // ---- validation: everything before any allocation or launch ----
  check::floating(x, kOp, "x");
  QGRAD_CHECK(x.dim() >= 1, kOp, "x", "expected rank >= 1 ([..., K]), got a scalar");
  check::dtype_is(w_q, DType::s8, kOp, "w_q");
  check::rank_is(w_q, 2, kOp, "w_q");
  check::same_device(w_q, x, kOp, "w_q");
  const std::int64_t K = x.size(-1), N = w_q.size(0);
  QGRAD_CHECK(K >= 1, kOp, "x", "inner dimension K must be >= 1, got shape ", shape_str(x.shape()));
  QGRAD_CHECK(N >= 1, kOp, "w_q", "needs at least one output channel, got shape ", shape_str(w_q.shape()));
  QGRAD_CHECK(w_q.size(1) == K, kOp, "w_q", "shape ", shape_str(w_q.shape()), " does not match K = ", K, " of x ",
              shape_str(x.shape()));
  check::dtype_is(w_scale, DType::f32, kOp, "w_scale");
  check::same_device(w_scale, x, kOp, "w_scale");
  QGRAD_CHECK(w_scale.shape() == Shape{N}, kOp, "w_scale", "expected shape [", N, "], got ",
              shape_str(w_scale.shape()));
  if (w_scale.device().is_cpu()) {
    const float* s = w_scale.data<float>();
    for (std::int64_t n = 0; n < N; ++n) check::finite_positive(s[n], kOp, "w_scale");
  }
  if (bias.defined()) {
    check::floating(bias, kOp, "bias");
    check::same_device(bias, x, kOp, "bias");
    QGRAD_CHECK(bias.shape() == Shape{N}, kOp, "bias", "expected shape [", N, "], got ", shape_str(bias.shape()));
  }
  QGRAD_CHECK(is_floating(out_dtype), kOp, "out_dtype", "expected f32, f64, f16 or bf16, got ", dtype_name(out_dtype));
  check_act(act, x.device(), N);

  // ---- compute ----
  Shape out_shape = x.shape();
  out_shape.back() = N;
  const Device dev = x.device();
  const TensorOptions on = TensorOptions{}.with_device(dev);
  Tensor out = Tensor::empty(out_shape, TensorOptions(on).with_dtype(out_dtype));
  const std::int64_t M = x.numel() / K;
  if (M == 0) return out;
  const std::int64_t lda = kernels::qlinear_lda(dev, K);
  Tensor a = Tensor::empty({M, lda}, TensorOptions(on).with_dtype(DType::s8));
  kernels::QLinearEpilogue ep;
  ep.sw = w_scale;
  if (bias.defined()) ep.bias = bias.detach().to(out_dtype == DType::f64 ? DType::f64 : DType::f32);
  if (act.kind == ActivationQuant::dynamic_per_token) {
    ep.sa = Tensor::empty({M}, TensorOptions(on).with_dtype(x.dtype() == DType::f64 ? DType::f64 : DType::f32));
    ep.per_row = true;
    const bool symmetric = act.mode == QuantMode::symmetric;
    const kernels::QuantSpec spec{symmetric, static_cast<int>(act.qmin), static_cast<int>(act.qmax)};
    if (!symmetric) {
      ep.za = Tensor::empty({M}, TensorOptions(on).with_dtype(DType::s32));
      ep.wsum = act.weight_row_sums;
      if (!ep.wsum.defined()) {
        ep.wsum = Tensor::empty({N}, TensorOptions(on).with_dtype(DType::s32));
        kernels::qlinear_weight_row_sums(w_q, ep.wsum);
      }
    }
    kernels::quantize_rows_dynamic(x, K, spec, a, lda, ep.sa, ep.za);
  } else {
    ep.sa = act.scale;
    ep.per_row = false;
    kernels::quantize_rows_static(x, K, act.scale, act.zero_point, static_cast<int>(act.qmin),
                                  static_cast<int>(act.qmax), a, lda);
  }
  ep.w_untouched_by_prior_kernel = true;  // the activation quantization just launched writes a and its qparams only
  kernels::qlinear(a, lda, K, w_q, ep, out.reshape({M, N}));
  return out;
}

}  // namespace qgrad
