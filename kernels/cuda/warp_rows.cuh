// One warp per row: the launch and the warp reductions shared by the
// warp-per-row kernels (softmax.cu, attention.cu, loop.h's for_each_row_sum).
#pragma once

#include <cstdint>
#include <limits>
#include <type_traits>

#include "qgrad/core/cuda/common.cuh"
#include "qgrad/kernels/formulas/softmax.h"

namespace qgrad::kernels::cuda {

template <class F>
__global__ void warp_rows_kernel(std::int64_t rows, F f) {
  ::qgrad::cuda::wait_for_prior_kernels();
  const std::int64_t warps = (static_cast<std::int64_t>(gridDim.x) * blockDim.x) >> 5;
  const int lane = static_cast<int>(threadIdx.x & 31u);
  for (std::int64_t row = (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5; row < rows;
       row += warps)
    f(row, lane);
}

// Runs f(row, lane) for every row, one full warp per row.
template <class F>
void launch_warp_rows(int device, std::int64_t rows, F f) {
  if (rows <= 0) return;
  constexpr unsigned threads = 256;
  const unsigned blocks =
      ::qgrad::cuda::blocks_for(rows * 32, threads, ::qgrad::cuda::fill_blocks(device, threads) * 4LL);
  ::qgrad::cuda::launch_kernel(device, warp_rows_kernel<F>, blocks, threads, 0, rows, f);
}

// The longest row, in elements a lane, that a warp holds in registers.
constexpr int kLaneRowHeld = 32;

// A warp's view of a contiguous row of d elements in formulas::lane_sum's
// order: lane l takes elements l, l + 32, ... (n of them), in op math. kHeld
// (d <= 32 * kLaneRowHeld): loaded into registers at construction, every
// load issued before the first use, so a kernel that walks the row several
// times reads memory once (walking memory each time, layer_norm, rms_norm and
// softmax over rows of 1024 f32 ran at 44-48% of copy bandwidth). Otherwise
// each access reads memory (L1 after the first walk).
template <class T, bool kHeld>
struct LaneRow {
  using M = op_math_t<T>;
  const T* p;
  int lane;
  int n;
  M v[kHeld ? kLaneRowHeld : 1];
  __device__ __forceinline__ LaneRow(const T* row, std::int64_t d, int lane_)
      : p(row), lane(lane_), n(lane_ < d ? static_cast<int>((d - 1 - lane_) / 32 + 1) : 0) {
    if constexpr (kHeld) {
#pragma unroll
      for (int t = 0; t < kLaneRowHeld; ++t) v[t] = t < n ? M(p[lane + 32 * t]) : M(0);
    }
  }
  __device__ __forceinline__ M operator[](int t) const {
    if constexpr (kHeld) return v[t];
    else return M(p[index(t)]);
  }
  // The element's place in the row.
  __device__ __forceinline__ std::int64_t index(int t) const { return lane + 32 * static_cast<std::int64_t>(t); }
  // f(t) for the lane's elements t = 0 .. n - 1, in order.
  template <class F>
  __device__ __forceinline__ void each(F f) const {
    if constexpr (kHeld) {
#pragma unroll
      for (int t = 0; t < kLaneRowHeld; ++t)
        if (t < n) f(t);
    } else {
      for (int t = 0; t < n; ++t) f(t);
    }
  }
};

// Calls f(std::bool_constant<held>) with held true where a row of d elements
// of T fits LaneRow's registers (f64 rows are never held: twice the registers).
template <class T, class F>
void with_lane_row(std::int64_t d, F f) {
  if constexpr (sizeof(T) <= 4) {
    if (d <= 32 * kLaneRowHeld) {
      f(std::true_type{});
      return;
    }
  }
  f(std::false_type{});
}

// Butterfly sum: every lane gets the same total.
template <class M>
__device__ __forceinline__ M warp_sum(M v) {
  for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
  return v;
}

// A warp shuffle s of an accumulator: a number, or a struct of numbers
// (batch norm's moments) whose fields(s) shuffles each field.
template <class M, class S>
__device__ __forceinline__ M shuffle_acc(const M& v, S s) {
  if constexpr (std::is_arithmetic_v<M>)
    return s(v);
  else
    return v.fields(s);
}

// The tree of formulas::lane_sum (s[l] += s[l + h], h = 16 .. 1) over the
// lanes' partial sums, broadcast from lane 0: with lane l summing r = l,
// l + 32, ... in order, the same bits as lane_sum on the CPU.
template <class M>
__device__ __forceinline__ M warp_lane_sum(M v) {
  for (int h = 16; h > 0; h >>= 1) v += shuffle_acc(v, [h](auto x) { return __shfl_down_sync(0xffffffffu, x, h); });
  return shuffle_acc(v, [](auto x) { return __shfl_sync(0xffffffffu, x, 0); });
}

// for_each_row_sum's warp body (kernels/loop.h): lane l sums f.term(r, row)
// for r = l, l + 32, ... in order, then warp_lane_sum's tree: the order of
// formulas::lane_sum.
template <class F>
struct RowLaneSum {
  F f;
  __device__ void operator()(std::int64_t row, int lane) const {
    using M = typename F::Acc;
    const std::int64_t n = f.count(row);
    M acc = M(0);
    for (std::int64_t r = lane; r < n; r += 32) acc += f.term(r, row);
    acc = warp_lane_sum(acc);
    if (lane == 0) f.write(row, acc);
  }
};

template <class M>
__device__ __forceinline__ M warp_max(M v) {
  for (int m = 16; m > 0; m >>= 1) v = formulas::max_nan(v, __shfl_xor_sync(0xffffffffu, v, m));
  return __shfl_sync(0xffffffffu, v, 0);
}

}  // namespace qgrad::kernels::cuda
