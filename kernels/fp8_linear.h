// Kernels of the FP8 linear (ops/fp8_linear.h):
//   1. x's per-tensor scale: given, or sx = max(amax(x), 1e-12) / 448
//      computed on x's device (formulas/fp8_linear.h: no host sync);
//   2. x quantized to e4m3 rows of stride ld (pad columns zero);
//   3. the FP8 GEMM with the scales and the bias in its epilogue
//      (CUDA: cuBLASLt, kernels/cuda/fp8_gemm.cu; CPU: fp8 products in f32,
//      summed in f64, the epilogue of formulas::fp8_linear_epilogue).
// Steps 1 and 2 are bit-identical across devices; step 3 is not (the GEMM's
// accumulation order; docs/ops.md, "fp8_linear").
#pragma once

#include <cstdint>

#include "qgrad/core/tensor.h"

namespace qgrad::kernels {

// Row stride of the quantized activation and the weight on `device`: K on
// the CPU, K rounded up to 16 on CUDA (cuBLASLt's FP8 alignment).
std::int64_t fp8_linear_ld(Device device, std::int64_t K);

// x (f32 / bf16 / f16, contiguous, M * K elements, M >= 1) -> q f8e4m3
// [M, ld] with columns K.. zero. dynamic: writes scale (f32 [1], x's
// device) from x's amax; otherwise reads it.
void fp8_quantize_rows(const Tensor& x, std::int64_t K, const Tensor& scale, bool dynamic, const Tensor& q,
                       std::int64_t ld);

// out [M, N] (bf16 or f32, contiguous) = (q [M, ld] . w [N, K]^T) * (sx * sw)
// + bias; q and w f8e4m3 (w contiguous), sx / sw f32 one element on out's
// device, bias undefined or bf16 [N].
void fp8_gemm(const Tensor& q, std::int64_t ld, std::int64_t K, const Tensor& w, const Tensor& sx, const Tensor& sw,
              const Tensor& bias, const Tensor& out);

namespace cpu {
void fp8_quantize_rows(const Tensor& x, std::int64_t K, const Tensor& scale, bool dynamic, const Tensor& q,
                       std::int64_t ld);
void fp8_gemm(const Tensor& q, std::int64_t ld, std::int64_t K, const Tensor& w, const Tensor& sx, const Tensor& sw,
              const Tensor& bias, const Tensor& out);
}  // namespace cpu
namespace cuda {
void fp8_quantize_rows(const Tensor& x, std::int64_t K, const Tensor& scale, bool dynamic, const Tensor& q,
                       std::int64_t ld);
void fp8_gemm(const Tensor& q, std::int64_t ld, std::int64_t K, const Tensor& w, const Tensor& sx, const Tensor& sw,
              const Tensor& bias, const Tensor& out);
}  // namespace cuda

}  // namespace qgrad::kernels
