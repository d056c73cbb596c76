// Helpers for qgrad's CUDA kernels: error checking, the per-device stream,
// launch geometry and vectorized access.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "qgrad/core/error.h"

namespace qgrad::cuda {

[[noreturn]] void throw_cuda_error(cudaError_t err, const char* what, const char* file, int line);

// The stream every qgrad op on `device` runs on (created on first use,
// non-blocking). Also makes `device` current for the calling thread.
cudaStream_t stream(int device);

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

}  // namespace qgrad::cuda

#define QGRAD_CUDA_CHECK(expr)                                                         \
  do {                                                                                 \
    cudaError_t qgrad_err_ = (expr);                                                   \
    if (qgrad_err_ != cudaSuccess) ::qgrad::cuda::throw_cuda_error(qgrad_err_, #expr, __FILE__, __LINE__); \
  } while (0)

// After every kernel launch.
#define QGRAD_LAUNCH_CHECK() QGRAD_CUDA_CHECK(cudaGetLastError())
