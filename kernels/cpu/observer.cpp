#include <algorithm>
#include <vector>

#include "kernels/cpu/parallel.h"
#include "kernels/formulas/cast.h"
#include "kernels/formulas/observer.h"
#include "kernels/observer.h"

namespace qgrad::kernels::cpu {

namespace {

// Elements per task: a channel's elements are cut into chunks so that
// per-tensor observation (one channel) also uses every thread.
constexpr std::int64_t kMinmaxChunk = 16384;

template <class T>
void minmax_impl(const Tensor& x, const Tensor& run_min, const Tensor& run_max, std::int64_t axis, double c) {
  const ChannelView v = channel_view(x, axis);
  const T* px = static_cast<const T*>(x.data_ptr());
  float* mn = run_min.data<float>();
  float* mx = run_max.data<float>();
  const float cf = static_cast<float>(c);
  const bool moving = c >= 0.0;
  // Chunks of one outer row of a channel, or of the channel's whole range
  // when there is one outer row (per tensor, channels on axis 0). The
  // combine is exact and order-free, so chunking changes no result.
  const std::int64_t per_row = (v.inner + kMinmaxChunk - 1) / kMinmaxChunk;
  const std::int64_t tasks_per_channel = v.outer * std::max<std::int64_t>(per_row, 1);
  std::vector<float> part(static_cast<std::size_t>(2 * v.channels * tasks_per_channel));
  parallel_for(v.channels * tasks_per_channel, [&](std::int64_t task) {
    const std::int64_t ch = task / tasks_per_channel, r = task % tasks_per_channel;
    const std::int64_t o = r / std::max<std::int64_t>(per_row, 1), piece = r % std::max<std::int64_t>(per_row, 1);
    const T* row = px + (o * v.channels + ch) * v.inner;
    const std::int64_t i0 = piece * kMinmaxChunk, i1 = std::min(v.inner, i0 + kMinmaxChunk);
    float lo = INFINITY, hi = -INFINITY;
    for (std::int64_t i = i0; i < i1; ++i) {
      const float f = formulas::cast_value<float>(row[i]);
      lo = formulas::min_combine(lo, f);
      hi = formulas::max_combine(hi, f);
    }
    part[static_cast<std::size_t>(2 * task)] = lo;
    part[static_cast<std::size_t>(2 * task + 1)] = hi;
  }, std::max<std::int64_t>(2, kParallelGrain / std::max<std::int64_t>(1, std::min(v.inner, kMinmaxChunk))));
  for (std::int64_t ch = 0; ch < v.channels; ++ch) {
    float lo = INFINITY, hi = -INFINITY;
    for (std::int64_t t = 0; t < tasks_per_channel; ++t) {
      const std::size_t k = static_cast<std::size_t>(2 * (ch * tasks_per_channel + t));
      lo = formulas::min_combine(lo, part[k]);
      hi = formulas::max_combine(hi, part[k + 1]);
    }
    formulas::observer_update(mn[ch], mx[ch], lo, hi, cf, moving);
  }
}

}  // namespace

void observer_minmax(const Tensor& x, const Tensor& run_min, const Tensor& run_max, std::int64_t axis,
                     double averaging_constant) {
  dispatch_floating(x.dtype(), "observer_minmax", [&](auto tag) {
    minmax_impl<typename decltype(tag)::type>(x, run_min, run_max, axis, averaging_constant);
  });
}

void observer_qparams(const Tensor& run_min, const Tensor& run_max, const Tensor& scale, const Tensor& zero_point,
                      std::int64_t qmin, std::int64_t qmax, bool symmetric, std::int32_t symmetric_zero_point) {
  const float* mn = run_min.data<float>();
  const float* mx = run_max.data<float>();
  float* s = scale.data<float>();
  std::int32_t* z = zero_point.data<std::int32_t>();
  for (std::int64_t c = 0; c < scale.numel(); ++c)
    formulas::observer_qparams(mn[c], mx[c], qmin, qmax, symmetric, symmetric_zero_point, s[c], z[c]);
}

}  // namespace qgrad::kernels::cpu
