// Helpers for qgrad's CUDA kernels: error checking, the per-device stream,
// launch geometry and vectorized access.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "core/error.h"

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

}  // namespace qgrad::cuda

#define QGRAD_CUDA_CHECK(expr)                                                         \
  do {                                                                                 \
    cudaError_t qgrad_err_ = (expr);                                                   \
    if (qgrad_err_ != cudaSuccess) ::qgrad::cuda::throw_cuda_error(qgrad_err_, #expr, __FILE__, __LINE__); \
  } while (0)

// After every kernel launch.
#define QGRAD_LAUNCH_CHECK() QGRAD_CUDA_CHECK(cudaGetLastError())
