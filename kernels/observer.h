// Observer kernels: the min/max reduction of an activation or weight fused
// with the observer's running update, and the qparams computation. Both run
// on the tensors' device; nothing comes back to the host.
#pragma once

#include <cstdint>

#include "qgrad/core/tensor.h"
#include "qgrad/kernels/layout.h"

namespace qgrad::kernels {

// x (floating, any shape) in its AxisLayout around `axis` (kernels/layout.h;
// axis < 0: per tensor, C = 1). run_min / run_max: f32 [C], updated in
// place by formulas::observer_update (moving when averaging_constant >= 0).
// Elements are converted to float before combining (monotone, so the min
// of the floats is the float of the min).
//
// With `qparams`, the same launch (on CUDA, the kernel that finishes the
// reduction) then writes scale and zero_point from the updated range, as
// observer_qparams does: one launch less per observed tensor. For an empty
// x, which leaves the range as it is, only the qparams are written.
struct ObserverQparams {
  Tensor scale, zero_point;  // f32 [C], s32 [C]
  std::int64_t qmin = 0, qmax = 0;
  bool symmetric = false;
  std::int32_t symmetric_zero_point = 0;
};
void observer_minmax(const Tensor& x, const Tensor& run_min, const Tensor& run_max, std::int64_t axis,
                     double averaging_constant, const ObserverQparams* qparams = nullptr);
// scale (f32 [C]) and zero_point (s32 [C]) from run_min / run_max (f32 [C]).
void observer_qparams(const Tensor& run_min, const Tensor& run_max, const Tensor& scale, const Tensor& zero_point,
                      std::int64_t qmin, std::int64_t qmax, bool symmetric, std::int32_t symmetric_zero_point);

namespace cpu {
void observer_minmax(const Tensor& x, const Tensor& run_min, const Tensor& run_max, std::int64_t axis,
                     double averaging_constant, const ObserverQparams* qparams);
void observer_qparams(const Tensor& run_min, const Tensor& run_max, const Tensor& scale, const Tensor& zero_point,
                      std::int64_t qmin, std::int64_t qmax, bool symmetric, std::int32_t symmetric_zero_point);
}  // namespace cpu
namespace cuda {
void observer_minmax(const Tensor& x, const Tensor& run_min, const Tensor& run_max, std::int64_t axis,
                     double averaging_constant, const ObserverQparams* qparams);
void observer_qparams(const Tensor& run_min, const Tensor& run_max, const Tensor& scale, const Tensor& zero_point,
                      std::int64_t qmin, std::int64_t qmax, bool symmetric, std::int32_t symmetric_zero_point);
}  // namespace cuda

}  // namespace qgrad::kernels
