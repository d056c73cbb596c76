// MERGE NOTE: each block below compiles the real call once its header is
// merged; only the names here need fixing if a signature differs.
#include "nn/ops_adapter.h"

#if __has_include("ops/linalg.h")
#include "ops/linalg.h"
#define QGRAD_NN_HAVE_LINALG 1
#endif
#if __has_include("ops/activation.h")
#include "ops/activation.h"
#define QGRAD_NN_HAVE_ACTIVATION 1
#endif
#if __has_include("ops/quantize.h")
#include "ops/quantize.h"
#define QGRAD_NN_HAVE_QUANTIZE 1
#endif
#if __has_include("ops/quantized_linear.h")
#include "ops/quantized_linear.h"
#define QGRAD_NN_HAVE_QLINEAR 1
#endif

namespace qgrad::nn::ops {

namespace {
[[noreturn, maybe_unused]] void missing(const char* op, const char* header) {
  throw Error(op, "", std::string("not available in this build (") + header + " is not merged yet)");
}
}  // namespace

OpHooks& op_hooks() {
  static OpHooks hooks;
  return hooks;
}

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias) {
  if (op_hooks().linear) return op_hooks().linear(x, w, bias);
#ifdef QGRAD_NN_HAVE_LINALG
  return ::qgrad::linear(x, w, bias);
#else
  missing("linear", "ops/linalg.h");
#endif
}

Tensor relu(const Tensor& x) {
  if (op_hooks().relu) return op_hooks().relu(x);
#ifdef QGRAD_NN_HAVE_ACTIVATION
  return ::qgrad::relu(x);
#else
  missing("relu", "ops/activation.h");
#endif
}

Tensor fake_quantize_per_tensor(const Tensor& x, const Tensor& scale, const Tensor& zero_point, std::int64_t qmin,
                                std::int64_t qmax) {
  if (op_hooks().fake_quantize_per_tensor) return op_hooks().fake_quantize_per_tensor(x, scale, zero_point, qmin, qmax);
#ifdef QGRAD_NN_HAVE_QUANTIZE
  return ::qgrad::fake_quantize_per_tensor(x, scale, zero_point, qmin, qmax);
#else
  missing("fake_quantize_per_tensor", "ops/quantize.h");
#endif
}

Tensor fake_quantize_per_channel(const Tensor& x, const Tensor& scale, const Tensor& zero_point, std::int64_t axis,
                                 std::int64_t qmin, std::int64_t qmax) {
  if (op_hooks().fake_quantize_per_channel)
    return op_hooks().fake_quantize_per_channel(x, scale, zero_point, axis, qmin, qmax);
#ifdef QGRAD_NN_HAVE_QUANTIZE
  return ::qgrad::fake_quantize_per_channel(x, scale, zero_point, axis, qmin, qmax);
#else
  missing("fake_quantize_per_channel", "ops/quantize.h");
#endif
}

Tensor fake_quantize_learnable_per_tensor(const Tensor& x, const Tensor& scale, const Tensor& zero_point,
                                          std::int64_t qmin, std::int64_t qmax, double grad_factor) {
#ifdef QGRAD_NN_HAVE_QUANTIZE
  return ::qgrad::fake_quantize_learnable_per_tensor(x, scale, zero_point, qmin, qmax, grad_factor);
#else
  (void)x, (void)scale, (void)zero_point, (void)qmin, (void)qmax, (void)grad_factor;
  missing("fake_quantize_learnable_per_tensor", "ops/quantize.h");
#endif
}

Tensor fake_quantize_learnable_per_channel(const Tensor& x, const Tensor& scale, const Tensor& zero_point,
                                           std::int64_t axis, std::int64_t qmin, std::int64_t qmax,
                                           double grad_factor) {
#ifdef QGRAD_NN_HAVE_QUANTIZE
  return ::qgrad::fake_quantize_learnable_per_channel(x, scale, zero_point, axis, qmin, qmax, grad_factor);
#else
  (void)x, (void)scale, (void)zero_point, (void)axis, (void)qmin, (void)qmax, (void)grad_factor;
  missing("fake_quantize_learnable_per_channel", "ops/quantize.h");
#endif
}

Tensor quantize_per_channel(const Tensor& x, const Tensor& scale, const Tensor& zero_point, std::int64_t axis,
                            DType dtype) {
  if (op_hooks().quantize_per_channel) return op_hooks().quantize_per_channel(x, scale, zero_point, axis, dtype);
#ifdef QGRAD_NN_HAVE_QUANTIZE
  return ::qgrad::quantize_per_channel(x, scale, zero_point, axis, dtype);
#else
  missing("quantize_per_channel", "ops/quantize.h");
#endif
}

Tensor quantized_linear_fixed(const Tensor& x, const Tensor& w_q, const Tensor& w_scale, const Tensor& bias,
                              const Tensor& act_scale, const Tensor& act_zero_point, std::int64_t qmin,
                              std::int64_t qmax) {
  if (op_hooks().quantized_linear_fixed)
    return op_hooks().quantized_linear_fixed(x, w_q, w_scale, bias, act_scale, act_zero_point, qmin, qmax);
#ifdef QGRAD_NN_HAVE_QLINEAR
  return ::qgrad::quantized_linear(x, w_q, w_scale, bias,
                                   ::qgrad::ActivationQuant::fixed(act_scale, act_zero_point, qmin, qmax),
                                   DType::f32);
#else
  missing("quantized_linear", "ops/quantized_linear.h");
#endif
}

}  // namespace qgrad::nn::ops
