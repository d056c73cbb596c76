// Kernels of the W8A8 quantized linear (ops/quantized_linear.h): the int8
// GEMM with int32 accumulation and the float epilogue
//   out[m, n] = acc[m, n] * (sa[m] * sw[n]) + bias[n]    (kernels/formulas/qlinear.h)
#pragma once

#include <cstdint>

#include "qgrad/core/tensor.h"

namespace qgrad::kernels {

struct QLinearEpilogue {
  // Activation scale: f32 or f64. Per row ([M], on the output's device) when
  // per_row; otherwise one element, on the output's device (read by the
  // kernel) or on the host (read by the host: a host scalar).
  Tensor sa;
  bool per_row = true;
  Tensor sw;    // f32 [N], output's device
  Tensor bias;  // undefined, or [N] in the epilogue math dtype (f64 for an f64 output, else f32)
  // Asymmetric per-token activations: za s32 [M] (per row) and wsum s32 [N]
  // (row sums of the weight), both on the output's device; undefined otherwise.
  Tensor za;
  Tensor wsum;
  // True where the kernel launched just before qlinear() on the stream writes
  // no weight (quantized_linear's own activation quantization, which writes
  // only a, sa, za): the GEMM may then start loading w before waiting for that
  // kernel (core/cuda/common.cuh, DeferredPriorWait). Never set it where a
  // kernel writing w may run just before.
  bool w_untouched_by_prior_kernel = false;
};

// wsum[n] = sum_k w[n, k] for w s8 [N, K] contiguous, into s32 [N] (w's device).
void qlinear_weight_row_sums(const Tensor& w, const Tensor& wsum);

// Row stride (in elements) the quantized activation must have for this
// device: K on the CPU, K rounded up to 16 on CUDA (cuBLASLt int8 alignment;
// the pad columns hold zeros).
std::int64_t qlinear_lda(Device device, std::int64_t K);

// out [M, N] (f32, f64, f16, bf16) = epilogue(a [M, lda] s8 (K used) x w^T),
// w s8 [N, K] contiguous.
void qlinear(const Tensor& a, std::int64_t lda, std::int64_t K, const Tensor& w, const QLinearEpilogue& ep,
             const Tensor& out);

namespace cpu {
void qlinear(const Tensor& a, std::int64_t lda, std::int64_t K, const Tensor& w, const QLinearEpilogue& ep,
             const Tensor& out);
}  // namespace cpu
namespace cuda {
void qlinear(const Tensor& a, std::int64_t lda, std::int64_t K, const Tensor& w, const QLinearEpilogue& ep,
             const Tensor& out);
}  // namespace cuda

}  // namespace qgrad::kernels
