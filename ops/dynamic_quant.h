// dynamic_range_quantize: quantization parameters from the runtime range of
// the input, then quantization, in one op (inference; not differentiable).
//
// Formula (per segment, M = f32 for f32/f16/bf16 input, f64 for f64):
//   symmetric:  zp = 0 (signed range) or (qmin + qmax + 1) / 2 (unsigned),
//               scale = max|x| / (qmax - zp)            (s8: max|x| / 127)
//   asymmetric: lo = min(min x, 0), hi = max(max x, 0),
//               scale = (hi - lo) / (qmax - qmin),
//               zp = clamp(qmin - nearbyint(lo / scale), qmin, qmax)
//   q = clamp(nearbyint(x * (1 / scale)) + zp, qmin, qmax)  (PyTorch CPU quantize)
// An all-zero segment gets scale 1; a scale below the smallest normal number
// of M is raised to it (1/scale stays finite). Non-finite inputs: ignored by
// the range reduction; +inf -> qmax, -inf -> qmin, NaN -> qmin.
// Scopes: tensor (one segment, scale shape []), channel(axis) ([size(axis)]),
// token (rows of the last axis; scale shape = x.shape[:-1]) and
// group(axis, group_size) (group_size consecutive indices of the axis;
// scale shape = x.shape with size(axis) / group_size at axis).
// Dtypes: x f32, f64, f16, bf16; q s8 or u8 (default range the dtype's full
// range); scale f32 (f64 for an f64 x); zero_point s32.
// Precision: min/max are exact and order-independent, so CPU and CUDA agree
// bit for bit.
#pragma once

#include <cstdint>

#include "qgrad/core/tensor.h"
#include "qgrad/ops/quantize.h"  // QuantScope

namespace qgrad {

enum class QuantMode { symmetric, asymmetric };

struct DynamicQuantized {
  Tensor q;           // s8/u8, x's shape
  Tensor scale;       // f32 (f64 for an f64 input), one per segment
  Tensor zero_point;  // s32, same shape as scale
};

// The dtype's full range: s8 [-128, 127], u8 [0, 255].
DynamicQuantized dynamic_range_quantize(const Tensor& x, QuantScope scope, QuantMode mode = QuantMode::symmetric,
                                        DType out_dtype = DType::s8);
// An explicit range within the dtype's (qmin < qmax; a symmetric signed
// range needs qmax > 0).
DynamicQuantized dynamic_range_quantize(const Tensor& x, QuantScope scope, QuantMode mode, DType out_dtype,
                                        std::int64_t qmin, std::int64_t qmax);

}  // namespace qgrad
