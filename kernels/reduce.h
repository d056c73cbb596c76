// Kernels of the reductions over one axis. A tensor reduced over an axis is
// viewed as the AxisLayout [outer, channels, inner] (channels the axis
// length, kernels/layout.h); a full reduction is outer = inner = 1.
#pragma once

#include <cstdint>

#include "qgrad/core/macros.h"
#include "qgrad/core/tensor.h"
#include "qgrad/kernels/deferred.h"
#include "qgrad/kernels/layout.h"

namespace qgrad::kernels {

// Loads per step of the in-order sums below: all of them are issued before
// the first add, so a CUDA thread waits for one memory round trip per batch
// instead of one per element (a lone thread summing the 256 partials of a
// batch-norm channel was latency-bound at ~110 ns an element, H100). The
// additions keep their order: the same bits as the plain loop. The last
// partial batch is loaded the same way (a sum of 6 elements was 6 round trips
// in a row). Sums run by many threads at once (bandwidth-bound) take 8; the
// few long sums of a reduction's last levels take kSumLoadBatchLong.
inline constexpr int kSumLoadBatch = 8;
inline constexpr int kSumLoadBatchLong = 32;

// Sum of f(x[r * stride]) over r = 0, 1, ..., n - 1, in order, in op math
// (f takes and gives op math).
template <int Batch = kSumLoadBatch, class T, class F>
QGRAD_HD op_math_t<T> sum_strided_map(const T* x, std::int64_t n, std::int64_t stride, F f) {
  using M = op_math_t<T>;
  M acc = M(0);
  std::int64_t r = 0;
  for (; r + Batch <= n; r += Batch) {
    T v[Batch];
    QGRAD_UNROLL
    for (int k = 0; k < Batch; ++k) v[k] = x[(r + k) * stride];
    QGRAD_UNROLL
    for (int k = 0; k < Batch; ++k) acc += f(M(v[k]));
  }
  if (r < n) {  // the last n - r < Batch: their loads issued together too (past n: x[r] again, unused)
    T v[Batch];
    QGRAD_UNROLL
    for (int k = 0; k < Batch; ++k) v[k] = x[(r + k < n ? r + k : r) * stride];
    QGRAD_UNROLL
    for (int k = 0; k < Batch; ++k)
      if (r + k < n) acc += f(M(v[k]));
  }
  return acc;
}

struct PlainTerm {
  template <class M>
  QGRAD_HD M operator()(M v) const {
    return v;
  }
};

// Sum of n elements `stride` apart, in order, in op math.
template <int Batch = kSumLoadBatch, class T>
QGRAD_HD op_math_t<T> sum_strided(const T* x, std::int64_t n, std::int64_t stride) {
  return sum_strided_map<Batch>(x, n, stride, PlainTerm{});
}

// First index of the largest of n >= 1 elements `stride` apart; NaN wins.
template <class T>
QGRAD_HD std::int64_t argmax_strided(const T* x, std::int64_t n, std::int64_t stride) {
  using M = op_math_t<T>;
  M best = M(x[0]);
  std::int64_t arg = 0;
  for (std::int64_t r = 1; r < n && best == best; ++r) {
    const M cur = M(x[r * stride]);
    if (cur > best || cur != cur) {
      best = cur;
      arg = r;
    }
  }
  return arg;
}

// out[o, j] = sum_r in[o, r, j] (divided by n when mean), accumulated in
// op_math_t<T> in a fixed order (deterministic). in and out share a floating
// dtype and a device; out has outer * inner elements.
// With `defer` (kernels/deferred.h), the finishing pass of a CUDA column sum
// (inner > 1) summed in chunks, without a mean, is queued there (out is
// written by defer->flush()), over the chunk partials the kernel that wrote
// `in` left there where it did (outer == 1), else over its own.
void sum_axis(const Tensor& in, const Tensor& out, const AxisLayout& v, bool mean, DeferredPasses* defer = nullptr);
// out[o, r, j] = in[o, j] * scale (the backward of sum / mean).
void expand_axis(const Tensor& in, const Tensor& out, const AxisLayout& v, double scale);
// out[o, j] = the first r where in[o, r, j] is largest (NaN counts as
// largest); out is s64. n >= 1.
void argmax_axis(const Tensor& in, const Tensor& out, const AxisLayout& v);

}  // namespace qgrad::kernels
