#include "kernels/cpu/parallel.h"
#include "kernels/formulas/cast.h"
#include "kernels/formulas/observer.h"
#include "kernels/observer.h"

namespace qgrad::kernels::cpu {

namespace {

template <class T>
void minmax_impl(const Tensor& x, const Tensor& run_min, const Tensor& run_max, std::int64_t axis, double c) {
  const ChannelView v = channel_view(x, axis);
  const T* px = static_cast<const T*>(x.data_ptr());
  float* mn = run_min.data<float>();
  float* mx = run_max.data<float>();
  const float cf = static_cast<float>(c);
  const bool moving = c >= 0.0;
  // One fixed sequential order per channel (the combine is order-free anyway).
  parallel_for(v.channels, [&](std::int64_t ch) {
    float lo = INFINITY, hi = -INFINITY;
    for (std::int64_t o = 0; o < v.outer; ++o) {
      const T* row = px + (o * v.channels + ch) * v.inner;
      for (std::int64_t i = 0; i < v.inner; ++i) {
        const float f = formulas::cast_value<float>(row[i]);
        lo = formulas::min_combine(lo, f);
        hi = formulas::max_combine(hi, f);
      }
    }
    formulas::observer_update(mn[ch], mx[ch], lo, hi, cf, moving);
  });
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
