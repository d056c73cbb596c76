// The CUDA side of kernels::for_each_column_sum (kernels/loop.h): column
// sums in formulas::lane_sum's order, 32 columns by 32 lanes per block.
// Thread (column c, lane l) sums term(r, i) for r = l, l + 32, ... below
// count(i), in order; then the lanes combine through shared memory as
// lane_sum's tree (s[l] += s[l + h], h = 16 .. 1). Same operations on the
// same operands as the CPU loop, so the same bits; and the 32 threads of a
// warp read 32 adjacent columns of one row (coalesced), where a thread per
// column walked its column alone (one latency per row).
#pragma once

#include <cstdint>

#include "qgrad/core/cuda/common.cuh"

namespace qgrad::kernels::cuda {

template <class F>
__global__ void column_sum_kernel(std::int64_t cols, F f) {
  ::qgrad::cuda::wait_for_prior_kernels();
  using M = typename F::Acc;
  __shared__ M s[32][33];  // [lane][column], padded against bank conflicts
  const unsigned c = threadIdx.x, l = threadIdx.y;
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * 32 + c;
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
void launch_column_sum(int device, std::int64_t cols, F f) {
  if (cols <= 0) return;
  const std::int64_t blocks = (cols + 31) / 32;
  QGRAD_CHECK(blocks <= 0x7fffffff, "column_sum", "cols", "too many columns: ", cols);
  ::qgrad::cuda::launch_kernel(device, column_sum_kernel<F>, static_cast<unsigned>(blocks), dim3(32, 32), 0, cols, f);
}

}  // namespace qgrad::kernels::cuda
