// Raw device memory: the allocator and byte copies between devices.
// Host-safe declarations; the CUDA side lives in core/cuda/runtime.cu.
#pragma once

#include <cstddef>

#include "qgrad/core/device.h"

namespace qgrad::memory {

// Allocates `bytes` on `device` (CPU: aligned to 64 bytes; CUDA: from the
// caching allocator, 256-byte aligned). Throws qgrad::OutOfMemory.
void* allocate(std::size_t bytes, Device device);
void release(void* ptr, Device device) noexcept;

// Copies bytes. Host -> device and device -> device are queued on the
// device's stream; device -> host waits for the stream (the only host sync).
void copy(void* dst, Device dst_device, const void* src, Device src_device, std::size_t bytes);

}  // namespace qgrad::memory
