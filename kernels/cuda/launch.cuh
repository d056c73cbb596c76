// Launch helpers for elementwise CUDA kernels, and the loads they share.
#pragma once

#include <cstdint>
#include <mutex>

#include "qgrad/core/cuda/common.cuh"
#include "qgrad/kernels/bitmask.h"

namespace qgrad::kernels::cuda {

template <class F>
__global__ void elementwise_kernel(std::int64_t n, F f) {
  ::qgrad::cuda::wait_for_prior_kernels();
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) f(i);
}

// Runs f(i) for i in [0, n) on the device's stream (grid-stride loop over
// four waves of resident blocks). One element per thread is too little work
// for a grid that covers the range once: relu's backward over 64M f32 took
// 0.370 ms that way against 0.258 on this grid (H100, 2026-11-24); the
// vectorised kernels (four elements per thread) are the ones that gain from
// a single pass.
template <class F>
void launch_elementwise(int device, std::int64_t n, F f) {
  if (n <= 0) return;
  constexpr unsigned threads = 256;
  const unsigned blocks = ::qgrad::cuda::blocks_for(n, threads, ::qgrad::cuda::fill_blocks(device, threads) * 4LL);
  ::qgrad::cuda::launch_kernel(device, elementwise_kernel<F>, blocks, threads, 0, n, f);
}

// 16 bytes of a weight stream read once: not kept in L1 (no other warp of the
// SM reads them).
__device__ __forceinline__ uint4 ld_stream16(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

// The four words of 128-element mask block b when lane l holds the block's
// elements 4l .. 4l + 3 with their bits: word k is the ballot of the lanes'
// k-th bits. Every lane of the warp calls it; lane 0 stores.
__device__ __forceinline__ void store_mask_block(std::uint32_t* mask, std::int64_t b, const bool (&bit)[4],
                                                 unsigned lane) {
  uint4 words;
  words.x = __ballot_sync(0xffffffffu, bit[0]);
  words.y = __ballot_sync(0xffffffffu, bit[1]);
  words.z = __ballot_sync(0xffffffffu, bit[2]);
  words.w = __ballot_sync(0xffffffffu, bit[3]);
  if (lane == 0) *reinterpret_cast<uint4*>(mask + b * kBitmaskWordsPerBlock) = words;
}

// Past 48 KiB a kernel's dynamic shared memory must be allowed
// (cudaFuncAttributeMaxDynamicSharedMemorySize): once per kernel and device,
// the kernel a template argument so that each instantiation has its own flags.
template <auto kKernel>
void allow_dynamic_smem(int device, int bytes) {
  static std::once_flag once[64];
  auto allow = [bytes] {
    QGRAD_CUDA_CHECK(cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  };
  if (device >= 0 && device < 64) std::call_once(once[device], allow);
  else allow();
}

}  // namespace qgrad::kernels::cuda
