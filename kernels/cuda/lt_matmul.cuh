// The f32 / f16 / bf16 GEMMs of matmul and linear through cuBLASLt, one
// kernel launch each, with the bias epilogues of linear fused in:
//   c[i] = op(a[i]) · op(b[i]) (+ c[i] with accumulate), GemmShape's
//   row-major convention (kernels/linalg.h), passed to cuBLASLt as the
//   column-major D (n x m) = op(b)ᵀ (n x k) · op(a)ᵀ (k x m), no copies.
// Epilogues (batch 1 only):
//   bias:        c[r, j] += vec[j] for every row r, before the one rounding
//                (CUBLASLT_EPILOGUE_BIAS: vec has D's row count n);
//   bias_grad_a: vec[i] = Σ_p op(a)[i, p], the reduction over the GEMM's k
//                (CUBLASLT_EPILOGUE_BGRADB: cuBLASLt's B is our a; vec has
//                D's column count m).
// vec has c's dtype. f32 computes in CUBLAS_COMPUTE_32F (no TF32), f16 and
// bf16 accumulate in f32 (scale type f32).
//
// Only algorithms whose split-K reduction stays inside the GEMM kernel
// (CUBLASLT_REDUCTION_SCHEME_NONE) are accepted, so each call is one launch.
// The algorithm and descriptors are chosen once per (device, dtype, shape,
// flags, epilogue, pointer alignments) and cached for the life of the
// process; the workspace the algorithm asks for comes from the caching
// allocator, so a call is safe under CUDA graph capture (no cudaMalloc, no
// sync). Returns false, having launched nothing, when cuBLASLt has no
// algorithm, rejects the call, or the dtype (f64) or shape (an empty
// dimension) is not handled here; the caller then runs its fallback.
#pragma once

#include "kernels/linalg.h"

namespace qgrad::kernels::cuda {

enum class LtEpilogue { none, bias, bias_grad_a };

bool lt_matmul(const GemmShape& s, const Tensor& a, const Tensor& b, const Tensor& c, bool accumulate,
               LtEpilogue epilogue = LtEpilogue::none, const Tensor& vec = Tensor());

}  // namespace qgrad::kernels::cuda
