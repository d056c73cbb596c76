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
