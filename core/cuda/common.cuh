// Helpers for qgrad's CUDA kernels: error checking, the per-device stream,
// launch geometry and vectorized access.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "qgrad/core/error.h"

namespace qgrad::cuda {

[[noreturn]] void throw_cuda_error(cudaError_t err, const char* what, const char* file, int line);

// The stream every qgrad op on `device` runs on: the device's main stream,
// or its side stream inside a SideStreamScope of this thread (core/device.h;
// both created on first use, non-blocking). Also makes `device` current for
// the calling thread.
cudaStream_t stream(int device);
// The stream this thread's launches on `device` go to now, numbered across
// devices (2 * device, + 1 for the side stream): the index of a library
// handle bound to that stream (cuBLAS, cuDNN keep one per stream).
std::size_t stream_slot(int device);

// Makes `device` current for the scope.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

inline unsigned blocks_for(std::int64_t n, unsigned threads, std::int64_t max_blocks = 65535LL * 32) {
  std::int64_t b = (n + threads - 1) / threads;
  if (b < 1) b = 1;
  if (b > max_blocks) b = max_blocks;
  return static_cast<unsigned>(b);
}

// The device's streaming multiprocessors; cached per device.
int multiprocessor_count(int device);
// The device's L2 cache in bytes; cached per device.
int l2_cache_bytes(int device);
// Whether the device runs cooperative launches (launch_cooperative_kernel); cached.
bool cooperative_launch(int device);

// Number of resident blocks that fill the device for a given block size
// (for grid-stride kernels).
unsigned fill_blocks(int device, unsigned threads);

// kBlockCounters zero-initialised device words of `device`, for kernels
// whose last block to finish does a final step (the "last block" pattern:
// each block bumps a counter after its work; the one that sees the final
// count does the rest and sets the counter back to 0). Kernels on the
// device's one stream run one after another, so they can share them; every
// kernel must leave the words it used at 0.
inline constexpr std::size_t kBlockCounters = 65536;
std::uint32_t* block_counters(int device);

// Whether qgrad's kernels on `device` launch as programmatic dependents of the
// kernel before them (Hopper or newer, and cuda_set_programmatic_launch(true),
// the default).
bool programmatic_launch(int device);

}  // namespace qgrad::cuda

#define QGRAD_CUDA_CHECK(expr)                                                         \
  do {                                                                                 \
    cudaError_t qgrad_err_ = (expr);                                                   \
    if (qgrad_err_ != cudaSuccess) ::qgrad::cuda::throw_cuda_error(qgrad_err_, #expr, __FILE__, __LINE__); \
  } while (0)

namespace qgrad::cuda {

// Programmatic dependent launch. Every qgrad kernel starts with this call and
// every launch goes through launch_kernel() below, which lets the kernel's
// blocks become resident while the kernel before it on the stream still runs
// (its launch, block dispatch and parameter loads overlap that kernel's tail;
// a captured step's gaps between kernel nodes shrink). `wait` returns once
// every earlier grid of the stream has finished and its writes are visible,
// and comes before any memory access of the kernel, so stream order still
// holds for reads and writes alike (including blocks the allocator reuses).
// `launch_dependents` then lets the next kernel's launch begin; placed after
// the wait, at most one kernel waits ahead of the running one.
// tests/test_kernel_sources.cpp checks that every kernel starts with it.
__device__ __forceinline__ void wait_for_prior_kernels() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// The one exception to waiting first. A kernel may do work before the wait
// that touches no global memory a running grid could write: its shared
// memory, its parameters, and inputs that its launcher knows the grid just
// before it does not write (an op that launched that grid itself, and knows
// what it writes). Every qgrad kernel signals its dependents only after its
// own wait, so once this kernel runs, only the grid just before it can still
// be running: every earlier grid has finished. Declared as the kernel's
// first statement (tests/test_kernel_sources.cpp accepts it there and looks
// for its wait()); every thread calls wait() before any other access.
struct DeferredPriorWait {
  __device__ __forceinline__ void wait() const { wait_for_prior_kernels(); }
};

// Launches kernel<<<grid, block, smem, stream(device)>>>(args...) (with the
// programmatic-dependent-launch attribute where programmatic_launch(device),
// and the cooperative one where asked) and checks the launch.
template <class... Params, class... Args>
void launch_kernel_with(int device, bool cooperative, void (*kernel)(Params...), dim3 grid, dim3 block,
                        std::size_t smem, Args&&... args) {
  cudaLaunchAttribute attribute[2];
  unsigned count = 0;
  if (programmatic_launch(device)) {
    attribute[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute[count++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cooperative) {
    attribute[count].id = cudaLaunchAttributeCooperative;
    attribute[count++].val.cooperative = 1;
  }
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream(device);
  config.attrs = attribute;
  config.numAttrs = count;
  QGRAD_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

template <class... Params, class... Args>
void launch_kernel(int device, void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t smem, Args&&... args) {
  launch_kernel_with(device, false, kernel, grid, block, smem, std::forward<Args>(args)...);
}

// launch_kernel with every block of `grid` resident at once, so the kernel
// may wait at a grid-wide barrier (cooperative_groups::this_grid().sync()).
// The caller sizes the grid to what stays resident
// (cudaOccupancyMaxActiveBlocksPerMultiprocessor) and checks
// cooperative_launch(device) first.
template <class... Params, class... Args>
void launch_cooperative_kernel(int device, void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t smem,
                               Args&&... args) {
  launch_kernel_with(device, true, kernel, grid, block, smem, std::forward<Args>(args)...);
}

}  // namespace qgrad::cuda
