// Kernels of the quantization ops: fake quantize, quantize, dequantize and
// their backward rules (one elementwise engine underneath, writing and
// reading the saved mask of kernels/bitmask.h), the observer fused with
// fake quantize, the LSQ backward with its deterministic reduction, and the
// rounding of learnable zero points. Vocabulary: docs/ops.md, "Quantization
// vocabulary".
#pragma once

#include <cstdint>
#include <vector>

#include "qgrad/core/tensor.h"
#include "qgrad/kernels/formulas/quantize.h"
#include "qgrad/kernels/layout.h"

namespace qgrad::kernels {

// The qparams of one launch: element i of the float tensor uses channel
// layout.channel(i) (per tensor: one channel), whose scale and zero point
// come from `source`; [qmin, qmax] is the integer range.
struct QuantParams {
  AxisLayout layout;
  formulas::ParamSource source;
  std::int64_t qmin = 0, qmax = 0;
  // Fake quantize / dequantize values: the product (q - zp) * scale in f64
  // (PyTorch's per-channel fake quantize) or in f32 (its per-tensor fake
  // quantize and dequantize); formulas::dequant_value.
  bool product_in_f64 = false;
};

// The kernels. Float tensors are f32, f64, f16 or bf16, integer ones s8 or
// u8; each pair has the same numel and device. A forward mask (null: none
// written) and a backward mask hold bitmask_words(numel) words.
//   fake_quantize:  y = (clamp(q, qmin, qmax) - zp) * scale, q = nearbyint(x / scale) + zp;
//                   mask bit = qmin <= q <= qmax. With relu: y = relu(y), and
//                   the bit also needs y > 0 (formulas::FakeQuantReluOp).
//   quantize:       q_out = clamp(q, qmin, qmax); the same mask.
//   dequantize:     y = (q - zp) * scale.
//   fake_quantize_backward: dx = dy * bit (no qparams).
//   quantize_backward:      dx = dy / scale * bit.
//   dequantize_backward:    dq = dy * scale.
void fake_quantize(const Tensor& x, const Tensor& y, const QuantParams& p, std::uint32_t* mask, bool relu = false);
void quantize(const Tensor& x, const Tensor& q, const QuantParams& p, std::uint32_t* mask);
void dequantize(const Tensor& q, const Tensor& y, const QuantParams& p);
void fake_quantize_backward(const Tensor& dy, const Tensor& dx, const std::uint32_t* mask);
void quantize_backward(const Tensor& dy, const Tensor& dx, const QuantParams& p, const std::uint32_t* mask);
void dequantize_backward(const Tensor& dy, const Tensor& dq, const QuantParams& p);

// The observer step of nn::FakeQuantize fused with its fake quantize: the
// update of observer_minmax (kernels/observer.h) over x in its layout
// around `axis` (< 0: per tensor), scale and zero_point (f32 / s32 [C])
// written from the updated range, then fake_quantize reading them
// (p.source must point at them). On CUDA, per-channel weights on axis 0
// ([C, inner], up to 64Ki elements per block of whole rows) take one
// launch: a block per group of rows reduces, updates and fake quantizes
// them; anything else takes two: the one-launch observer, then
// fake_quantize. On the CPU the observer kernel, then fake_quantize. Same
// bits either way.
struct ObserveArgs {
  Tensor run_min, run_max;  // f32 [C], updated in place
  Tensor scale, zero_point;
  std::int64_t axis = -1;
  double averaging_constant = -1.0;  // < 0: min/max, else moving average
  bool symmetric = false;
  std::int32_t symmetric_zero_point = 0;
};
// With relu, fake_quantize's relu form.
void observe_fake_quantize(const Tensor& x, const Tensor& y, const QuantParams& p, std::uint32_t* mask,
                           const ObserveArgs& obs, bool relu = false);

// LSQ backward over an [outer, C, inner] layout: writes dx (x's dtype) and
// the per-channel sums ds, dz (op-math dtype of x: f32, or f64 for f64).
struct LsqArgs {
  Tensor x, dy, scale /*f32 [C]*/, zp /*s32 [C]*/, dx, ds, dz;
  AxisLayout layout;
  std::int64_t qmin = 0, qmax = 0;
  double grad_factor = 1.0;
};
void lsq_backward(const LsqArgs& args);

// out (s32) = formulas::lsq_zero_point(zp) elementwise; zp f32 or f64.
void lsq_round_zero_point(const Tensor& zp, const Tensor& out, std::int64_t qmin, std::int64_t qmax);

// One launch of the elementwise engine under the kernels above (the
// device entry points; the kernels fill it in). `in` is the float side but
// for dequantize (integer in); mask_in for the backward kernels, mask_out
// for the forward ones.
enum class QuantKernel : std::uint8_t {
  fake_quantize,
  fake_quantize_relu,
  quantize,
  dequantize,
  fake_quantize_backward,
  quantize_backward,
  dequantize_backward
};
struct QuantLaunch {
  QuantKernel kernel = QuantKernel::fake_quantize;
  Tensor in, out;
  const std::uint32_t* mask_in = nullptr;
  std::uint32_t* mask_out = nullptr;
  QuantParams params;
};

// observe_fake_quantize of several tensors, each with its own observer
// state (none shared: the op checks): on CUDA the axis-0 weights that take
// the one-launch row kernel go in one launch per device, dtype, range and
// averaging constant (8 tensors a launch), the rest one at a time; on the
// CPU one at a time. Each tensor's bits are those of its own call.
struct ObserveLaunch {
  QuantLaunch fq;  // kernel fake_quantize or fake_quantize_relu
  ObserveArgs obs;
};
void observe_fake_quantize_batch(const std::vector<ObserveLaunch>& items);

namespace cpu {
void quant_elementwise(const QuantLaunch& l);
void lsq_backward(const LsqArgs& args);
void lsq_round_zero_point(const Tensor& zp, const Tensor& out, std::int64_t qmin, std::int64_t qmax);
}  // namespace cpu
namespace cuda {
void quant_elementwise(const QuantLaunch& l);
void observe_fake_quantize(const QuantLaunch& l, const ObserveArgs& obs);
// observe_fake_quantize where l's layout takes the row kernel (channels on
// axis 0, whole rows): launched, true; otherwise nothing launched, false.
bool observe_rows_fake_quantize(const QuantLaunch& l, const ObserveArgs& obs);
void observe_fake_quantize_batch(const std::vector<ObserveLaunch>& items);  // every item on CUDA
void lsq_backward(const LsqArgs& args);
void lsq_round_zero_point(const Tensor& zp, const Tensor& out, std::int64_t qmin, std::int64_t qmax);
}  // namespace cuda

// Calls f.template operator()<Op>() with the formulas op of the launch
// (shared by the CPU and CUDA engines).
template <class F>
void dispatch_quant_kernel(const QuantLaunch& l, F&& f) {
  const bool int_in = l.kernel == QuantKernel::dequantize;
  const DType ft = int_in ? l.out.dtype() : l.in.dtype();
  const bool f64 = l.params.product_in_f64;
  dispatch_floating(ft, "quantize kernel", [&](auto tag) {
    using T = typename decltype(tag)::type;
    switch (l.kernel) {
      case QuantKernel::fake_quantize:
        if (f64) f.template operator()<formulas::FakeQuantOp<T, true>>();
        else f.template operator()<formulas::FakeQuantOp<T, false>>();
        break;
      case QuantKernel::fake_quantize_relu:
        if (f64) f.template operator()<formulas::FakeQuantReluOp<T, true>>();
        else f.template operator()<formulas::FakeQuantReluOp<T, false>>();
        break;
      case QuantKernel::quantize:
        dispatch_int8(l.out.dtype(), "quantize", [&](auto itag) {
          f.template operator()<formulas::QuantizeOp<T, typename decltype(itag)::type>>();
        });
        break;
      case QuantKernel::dequantize:
        dispatch_int8(l.in.dtype(), "dequantize", [&](auto itag) {
          using I = typename decltype(itag)::type;
          if (f64) f.template operator()<formulas::DequantizeOp<I, T, true>>();
          else f.template operator()<formulas::DequantizeOp<I, T, false>>();
        });
        break;
      case QuantKernel::fake_quantize_backward: f.template operator()<formulas::FakeQuantGradOp<T>>(); break;
      case QuantKernel::quantize_backward: f.template operator()<formulas::QuantizeGradOp<T>>(); break;
      case QuantKernel::dequantize_backward: f.template operator()<formulas::DequantizeGradOp<T>>(); break;
    }
  });
}

}  // namespace qgrad::kernels
