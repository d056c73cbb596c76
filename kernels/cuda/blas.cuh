// cuBLAS for qgrad's kernels: one handle per device and stream (main, side),
// created on first use, bound to that stream, default math mode (no TF32).
#pragma once

#include <cublas_v2.h>

#include "qgrad/core/cuda/common.cuh"

namespace qgrad::cuda {

// The handle of `device` for the stream its launches go to now. Thread-safe;
// the handles live until the process ends (never destroyed, so no
// teardown-order hazard with the runtime).
cublasHandle_t blas_handle(int device);

[[noreturn]] void throw_cublas_error(cublasStatus_t status, const char* what, const char* file, int line);

}  // namespace qgrad::cuda

#define QGRAD_CUBLAS_CHECK(expr)                                                           \
  do {                                                                                     \
    cublasStatus_t qgrad_st_ = (expr);                                                     \
    if (qgrad_st_ != CUBLAS_STATUS_SUCCESS)                                                \
      ::qgrad::cuda::throw_cublas_error(qgrad_st_, #expr, __FILE__, __LINE__);             \
  } while (0)
