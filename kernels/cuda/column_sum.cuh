// The CUDA side of kernels::for_each_column_sum (kernels/loop.h): column
// sums in formulas::lane_sum's order, 32 columns by 32 lanes per block.
// Thread (column c, lane l) sums term(r, i) for r = l, l + 32, ... below
// count(i), in order; then the lanes combine through shared memory as
// lane_sum's tree (s[l] += s[l + h], h = 16 .. 1). Same operations on the
// same operands as the CPU loop, so the same bits; and the 32 threads of a
// warp read 32 adjacent columns of one row (coalesced), where a thread per
// column walked its column alone (one latency per row).
//
// Sums of at most F::kMaxCount terms (a functor that declares it: the chunk
// partials of a long column sum, 64 rows) take column_sum_short_kernel: four
// threads per sum, thread q holding lanes q, q + 4, ..., q + 28 in registers
// with every load issued before the adds. lane_sum's tree levels 16, 8 and 4
// pair lanes of one thread; levels 2 and 1 are shuffles within the four. (The
// 32 x 32 block spent a five-level shared-memory tree on two loads a thread,
// a fifth of copy bandwidth on the ViT's bias gradients; one thread per sum
// held 64 loads and 32 lanes in registers and left too few warps in flight.)
// A warp reads 8 adjacent columns at 4 rows: whole 32-byte sectors. The same
// operations in the same order, so the same bits.
#pragma once

#include <cstdint>

#include "qgrad/core/cuda/common.cuh"
#include "qgrad/kernels/cuda/warp_rows.cuh"

namespace qgrad::kernels::cuda {

// Block `block` of column_sum_kernel (a 32 x 32 block): columns
// 32 * block .. + 31. Also the body of deferred.cu's batched finishes.
template <class F>
__device__ __forceinline__ void column_sum_block(std::int64_t cols, const F& f, std::int64_t block) {
  using M = typename F::Acc;
  __shared__ M s[32][33];  // [lane][column], padded against bank conflicts
  const unsigned c = threadIdx.x, l = threadIdx.y;
  const std::int64_t i = block * 32 + c;
  M acc = M(0);
  if (i < cols) {
    const std::int64_t n = f.count(i);
    for (std::int64_t r = l; r < n; r += 32) acc += f.term(r, i);
  }
  s[l][c] = acc;
  __syncthreads();
  for (unsigned h = 16; h > 0; h /= 2) {
    if (l < h) s[l][c] += s[l + h][c];
    __syncthreads();
  }
  if (l == 0 && i < cols) f.write(i, s[0][c]);
}

template <class F>
__global__ void column_sum_kernel(std::int64_t cols, F f) {
  ::qgrad::cuda::wait_for_prior_kernels();
  column_sum_block(cols, f, blockIdx.x);
}

template <class F>
concept BoundedColumnSum = requires { F::kMaxCount; };

template <class F>
__global__ void column_sum_short_kernel(std::int64_t cols, F f) {
  ::qgrad::cuda::wait_for_prior_kernels();
  using M = typename F::Acc;
  constexpr int kPerLane = static_cast<int>((F::kMaxCount + 31) / 32);
  constexpr int kGroup = 4, kHeld = 32 / kGroup;  // threads per sum, lanes per thread
  const std::int64_t sum = (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kGroup;
  const int q = static_cast<int>(threadIdx.x % kGroup);
  // Threads past the last sum still take part in the shuffles (on its column).
  const std::int64_t i = sum < cols ? sum : cols - 1;
  const std::int64_t n = f.count(i);
  // The terms are read unconditionally (a missing one at row n - 1, then
  // dropped): a guarded term kept its own copy of the functor's 64-bit index
  // divisions (not hoisted past a branch). Lane l's sum starts at +0, so is
  // never -0: adding the +0 of a missing term leaves it as skipping it does.
  M s[kHeld];
  if (n > 0) {
    M t[kPerLane][kHeld];
#pragma unroll
    for (int k = 0; k < kPerLane; ++k)
#pragma unroll
      for (int m = 0; m < kHeld; ++m) {
        const std::int64_t r = q + kGroup * m + 32 * k;
        const M v = f.term(r < n ? r : n - 1, i);
        t[k][m] = r < n ? v : M(0);
      }
#pragma unroll
    for (int m = 0; m < kHeld; ++m) {
      M acc = M(0);
#pragma unroll
      for (int k = 0; k < kPerLane; ++k) acc += t[k][m];
      s[m] = acc;
    }
  } else {
#pragma unroll
    for (int m = 0; m < kHeld; ++m) s[m] = M(0);
  }
  // Levels 16, 8, 4: lane q + 4m takes lane q + 4m + h, both held here.
#pragma unroll
  for (int level = 0; level < 3; ++level) {
    const int h = (kHeld / 2) >> level;  // 4, 2, 1 held slots = 16, 8, 4 lanes
#pragma unroll
    for (int m = 0; m < kHeld / 2; ++m)
      if (m < h) s[m] += s[m + h];
  }
  // Levels 2 and 1 across the group: lanes 0, 1 take lanes 2, 3; lane 0 takes 1.
  const M from2 = shuffle_acc(s[0], [](auto x) { return __shfl_down_sync(0xffffffffu, x, 2, kGroup); });
  if (q < 2) s[0] += from2;
  const M from1 = shuffle_acc(s[0], [](auto x) { return __shfl_down_sync(0xffffffffu, x, 1, kGroup); });
  if (q == 0) {
    s[0] += from1;
    if (sum < cols) f.write(i, s[0]);
  }
}

template <class F>
void launch_column_sum(int device, std::int64_t cols, F f) {
  if (cols <= 0) return;
  if constexpr (BoundedColumnSum<F>) {
    constexpr unsigned kThreads = 128;  // 32 sums
    const std::int64_t blocks = (4 * cols + kThreads - 1) / kThreads;
    QGRAD_CHECK(blocks <= 0x7fffffff, "column_sum", "cols", "too many columns: ", cols);
    ::qgrad::cuda::launch_kernel(device, column_sum_short_kernel<F>, static_cast<unsigned>(blocks), kThreads, 0, cols,
                                 f);
  } else {
    const std::int64_t blocks = (cols + 31) / 32;
    QGRAD_CHECK(blocks <= 0x7fffffff, "column_sum", "cols", "too many columns: ", cols);
    ::qgrad::cuda::launch_kernel(device, column_sum_kernel<F>, static_cast<unsigned>(blocks), dim3(32, 32), 0, cols, f);
  }
}

}  // namespace qgrad::kernels::cuda
