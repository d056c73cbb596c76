// The int8 tensor-core GEMM of quantized_linear, through cuBLASLt:
//   C[M, ldc] (s32, row-major) = A[M, lda] (s8, row-major) x W[N, ldw]^T (s8)
// over K columns. In cuBLASLt's column-major terms this is the "TN" int8
// IMMA layout: D (N x M, ld ldc) = op(W) (N x K, transposed) x A^T (K x M),
// CUBLAS_COMPUTE_32I, scale type CUDA_R_32I, alpha 1, beta 0: exact int32
// accumulation, no float rounding inside the GEMM, so the float epilogue can
// run on both devices with identical results.
//
// The heuristic's algorithm is chosen once per (device, shape, strides) and
// cached with its descriptors for the life of the process. The workspace is
// the caller's (kLtWorkspaceBytes, from the caching allocator).
// Requirements the caller guarantees: K, lda, ldw multiples of 16, ldc a
// multiple of 4, 16-byte aligned pointers. Returns false when cuBLASLt has no
// algorithm for the shape or rejects it; the caller then runs the fallback.
#pragma once

#include <cublasLt.h>

#include <cstddef>
#include <cstdint>
#include <mutex>

namespace qgrad::kernels::cuda {

inline constexpr std::size_t kLtWorkspaceBytes = std::size_t(32) << 20;

// The shared cuBLASLt state of the library's Lt GEMMs (this one and the FP8
// GEMM of kernels/cuda/fp8_gemm.cu): one handle per device for the life of
// the process, created on first use (a failure throws qgrad::Error naming
// `op`). Call lt_handle and touch the callers' plan caches with lt_mutex()
// held.
std::mutex& lt_mutex();
cublasLtHandle_t lt_handle(int device, const char* op);

bool lt_int8_gemm(int device, const std::int8_t* a, std::int64_t lda, const std::int8_t* w, std::int64_t ldw,
                  std::int32_t* c, std::int64_t ldc, std::int64_t M, std::int64_t N, std::int64_t K, void* workspace,
                  std::size_t workspace_bytes);

}  // namespace qgrad::kernels::cuda
