// SmoothQuant (Xiao et al., 2023): migrate activation outliers into the
// weights with a per-input-channel factor s, then run W8A8.
//
// Calibration: SmoothQuantCalibrator keeps amax_j = max |X_j| over every
// observed batch (f32 [K], on the device of the batches; updated by a kernel,
// no host sync; non-finite values ignored).
// Smoothing: s_j = max(amax_j, 1e-5)^alpha / max(max_n |W[n, j]|, 1e-5)^(1 - alpha),
// alpha in (0, 1) (0.5 by default); computed in double on the host.
// Folding: W'[:, j] = W[:, j] * s_j, quantized per output channel
// (symmetric s8, scale = max_j |W'[n, j]| / 127, through dynamic_range_quantize);
// the activation is divided by s (a stored divisor, or folded into the
// preceding linear layer: its row j and bias j divided by s_j, exact for a
// ReLU in between). Static per-tensor activation scale
// sa = max_j (amax_j / s_j) / 127, zero point 0, range [-127, 127].
// Inference: forward(x) = quantized_linear(x / s, W'_q, sw, bias, static sa).
// SmoothQuantLinear::from_float is an offline conversion: it copies amax and
// W to the host once (a host sync, never done by forward).
#pragma once

#include <cstdint>

#include "qgrad/core/tensor.h"

namespace qgrad::nn {

class LayerNorm;
class Linear;

class SmoothQuantCalibrator {
 public:
  SmoothQuantCalibrator(std::int64_t in_features, Device device = Device::cpu());
  // x [..., K] floating, on the calibrator's device.
  void observe(const Tensor& x);
  const Tensor& act_absmax() const { return amax_; }  // f32 [K]
  std::int64_t batches() const { return batches_; }
  std::int64_t in_features() const { return in_features_; }

 private:
  std::int64_t in_features_;
  Tensor amax_;
  std::int64_t batches_ = 0;
};

// s (f32 [K], host) from the calibrated amax (f32 [K]) and the float weight [N, K].
Tensor smoothquant_factors(const Tensor& act_absmax, const Tensor& weight, double alpha = 0.5);

struct SmoothQuantLinear {
  Tensor w_q;             // s8 [N, K]: quantized W[:, j] * s_j
  Tensor w_scale;         // f32 [N]
  Tensor bias;            // undefined or f32 [N]
  Tensor divisor;         // f32 [K] (s); undefined once folded into the previous layer
  Tensor act_scale;       // f32 [1]
  Tensor act_zero_point;  // s32 [1] (0)

  // weight [N, K] and bias [N] float (any device); the result lives on weight's device.
  static SmoothQuantLinear from_float(const Tensor& weight, const Tensor& bias, const SmoothQuantCalibrator& calib,
                                      double alpha = 0.5);
  // Divides row j of the previous linear layer's weight [K, K_prev] and bias
  // [K] by s_j (in place, host or device) and drops the divisor.
  void fold_divisor_into(Tensor& prev_weight, Tensor& prev_bias);
  Tensor forward(const Tensor& x, DType out_dtype = DType::f32) const;
};

// The SmoothQuant fold of a pre-norm transformer block (the LayerNorm that
// feeds a Linear: ln1 -> attention in_proj, ln2 -> fc1), in place, before
// QAT: with s (f32 [K], host or device, finite and > 0; e.g. from
// smoothquant_factors(calibrated amax of ln's output, next.weight())),
//   ln.weight[j] /= s_j,  ln.bias[j] /= s_j,  next.weight[n, j] *= s_j,
// each in the parameter's own dtype and device. ln's output channel j is
// divided by s_j and next's input column j multiplied by it, so
// next(ln(x)) is the same function: equal in exact arithmetic, within a few
// float roundings otherwise, and bit for bit when every s_j is a power of two
// (then each division and product is exact). The LayerNorm must normalise
// over [K] alone with an elementwise weight (its bias, when present, is
// divided too); next.in_features() == K. Throws qgrad::Error naming
// "smoothquant_fold" and the argument.
void smoothquant_fold(LayerNorm& ln, Linear& next, const Tensor& s);

}  // namespace qgrad::nn

// SmoothQuant lived in ops/ before the layers were enforced; the names
// stay reachable as qgrad::X.
namespace qgrad {
using nn::SmoothQuantCalibrator;
using nn::SmoothQuantLinear;
using nn::smoothquant_factors;
}  // namespace qgrad
