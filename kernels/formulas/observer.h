// Scalar formulas of the quantization observers (torch/ao/quantization/
// observer.py), shared by the CPU and CUDA kernels.
//
// Min/max combine with a total, order-free rule (NaN wins; -0 < +0), so a
// reduction gives the same bits in any order and on any device.
#pragma once

#include <cmath>
#include <cstdint>

#include "qgrad/core/half.h"

namespace qgrad::formulas {

inline constexpr float kObserverEps = 1.1920929e-07f;  // torch.finfo(torch.float32).eps

QGRAD_HD bool float_sign(float a) { return (float_to_bits(a) >> 31) != 0u; }

QGRAD_HD float min_combine(float a, float b) {
  if (a != a) return a;
  if (b != b) return b;
  return (a < b || (a == b && float_sign(a))) ? a : b;
}
QGRAD_HD float max_combine(float a, float b) {
  if (a != a) return a;
  if (b != b) return b;
  return (a > b || (a == b && !float_sign(a))) ? a : b;
}

// The running update of one channel given the current batch's min/max.
// averaging_constant < 0: MinMaxObserver (running min/max; the +inf/-inf
// start makes the first call a copy). Otherwise MovingAverage*: the first
// call (state still +inf/-inf) copies, later calls move by c*(cur - run).
QGRAD_HD void observer_update(float& run_min, float& run_max, float cur_min, float cur_max, float c, bool moving) {
  if (!moving) {
    run_min = min_combine(cur_min, run_min);
    run_max = max_combine(cur_max, run_max);
  } else if (run_min == INFINITY && run_max == -INFINITY) {
    run_min = cur_min;
    run_max = cur_max;
  } else {
    run_min = run_min + c * (cur_min - run_min);
    run_max = run_max + c * (cur_max - run_max);
  }
}

// PyTorch's _calculate_qparams for one channel, in float as on its CPU:
//   never observed (min = +inf, max = -inf): scale 1, zp 0;
//   min_neg = min(min, 0), max_pos = max(max, 0);
//   symmetric: scale = max(-min_neg, max_pos) / float((qmax - qmin) / 2), zp = sym_zp;
//   affine:    scale = (max_pos - min_neg) / float(qmax - qmin),
//              zp = clamp(qmin - round_half_even(min_neg / scale), qmin, qmax);
//   scale floored at eps (NaN stays NaN, like torch.max).
// Division is a true float division (PyTorch's CPU); its CUDA kernel
// multiplies by float(1/den) instead and differs by an ulp on ~70% of inputs.
QGRAD_HD void observer_qparams(float min_v, float max_v, std::int64_t qmin, std::int64_t qmax, bool symmetric,
                               std::int32_t sym_zp, float& scale, std::int32_t& zp) {
  if (min_v == INFINITY && max_v == -INFINITY) {
    scale = 1.0f;
    zp = 0;
    return;
  }
  const float min_neg = min_v < 0.0f ? min_v : (min_v != min_v ? min_v : 0.0f);
  const float max_pos = max_v > 0.0f ? max_v : (max_v != max_v ? max_v : 0.0f);
  float s;
  if (symmetric) {
    const float m = max_combine(-min_neg, max_pos);
    s = m / static_cast<float>(static_cast<double>(qmax - qmin) / 2.0);
  } else {
    s = (max_pos - min_neg) / static_cast<float>(qmax - qmin);
  }
  scale = (s != s || s > kObserverEps) ? s : kObserverEps;
  if (symmetric) {
    zp = sym_zp;
    return;
  }
  float r = rintf(min_neg / scale);  // ties to even, as torch.round
  if (!(r > -1e9f)) r = -1e9f;        // NaN or huge: clamp before the integer cast
  if (r > 1e9f) r = 1e9f;
  std::int64_t z = qmin - static_cast<std::int64_t>(r);
  z = z < qmin ? qmin : (z > qmax ? qmax : z);
  zp = static_cast<std::int32_t>(z);
}

}  // namespace qgrad::formulas
