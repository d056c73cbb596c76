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
// The float linear's workspace: enough for the split-K reductions of the
// shapes it serves, small beside the activations (it is allocated per call
// from the caching allocator and shows in the step's peak memory).
inline constexpr std::size_t kLtLinearWorkspaceBytes = std::size_t(4) << 20;

// The largest power of two (<= 256) dividing the address: cuBLASLt's
// heuristic assumes 256-byte aligned operands unless told otherwise.
inline unsigned lt_alignment(const void* p) {
  const auto u = reinterpret_cast<std::uintptr_t>(p);
  unsigned a = 256;
  while (a > 1 && (u % a) != 0) a /= 2;
  return a;
}

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

// The heuristic's first algorithm for desc over layouts a, b and d (C = D)
// within `workspace` bytes, told the operands' alignments (bytes) and the
// allowed split-K reduction schemes. False when cuBLASLt has none.
bool lt_heuristic_algo(cublasLtHandle_t h, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
                       cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t d, std::size_t workspace, unsigned align_a,
                       unsigned align_b, unsigned align_d, std::uint32_t reduction_schemes, cublasLtMatmulAlgo_t& algo);
// Up to kLtMaxAlgos algorithms, best first. (A fixed array: nvcc 13.0 fails
// on a std::vector of cublasLtMatmulAlgo_t, an unnamed struct.)
inline constexpr int kLtMaxAlgos = 8;
struct LtAlgos {
  cublasLtMatmulAlgo_t algo[kLtMaxAlgos];
  int count = 0;
};
// The heuristic's first max_count (<= kLtMaxAlgos) algorithms for the same
// (fewer when it offers fewer; none on an error).
LtAlgos lt_heuristic_algos(cublasLtHandle_t h, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
                           cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t d, std::size_t workspace, unsigned align_a,
                           unsigned align_b, unsigned align_d, std::uint32_t reduction_schemes, int max_count);

// The float linear with its bias in cuBLASLt's epilogue (CUBLASLT_EPILOGUE_BIAS):
//   out[M, N] (row-major) = x[M, K] (row-major) x w[N, K]^T + bias[N]
// in `type` (CUDA_R_32F, CUDA_R_16BF or CUDA_R_16F for all four operands),
// CUBLAS_COMPUTE_32F (f32 FMAs; with `tf32` and f32 operands
// CUBLAS_COMPUTE_32F_FAST_TF32: operands rounded to TF32, products summed in
// f32, a plan of its own), alpha 1: each output is the f32
// dot product plus the bias in f32, rounded once to `type` -- what the GEMM
// with beta 1 over a bias-filled output computes, without the fill pass and
// the read of it. For 16-bit types split-K partial sums are reduced in f32
// (no reduction in the output type). Plans (heuristic algorithm and
// descriptors) are cached per (device, type, shape, operand alignments).
// A plan's first call outside graph capture times the heuristic's first
// algorithm against its other split-K-free ones (up to 8) and keeps the
// fastest whose output has exactly the first one's bytes: the same bits,
// one synchronization per plan (lt_gemm.cu, tune_linear_plan).
// Returns false, launching nothing, when cuBLASLt has no algorithm for the
// shape; the caller then fills and runs the plain GEMM.
// With `residual` (non-null, `out`'s type and layout): out = (x wᵀ +
// residual) + bias in the same GEMM (beta 1, C = residual), used only where
// the plan's first call outside graph capture found its bytes, on made-up
// nonzero bias and residual, equal to linear_add's formula step by step
// (the product rounded to the type, then add's formula T(M(a) + M(b)) with
// the residual, then with the bias: kernels/linalg.h linear_bias_add);
// false otherwise (a plan first met inside a capture, or one whose epilogue
// rounds otherwise), and the caller runs the steps.
bool lt_linear_bias(int device, cudaDataType_t type, const void* x, const void* w, const void* bias, void* out,
                    std::int64_t M, std::int64_t N, std::int64_t K, void* workspace, std::size_t workspace_bytes,
                    const void* residual = nullptr, bool tf32 = false);

}  // namespace qgrad::kernels::cuda
