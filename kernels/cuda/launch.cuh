// Launch helpers for elementwise CUDA kernels.
#pragma once

#include <cstdint>

#include "qgrad/core/cuda/common.cuh"

namespace qgrad::kernels::cuda {

template <class F>
__global__ void elementwise_kernel(std::int64_t n, F f) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) f(i);
}

// Runs f(i) for i in [0, n) on the device's stream (grid-stride loop).
template <class F>
void launch_elementwise(int device, std::int64_t n, F f) {
  if (n <= 0) return;
  constexpr unsigned threads = 256;
  cudaStream_t s = ::qgrad::cuda::stream(device);
  const unsigned blocks = ::qgrad::cuda::blocks_for(n, threads, ::qgrad::cuda::fill_blocks(device, threads) * 4LL);
  elementwise_kernel<<<blocks, threads, 0, s>>>(n, f);
  QGRAD_LAUNCH_CHECK();
}

}  // namespace qgrad::kernels::cuda
