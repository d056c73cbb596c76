// QGRAD_ON_CUDA(call): a call into the CUDA-only code (the hand-written
// kernels of kernels/cuda/entries.h, the CUDA branch of kernels/loop.h),
// compiled away in a build without CUDA, where it throws instead (no CUDA
// tensor can exist there).
#pragma once

#include "qgrad/core/error.h"

namespace qgrad::kernels {
[[noreturn]] inline void no_cuda_build(const char* where) {
  throw Error(where, "device", "qgrad was built without CUDA");
}
}  // namespace qgrad::kernels

#if QGRAD_WITH_CUDA
#define QGRAD_ON_CUDA(call) call
#else
#define QGRAD_ON_CUDA(call) ::qgrad::kernels::no_cuda_build(__func__)
#endif
