#include "qgrad/ops/optim.h"

#include <cmath>

#include "qgrad/kernels/optim.h"
#include "qgrad/ops/check.h"

namespace qgrad {

namespace {

void check_range(double v, double lo, double hi, const char* arg) {
  QGRAD_CHECK(std::isfinite(v) && v >= lo && v <= hi, "optimizer_step_", arg, "must be in [", lo, ", ", hi,
              "], got ", v);
}

void check_buffer(const Tensor& buf, const Tensor& param, const char* arg) {
  const char* op = "optimizer_step_";
  check::defined(buf, op, arg);
  QGRAD_CHECK(buf.shape() == param.shape() && buf.dtype() == param.dtype() && buf.device() == param.device(), op,
              arg, "buffer ", shape_str(buf.shape()), " ", dtype_name(buf.dtype()), " on ", buf.device().str(),
              " does not match its parameter ", shape_str(param.shape()), " ", dtype_name(param.dtype()), " on ",
              param.device().str());
}

// A one-element tensor of `dtype` on `device` (a device scalar operand).
void check_device_scalar(const Tensor& t, DType dtype, Device device, const char* op, const char* arg) {
  check::defined(t, op, arg);
  QGRAD_CHECK(t.numel() == 1 && t.dtype() == dtype && t.device() == device, op, arg, "expected one ",
              dtype_name(dtype), " element on ", device.str(), ", got ", shape_str(t.shape()), " ",
              dtype_name(t.dtype()), " on ", t.device().str());
}

// All defined, floating, one dtype and one device (that of the first).
void check_tensor_list(const std::vector<Tensor>& ts, const char* op, const char* arg) {
  for (const Tensor& t : ts) {
    check::defined(t, op, arg);
    check::floating(t, op, arg);
    check::same_dtype(t, ts.front(), op, arg);
    check::same_device(t, ts.front(), op, arg);
  }
}

}  // namespace

GradNorm grad_norm(const std::vector<Tensor>& grads, double max_norm, double norm_type, const Tensor& nonfinite) {
  const char* op = "grad_norm";
  QGRAD_CHECK(!grads.empty(), op, "grads", "needs at least one tensor");
  check_tensor_list(grads, op, "grads");
  QGRAD_CHECK(norm_type == 1.0 || norm_type == 2.0 || norm_type == INFINITY, op, "norm_type",
              "must be 1, 2 or inf, got ", norm_type);
  QGRAD_CHECK(std::isfinite(max_norm) && max_norm >= 0, op, "max_norm", "must be finite and >= 0, got ", max_norm);
  const Device dev = grads.front().device();
  if (nonfinite.defined()) check_device_scalar(nonfinite, DType::s32, dev, op, "nonfinite");
  const auto opts = TensorOptions{}.with_dtype(grads.front().dtype()).with_device(dev);
  GradNorm out{Tensor::empty({}, opts), Tensor::empty({}, opts)};
  const formulas::NormKind kind = norm_type == 1.0   ? formulas::NormKind::l1
                                  : norm_type == 2.0 ? formulas::NormKind::l2
                                                     : formulas::NormKind::linf;
  kernels::grad_norm(grads, kind, max_norm, out.total_norm, out.clip_coef, nonfinite);
  return out;
}

void grad_scale_(const std::vector<Tensor>& tensors, const Tensor& scale) {
  const char* op = "grad_scale_";
  check::defined(scale, op, "scale");
  check::floating(scale, op, "scale");
  check_tensor_list(tensors, op, "tensors");
  if (!tensors.empty()) check_device_scalar(scale, tensors.front().dtype(), tensors.front().device(), op, "scale");
  QGRAD_CHECK(scale.numel() == 1, op, "scale", "expected one element, got ", shape_str(scale.shape()));
  kernels::grad_scale(tensors, scale);
}

void optimizer_step_(const OptimizerHyper& h, const std::vector<OptimizerSlot>& slots, const Tensor& grad_scale,
                     const Tensor& skip) {
  const char* op = "optimizer_step_";
  check_range(h.lr, 0.0, 1e30, "lr");
  check_range(h.weight_decay, 0.0, 1e30, "weight_decay");
  if (h.kind == OptimizerKind::sgd) {
    check_range(h.momentum, 0.0, 1e30, "momentum");
    check_range(h.dampening, -1e30, 1e30, "dampening");
  } else {
    check_range(h.beta1, 0.0, 0.999999999999, "beta1");
    check_range(h.beta2, 0.0, 0.999999999999, "beta2");
    check_range(h.eps, 0.0, 1e30, "eps");
  }
  if (slots.empty()) return;
  const Tensor& first = slots.front().param;
  for (const OptimizerSlot& s : slots) {
    check::floating(s.param, op, "param");
    check::same_dtype(s.param, first, op, "param");
    check::same_device(s.param, first, op, "param");
    check::defined(s.grad, op, "grad");
    QGRAD_CHECK(s.grad.shape() == s.param.shape() && s.grad.dtype() == s.param.dtype() &&
                    s.grad.device() == s.param.device(),
                op, "grad", "gradient ", shape_str(s.grad.shape()), " ", dtype_name(s.grad.dtype()),
                " does not match its parameter ", shape_str(s.param.shape()), " ", dtype_name(s.param.dtype()));
    QGRAD_CHECK(s.step >= 1, op, "step", "step count must be >= 1, got ", s.step);
    if (h.kind == OptimizerKind::adamw) {
      check_buffer(s.buf1, s.param, "buf1");
      check_buffer(s.buf2, s.param, "buf2");
    } else if (h.momentum != 0.0) {
      check_buffer(s.buf1, s.param, "buf1");
    }
  }
  if (grad_scale.defined()) check_device_scalar(grad_scale, first.dtype(), first.device(), op, "grad_scale");
  if (skip.defined()) check_device_scalar(skip, DType::s32, first.device(), op, "skip");
  kernels::optim_step(h, slots, grad_scale, skip);
}

}  // namespace qgrad
