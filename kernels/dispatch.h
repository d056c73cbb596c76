// Device dispatch for kernels: each op's kernel has a cpu:: and a cuda::
// implementation; QGRAD_ON_CUDA compiles the CUDA call away in a build
// without CUDA (where no CUDA tensor can exist).
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
