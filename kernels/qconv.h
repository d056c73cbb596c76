// Kernels of the int8 convolution (ops/quantized_conv.h): the activation
// quantization fused with im2col into an s8 column matrix, then per group the
// int8 GEMM of quantized_linear (exact int32) and its float epilogue
// (kernels/formulas/qlinear.h) writing NCHW:
//   col[g][m, k]             = quantize_shifted(x[n, g Cg + c, ih, iw]) or 0 (padding, pad columns)
//   out[n, g Og + o, p]      = qlinear_epilogue(sum_k col[g][m, k] * w[g Og + o, k], sa, sw[o'], bias[o'])
// with m = n P + p (P = OH OW), k = (c kh + i) kw + j, o' = g Og + o.
#pragma once

#include <cstdint>

#include "qgrad/core/tensor.h"
#include "qgrad/kernels/conv.h"
#include "qgrad/kernels/qlinear.h"

namespace qgrad::kernels {

// The static per-tensor activation quantization: scale (f32) and zero point
// (s32), one element each, on the host (read there) or on the output's
// device (read only by the kernels).
struct StaticActQuant {
  Tensor scale, zero_point;
  int qmin = -128, qmax = 127;
};

// Row stride of the column matrix (as qlinear_lda: K on the CPU, K rounded up
// to 16 on CUDA, the pad columns zero).
std::int64_t qconv_lda(Device device, std::int64_t K);

// col (s8 [groups, n oh ow, lda]) = the quantized im2col of x (floating NCHW);
// one pass, one index per element of col.
void qconv_columns(const Conv2dShape& s, const Tensor& x, const StaticActQuant& act, const Tensor& col,
                   std::int64_t lda);

// out (floating [n, o, oh, ow]) = the epilogue of the int8 GEMMs of col with
// w (s8 [o, K] contiguous, K = s.patch()). ep.sa is the static scale
// (per_row false), ep.sw f32 [o], ep.bias undefined or [o] in the epilogue
// math dtype.
void qconv_gemm(const Conv2dShape& s, const Tensor& col, std::int64_t lda, const Tensor& w, const QLinearEpilogue& ep,
                const Tensor& out);

namespace cpu {
// The CPU GEMM + epilogue (kernels/cpu/qlinear.cpp: quantized_linear's
// int8 dot products, tiled the same way).
void qconv_gemm(const Conv2dShape& s, const Tensor& col, std::int64_t lda, const Tensor& w, const QLinearEpilogue& ep,
                const Tensor& out);
}  // namespace cpu

}  // namespace qgrad::kernels
