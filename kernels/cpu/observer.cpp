#include <algorithm>
#include <type_traits>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "qgrad/kernels/cpu/parallel.h"
#include "qgrad/kernels/cpu/simd.h"
#include "qgrad/kernels/formulas/cast.h"
#include "qgrad/kernels/formulas/observer.h"
#include "qgrad/kernels/observer.h"

namespace qgrad::kernels::cpu {

namespace {

// Elements per task: a channel's elements are cut into chunks so that
// per-tensor observation (one channel) also uses every thread.
constexpr std::int64_t kMinmaxChunk = 16384;

// The vector lanes' minima l and maxima h folded into lo / hi; a zero result
// takes its sign from whether a -0 (for the min) or a +0 (for the max) was seen.
template <int kLanes>
void fold_lanes(const float (&l)[kLanes], const float (&h)[kLanes], bool neg_zero, bool pos_zero, float& lo,
                float& hi) {
  float a = lo, b = hi;
  for (int k = 0; k < kLanes; ++k) {
    a = l[k] < a ? l[k] : a;
    b = h[k] > b ? h[k] : b;
  }
  if (a == 0.0f) a = neg_zero ? -0.0f : 0.0f;
  if (b == 0.0f) b = pos_zero ? 0.0f : -0.0f;
  lo = a;
  hi = b;
}

// min_combine / max_combine over row[i0, i1) of f32, four lanes at a time
// (SSE2): exact for NaN-free data, where the combine is the ordinary min
// and max with -0 < +0; the sign of a zero result is fixed from whether a
// -0 (for the min) or a +0 (for the max) was seen. A chunk holding a NaN is
// left to the scalar loop (returns i0). Returns the first index not done.
std::int64_t minmax_f32(const float* row, std::int64_t i0, std::int64_t i1, float& lo, float& hi) {
#if defined(__SSE2__)
  const std::int64_t n4 = i0 + (i1 - i0) / 4 * 4;
  if (n4 == i0) return i0;
  __m128 vlo = _mm_set1_ps(INFINITY), vhi = _mm_set1_ps(-INFINITY), nan = _mm_setzero_ps();
  __m128 neg_zero = _mm_setzero_ps(), pos_zero = _mm_setzero_ps();
  const __m128 zero = _mm_setzero_ps(), sign = _mm_set1_ps(-0.0f);
  for (std::int64_t i = i0; i < n4; i += 4) {
    const __m128 f = _mm_loadu_ps(row + i);
    nan = _mm_or_ps(nan, _mm_cmpunord_ps(f, f));
    vlo = _mm_min_ps(vlo, f);
    vhi = _mm_max_ps(vhi, f);
    const __m128 is_zero = _mm_cmpeq_ps(f, zero), negative = _mm_and_ps(f, sign);
    neg_zero = _mm_or_ps(neg_zero, _mm_and_ps(is_zero, negative));
    pos_zero = _mm_or_ps(pos_zero, _mm_andnot_ps(negative, is_zero));
  }
  if (_mm_movemask_ps(nan) != 0) return i0;
  alignas(16) float l[4], h[4];
  _mm_store_ps(l, vlo);
  _mm_store_ps(h, vhi);
  fold_lanes(l, h, _mm_movemask_ps(neg_zero) != 0, _mm_movemask_ps(pos_zero) != 0, lo, hi);
  return n4;
#else
  (void)row;
  (void)i1;
  (void)lo;
  (void)hi;
  return i0;
#endif
}

#if QGRAD_CPU_AVX512
// minmax_f32 sixteen lanes a step (the same operations: vminps / vmaxps
// return their second operand on a NaN or two zeros, as minps / maxps do).
QGRAD_TARGET_AVX512 std::int64_t minmax16_f32(const float* row, std::int64_t i0, std::int64_t i1, float& lo,
                                              float& hi) {
  const std::int64_t n16 = i0 + (i1 - i0) / 16 * 16;
  if (n16 == i0) return i0;
  __m512 vlo = _mm512_set1_ps(INFINITY), vhi = _mm512_set1_ps(-INFINITY);
  __mmask16 nan = 0, neg_zero = 0, pos_zero = 0;
  const __m512 zero = _mm512_setzero_ps();
  for (std::int64_t i = i0; i < n16; i += 16) {
    const __m512 f = _mm512_loadu_ps(row + i);
    nan |= _mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q);
    vlo = _mm512_min_ps(vlo, f);
    vhi = _mm512_max_ps(vhi, f);
    const __mmask16 is_zero = _mm512_cmp_ps_mask(f, zero, _CMP_EQ_OQ);
    const __mmask16 negative = _mm512_movepi32_mask(_mm512_castps_si512(f));
    neg_zero |= is_zero & negative;
    pos_zero |= is_zero & static_cast<__mmask16>(~negative);
  }
  if (nan != 0) return i0;
  alignas(64) float l[16], h[16];
  _mm512_store_ps(l, vlo);
  _mm512_store_ps(h, vhi);
  fold_lanes(l, h, neg_zero != 0, pos_zero != 0, lo, hi);
  return n16;
}
#endif

template <class T>
void minmax_impl(const Tensor& x, const Tensor& run_min, const Tensor& run_max, std::int64_t axis, double c) {
  const AxisLayout v = AxisLayout::of(x.shape(), axis);
  const T* px = static_cast<const T*>(x.data_ptr());
  float* mn = run_min.data<float>();
  float* mx = run_max.data<float>();
  const float cf = static_cast<float>(c);
  const bool moving = c >= 0.0;
  [[maybe_unused]] const bool wide = use_avx512();
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
    std::int64_t i = i0;
    if constexpr (std::is_same_v<T, float>) {
#if QGRAD_CPU_AVX512
      if (wide) i = minmax16_f32(row, i0, i1, lo, hi);
#endif
      if (i == i0) i = minmax_f32(row, i0, i1, lo, hi);
    }
    for (; i < i1; ++i) {
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
                     double averaging_constant, const ObserverQparams* q) {
  dispatch_floating(x.dtype(), "observer_minmax", [&](auto tag) {
    minmax_impl<typename decltype(tag)::type>(x, run_min, run_max, axis, averaging_constant);
  });
  if (q) observer_qparams(run_min, run_max, q->scale, q->zero_point, q->qmin, q->qmax, q->symmetric,
                          q->symmetric_zero_point);
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
