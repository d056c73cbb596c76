// The ops nn/ needs from other parts of qgrad (ops/linalg.h, activation.h,
// quantize.h, quantized_linear.h), behind one small adapter so a renamed
// op is fixed here only.
//
// Each adapter calls, in order: a hook installed with op_hooks() (tests
// use host stand-ins), else the real op when its header exists in this
// build (__has_include), else throws qgrad::Error naming the missing op.
#pragma once

#include <cstdint>
#include <functional>

#include "core/tensor.h"

namespace qgrad::nn::ops {

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias);
Tensor relu(const Tensor& x);
Tensor fake_quantize_per_tensor(const Tensor& x, const Tensor& scale, const Tensor& zero_point, std::int64_t qmin,
                                std::int64_t qmax);
Tensor fake_quantize_per_channel(const Tensor& x, const Tensor& scale, const Tensor& zero_point, std::int64_t axis,
                                 std::int64_t qmin, std::int64_t qmax);
Tensor fake_quantize_learnable_per_tensor(const Tensor& x, const Tensor& scale, const Tensor& zero_point,
                                          std::int64_t qmin, std::int64_t qmax, double grad_factor);
Tensor fake_quantize_learnable_per_channel(const Tensor& x, const Tensor& scale, const Tensor& zero_point,
                                           std::int64_t axis, std::int64_t qmin, std::int64_t qmax,
                                           double grad_factor);
Tensor quantize_per_channel(const Tensor& x, const Tensor& scale, const Tensor& zero_point, std::int64_t axis,
                            DType dtype);
// quantized_linear with ActivationQuant::fixed(act_scale, act_zero_point, qmin, qmax), f32 output.
Tensor quantized_linear_fixed(const Tensor& x, const Tensor& w_q, const Tensor& w_scale, const Tensor& bias,
                              const Tensor& act_scale, const Tensor& act_zero_point, std::int64_t qmin,
                              std::int64_t qmax);

// Replacement implementations (empty: use the real op).
struct OpHooks {
  std::function<Tensor(const Tensor&, const Tensor&, const Tensor&)> linear;
  std::function<Tensor(const Tensor&)> relu;
  std::function<Tensor(const Tensor&, const Tensor&, const Tensor&, std::int64_t, std::int64_t)> fake_quantize_per_tensor;
  std::function<Tensor(const Tensor&, const Tensor&, const Tensor&, std::int64_t, std::int64_t, std::int64_t)>
      fake_quantize_per_channel;
  std::function<Tensor(const Tensor&, const Tensor&, const Tensor&, std::int64_t, DType)> quantize_per_channel;
  std::function<Tensor(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                       std::int64_t, std::int64_t)>
      quantized_linear_fixed;
};
OpHooks& op_hooks();

}  // namespace qgrad::nn::ops
