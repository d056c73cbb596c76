// Launch helpers for elementwise CUDA kernels, and the loads they share.
#pragma once

#include <cstdint>
#include <mutex>

#include "qgrad/core/cuda/common.cuh"
#include "qgrad/kernels/bitmask.h"
#include "qgrad/kernels/vec4.h"

namespace qgrad::kernels::cuda {

template <class F>
__global__ void elementwise_kernel(std::int64_t n, F f) {
  ::qgrad::cuda::wait_for_prior_kernels();
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) f(i);
}

// launch_elementwise_once's kernel: the same loop, run once by each thread
// of a one-pass grid, not unrolled: unrolling needs the trip count, a 64-bit
// division before the first index (cat's one-pass copies paid 5% for it:
// 0.0383 ms against 0.0363, H200). (A loop, not an `if`: without one ptxas
// sank MapFour's second vector load below the math on the first.)
template <class F>
__global__ void elementwise_once_kernel(std::int64_t n, F f) {
  ::qgrad::cuda::wait_for_prior_kernels();
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
#pragma unroll 1
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) f(i);
}

// Blocks of `threads` threads that one SM holds at once with `kernel`'s
// registers and shared memory.
template <class K>
int resident_blocks(K kernel, unsigned threads) {
  int blocks = 0;
  QGRAD_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, static_cast<int>(threads), 0));
  return blocks > 0 ? blocks : 1;
}

// Runs f(i) for i in [0, n) on the device's stream (grid-stride loop over
// four waves of resident blocks). One element per thread is too little work
// for a grid that covers the range once: relu's backward over 64M f32 took
// 0.370 ms that way against 0.258 on this grid (H100, 2026-11-24); the
// vectorised bodies take launch_elementwise_once. The waves count the
// blocks this kernel's registers let an SM hold (asked once per
// instantiation), not 2048 / 256: a body over 32 registers a thread fits
// fewer, and a grid sized for 8 a SM would end in a partial wave.
template <class F>
void launch_elementwise(int device, std::int64_t n, F f) {
  if (n <= 0) return;
  constexpr unsigned threads = 256;
  static const int per_sm = resident_blocks(elementwise_kernel<F>, threads);
  const unsigned blocks =
      ::qgrad::cuda::blocks_for(n, threads, 4LL * per_sm * ::qgrad::cuda::multiprocessor_count(device));
  ::qgrad::cuda::launch_kernel(device, elementwise_kernel<F>, blocks, threads, 0, n, f);
}

// launch_elementwise for bodies that move 16 bytes per operand an index (a
// Vec4 of f32, a 16-byte copy unit): a grid that covers [0, n) once, one
// index a thread, as PyTorch's vectorised kernels run. gelu's backward over
// [8192, 1024] f32: 0.0271 ms against 0.0278 on four whole waves; cat's
// 16-byte copies 0.0360 against 0.0371 (H200, dev/cuda/elementwise_pass.cu).
template <class F>
void launch_elementwise_once(int device, std::int64_t n, F f) {
  if (n <= 0) return;
  constexpr unsigned threads = 256;
  constexpr std::int64_t kMaxBlocks = (std::int64_t{1} << 31) - 1;
  if (n > kMaxBlocks * threads) return launch_elementwise(device, n, f);  // past one grid: grid-stride
  const unsigned blocks = ::qgrad::cuda::blocks_for(n, threads, kMaxBlocks);
  ::qgrad::cuda::launch_kernel(device, elementwise_once_kernel<F>, blocks, threads, 0, n, f);
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

// map_elements_masked on CUDA (kernels/loop.h): one warp per 128-element
// mask block (kernels/bitmask.h), each lane four consecutive elements (one
// Vec4 load and store when aligned and whole): out[i] = f(i, a[i], bit), and
// mask word k of the block is one __ballot_sync over the lanes' k-th bits,
// stored by lane 0 (no atomics; words null: no ballots). One block a warp on a
// grid that covers the tensor once: relu's 64M f32 took 0.1813 ms this way on
// an H100, the copy rate, against 0.1886 ms with four blocks a warp on four
// waves of resident blocks.
template <class T, class F, bool kVec>
__global__ void masked_map_kernel(const T* __restrict__ a, T* __restrict__ out, std::uint32_t* __restrict__ words,
                                  std::int64_t n, F f) {
  ::qgrad::cuda::wait_for_prior_kernels();
  const unsigned lane = threadIdx.x & 31u;
  const std::int64_t nwarps = (static_cast<std::int64_t>(gridDim.x) * blockDim.x) >> 5;
  const std::int64_t nblocks = bitmask_blocks(n);
  for (std::int64_t b = (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5; b < nblocks;
       b += nwarps) {  // b depends on the warp only: whole warps iterate together
    const std::int64_t i0 = b * kBitmaskBlock + 4 * static_cast<std::int64_t>(lane);
    const bool whole = kVec && i0 + 3 < n;
    Vec4<T> v;
    if (whole) {
      v = *reinterpret_cast<const Vec4<T>*>(a + i0);
    } else {
#pragma unroll
      for (int k = 0; k < 4; ++k) v.v[k] = i0 + k < n ? a[i0 + k] : T{};
    }
    Vec4<T> o;
    bool bit[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      bit[k] = false;
      o.v[k] = f(i0 + k, v.v[k], bit[k]);
      bit[k] = bit[k] && i0 + k < n;
    }
    if (whole) {
      *reinterpret_cast<Vec4<T>*>(out + i0) = o;
    } else {
#pragma unroll
      for (int k = 0; k < 4; ++k)
        if (i0 + k < n) out[i0 + k] = o.v[k];
    }
    if (words != nullptr) store_mask_block(words, b, bit, lane);  // uniform across the warp
  }
}

template <class T, class F>
void launch_masked_map(int device, std::int64_t n, const T* a, T* out, std::uint32_t* words, F f) {
  if (n <= 0) return;
  constexpr unsigned threads = 256;
  const unsigned blocks = ::qgrad::cuda::blocks_for(bitmask_blocks(n) * 32, threads);
  if (vec4_aligned<T>(a) && vec4_aligned<T>(out))
    ::qgrad::cuda::launch_kernel(device, masked_map_kernel<T, F, true>, blocks, threads, 0, a, out, words, n, f);
  else
    ::qgrad::cuda::launch_kernel(device, masked_map_kernel<T, F, false>, blocks, threads, 0, a, out, words, n, f);
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
