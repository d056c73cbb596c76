// Kernels of the quantization ops: one "affine" elementwise engine (fake
// quantize, quantize, dequantize and their backward rules, with the
// bit-packed mask of kernels/quant_mask.h), the LSQ backward with its
// deterministic reduction, and the rounding of learnable zero points.
#pragma once

#include <cstdint>

#include "qgrad/core/tensor.h"
#include "qgrad/kernels/formulas/quantize.h"

namespace qgrad::kernels {

enum class AffineOp : std::uint8_t { fake_quant, quantize, dequantize, mask_grad, quantize_grad, dequantize_grad };

// One launch of the engine. `in` and `out` have the same numel; the float
// side's dtype picks the instantiation, the integer side (quantize's out,
// dequantize's in) is s8 or u8. The channel of element i is
// (i / inner) % channels (see formulas::ChannelMap).
struct AffineArgs {
  AffineOp op = AffineOp::fake_quant;
  Tensor in, out;
  const std::uint32_t* mask_in = nullptr;  // backward ops
  std::uint32_t* mask_out = nullptr;       // forward ops; null: no mask written
  formulas::ParamSource params;
  std::int64_t inner = 1, channels = 1;
  std::int64_t qmin = 0, qmax = 0;
  // fake quantize / dequantize values: product in f64 (PyTorch's per-channel
  // fake quantize) or in f32 (its per-tensor fake quantize and dequantize).
  bool double_product = false;
};
void affine(const AffineArgs& args);

// The observer step of nn::FakeQuantize fused with its fake quantize: the
// update of observer_minmax (kernels/observer.h) over args.in viewed around
// `axis` (< 0: per tensor), scale and zero_point (f32 / s32 [C]) written
// from the updated range, then the fake_quant op of `affine` reading them
// (args.params must point at them). On CUDA, per-channel weights on axis 0
// ([C, inner], up to 64Ki elements per block of whole rows) take one
// launch: a block per group of rows reduces, updates and fake quantizes
// them; anything else takes two: the one-launch observer, then the engine.
// On the CPU the observer kernel, then the engine. Same bits either way.
struct ObserveArgs {
  Tensor run_min, run_max;  // f32 [C], updated in place
  Tensor scale, zero_point;
  std::int64_t axis = -1;
  double averaging_constant = -1.0;  // < 0: min/max, else moving average
  bool symmetric = false;
  std::int32_t symmetric_zero_point = 0;
};
void observe_fake_quant(const AffineArgs& args, const ObserveArgs& obs);

// LSQ backward over an [outer, C, inner] layout: writes dx (x's dtype) and
// the per-channel sums ds, dz (op-math dtype of x: f32, or f64 for f64).
struct LsqArgs {
  Tensor x, dy, scale /*f32 [C]*/, zp /*s32 [C]*/, dx, ds, dz;
  std::int64_t outer = 1, channels = 1, inner = 1;
  std::int64_t qmin = 0, qmax = 0;
  double grad_factor = 1.0;
};
void lsq_backward(const LsqArgs& args);

// out (s32) = formulas::lsq_zero_point(zp) elementwise; zp f32 or f64.
void lsq_round_zero_point(const Tensor& zp, const Tensor& out, std::int64_t qmin, std::int64_t qmax);

namespace cpu {
void affine(const AffineArgs& args);
void lsq_backward(const LsqArgs& args);
void lsq_round_zero_point(const Tensor& zp, const Tensor& out, std::int64_t qmin, std::int64_t qmax);
}  // namespace cpu
namespace cuda {
void affine(const AffineArgs& args);
void observe_fake_quant(const AffineArgs& args, const ObserveArgs& obs);
void lsq_backward(const LsqArgs& args);
void lsq_round_zero_point(const Tensor& zp, const Tensor& out, std::int64_t qmin, std::int64_t qmax);
}  // namespace cuda

// Calls f.template operator()<Op>() with the engine op type for `args`
// (shared by the CPU and CUDA dispatch).
template <class F>
void dispatch_affine(const AffineArgs& a, F&& f) {
  const bool int_in = a.op == AffineOp::dequantize;
  const DType ft = int_in ? a.out.dtype() : a.in.dtype();
  dispatch_floating(ft, "affine", [&](auto tag) {
    using T = typename decltype(tag)::type;
    switch (a.op) {
      case AffineOp::fake_quant:
        if (a.double_product) f.template operator()<formulas::FakeQuantOp<T, true>>();
        else f.template operator()<formulas::FakeQuantOp<T, false>>();
        break;
      case AffineOp::quantize:
        dispatch_int8(a.out.dtype(), "quantize", [&](auto itag) {
          f.template operator()<formulas::QuantizeOp<T, typename decltype(itag)::type>>();
        });
        break;
      case AffineOp::dequantize:
        dispatch_int8(a.in.dtype(), "dequantize", [&](auto itag) {
          using I = typename decltype(itag)::type;
          if (a.double_product) f.template operator()<formulas::DequantizeOp<I, T, true>>();
          else f.template operator()<formulas::DequantizeOp<I, T, false>>();
        });
        break;
      case AffineOp::mask_grad: f.template operator()<formulas::MaskGradOp<T>>(); break;
      case AffineOp::quantize_grad: f.template operator()<formulas::QuantizeGradOp<T>>(); break;
      case AffineOp::dequantize_grad: f.template operator()<formulas::DequantizeGradOp<T>>(); break;
    }
  });
}

}  // namespace qgrad::kernels
