// Observer updates as ops (no autograd): the running min/max of a tensor,
// per tensor or per channel, and the quantization parameters computed from
// it, in place on the observer's tensors and on their device (nothing comes
// back to the host). nn::Observer drives them.
#pragma once

#include <cstdint>

#include "qgrad/core/tensor.h"
#include "qgrad/ops/quantize.h"  // ObserverUpdate

namespace qgrad {

// Updates observer.run_min / run_max (f32 [C], C = 1 per tensor) from x
// (floating, any shape) viewed as [outer, C, inner] around `axis` (axis < 0:
// per tensor). With averaging_constant c >= 0 the range moves as
// r += c * (batch - r) (PyTorch's MovingAverage observers); c < 0 takes the
// running min/max. An empty x leaves the range unchanged.
void observe_minmax_(const Tensor& x, const ObserverUpdate& observer, std::int64_t axis);

// As observe_minmax_, and scale (f32 [C]) / zero_point (s32 [C]) computed
// from the updated range in the same launch.
void observe_minmax_qparams_(const Tensor& x, const ObserverUpdate& observer, std::int64_t axis,
                             const Tensor& scale, const Tensor& zero_point, std::int64_t qmin, std::int64_t qmax);

// scale and zero_point from observer.run_min / run_max with PyTorch's
// calculate_qparams formulas (symmetric: zero point observer.symmetric_zero_point).
void observer_qparams_(const ObserverUpdate& observer, const Tensor& scale, const Tensor& zero_point,
                       std::int64_t qmin, std::int64_t qmax);

// amax[j] = max(amax[j], max over the rows of |x[..., j]|) for x [..., K]
// floating and amax f32 [K] on x's device; non-finite values are ignored
// (SmoothQuant's activation calibration).
void observe_absmax_(const Tensor& x, const Tensor& amax);

}  // namespace qgrad
