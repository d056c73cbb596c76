// The stable sort of embedding's backward on CUDA: CUB's radix sort of
// (key, position) pairs. A radix sort is stable, so equal keys keep their
// positions in increasing order: the one result std::stable_sort gives on the
// CPU. The rest of embedding is kernels/transformer.cpp.
#include <cub/device/device_radix_sort.cuh>

#include "qgrad/core/cuda/common.cuh"
#include "qgrad/kernels/cuda/entries.h"

namespace qgrad::kernels::cuda {

namespace {

constexpr unsigned kThreads = 256;

__global__ void iota_kernel(std::int64_t* out, std::int64_t n) {
  ::qgrad::cuda::wait_for_prior_kernels();
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) out[i] = i;
}

}  // namespace

void sort_keys_with_positions(const Tensor& keys, const Tensor& sorted, const Tensor& order) {
  const std::int64_t n = keys.numel();
  if (n == 0) return;
  const int dev = keys.device().index;
  cudaStream_t s = ::qgrad::cuda::stream(dev);
  const TensorOptions o = TensorOptions{}.with_dtype(DType::s64).with_device(keys.device());
  Tensor positions = Tensor::empty({n}, o);
  auto* pos = static_cast<std::int64_t*>(positions.data_ptr());
  ::qgrad::cuda::launch_kernel(dev, iota_kernel, ::qgrad::cuda::blocks_for(n, kThreads), kThreads, 0, pos, n);
  const auto* k_in = static_cast<const std::int64_t*>(keys.data_ptr());
  auto* k_out = static_cast<std::int64_t*>(sorted.data_ptr());
  auto* v_out = static_cast<std::int64_t*>(order.data_ptr());
  std::size_t bytes = 0;
  QGRAD_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, bytes, k_in, k_out, pos, v_out, n, 0, 64, s));
  // Workspace from the caching allocator, on the same stream.
  Tensor temp = Tensor::empty({static_cast<std::int64_t>(bytes) + 1},
                              TensorOptions{}.with_dtype(DType::u8).with_device(keys.device()));
  QGRAD_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.data_ptr(), bytes, k_in, k_out, pos, v_out, n, 0, 64, s));
}

}  // namespace qgrad::kernels::cuda
