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

}  // namespace

void optimizer_step_(const OptimizerHyper& h, const std::vector<OptimizerSlot>& slots) {
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
  kernels::optim_step(h, slots);
}

}  // namespace qgrad
