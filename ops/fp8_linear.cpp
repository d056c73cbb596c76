#include "qgrad/ops/fp8_linear.h"

#include <cmath>

#include "qgrad/kernels/fp8_linear.h"
#include "qgrad/ops/check.h"

namespace qgrad {

namespace {
constexpr const char* kOp = "fp8_linear";

// A per-tensor scale: f32, one element, on the host or on x's device; host
// values finite and > 0 with a finite reciprocal (a device value is not
// read: that would need a host sync).
void check_scale(const Tensor& t, Device dev, const char* arg) {
  check::dtype_is(t, DType::f32, kOp, arg);
  QGRAD_CHECK(t.numel() == 1, kOp, arg, "expected one element (a per-tensor scale), got shape ", shape_str(t.shape()));
  QGRAD_CHECK(t.device().is_cpu() || t.device() == dev, kOp, arg, "must be on the host or on ", dev.str(), ", got ",
              t.device().str());
  if (t.device().is_cpu()) {
    const float s = t.data<float>()[0];
    QGRAD_CHECK(std::isfinite(s) && s > 0.0f && std::isfinite(1.0f / s), kOp, arg,
                "must be a finite positive f32 with a finite reciprocal, got ", s);
  }
}

// The scale where the kernels read it: on x's device, as f32 [1].
Tensor on_device(const Tensor& s, Device dev) { return s.detach().reshape({1}).to(dev); }
}  // namespace

Tensor fp8_linear(const Tensor& x, const Tensor& w_q, const Tensor& w_scale, const Tensor& bias, DType out_dtype,
                  const Tensor& x_scale) {
  // ---- validation: everything before any allocation or launch ----
  check::defined(x, kOp, "x");
  QGRAD_CHECK(x.dtype() == DType::f32 || x.dtype() == DType::bf16 || x.dtype() == DType::f16, kOp, "x",
              "expected f32, bf16 or f16, got ", dtype_name(x.dtype()));
  QGRAD_CHECK(x.dim() >= 1, kOp, "x", "expected rank >= 1 ([..., K]), got a scalar");
  check::dtype_is(w_q, DType::f8e4m3, kOp, "w_q");
  check::rank_is(w_q, 2, kOp, "w_q");
  check::same_device(w_q, x, kOp, "w_q");
  const std::int64_t K = x.size(-1), N = w_q.size(0);
  QGRAD_CHECK(K >= 1, kOp, "x", "inner dimension K must be >= 1, got shape ", shape_str(x.shape()));
  QGRAD_CHECK(N >= 1, kOp, "w_q", "needs at least one output channel, got shape ", shape_str(w_q.shape()));
  QGRAD_CHECK(w_q.size(1) == K, kOp, "w_q", "shape ", shape_str(w_q.shape()), " does not match K = ", K, " of x ",
              shape_str(x.shape()));
  const Device dev = x.device();
  check_scale(w_scale, dev, "w_scale");
  if (bias.defined()) {
    QGRAD_CHECK(bias.dtype() == DType::bf16 || bias.dtype() == DType::f32, kOp, "bias", "expected bf16 or f32, got ",
                dtype_name(bias.dtype()));
    check::same_device(bias, x, kOp, "bias");
    QGRAD_CHECK(bias.shape() == Shape{N}, kOp, "bias", "expected shape [", N, "], got ", shape_str(bias.shape()));
  }
  QGRAD_CHECK(out_dtype == DType::bf16 || out_dtype == DType::f32, kOp, "out_dtype", "expected bf16 or f32, got ",
              dtype_name(out_dtype));
  const bool dynamic = !x_scale.defined();
  if (!dynamic) check_scale(x_scale, dev, "x_scale");
  if (dev.is_cuda()) check::fp8_tensor_cores(cuda_compute_capability(dev.index), dev, kOp);

  // ---- compute ----
  Shape out_shape = x.shape();
  out_shape.back() = N;
  const TensorOptions on = TensorOptions{}.with_device(dev);
  Tensor out = Tensor::empty(out_shape, TensorOptions(on).with_dtype(out_dtype));
  const std::int64_t M = x.numel() / K;
  if (M == 0) return out;
  const std::int64_t ld = kernels::fp8_linear_ld(dev, K);
  Tensor q = Tensor::empty({M, ld}, TensorOptions(on).with_dtype(DType::f8e4m3));
  Tensor sx = dynamic ? Tensor::empty({1}, TensorOptions(on).with_dtype(DType::f32)) : on_device(x_scale, dev);
  kernels::fp8_quantize_rows(x.detach(), K, sx, dynamic, q, ld);
  const Tensor b = bias.defined() ? bias.detach().to(DType::bf16) : Tensor();
  kernels::fp8_gemm(q, ld, K, w_q.detach(), sx, on_device(w_scale, dev), b, out.reshape({M, N}));
  return out;
}

}  // namespace qgrad
