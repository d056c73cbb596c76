// Matrix products and transposition.
#pragma once

#include <cstdint>

#include "qgrad/core/tensor.h"

namespace qgrad {

// [..., M, K] x [..., K, N] -> [..., M, N] (torch.matmul for ranks >= 2):
// the batch dims (all but the last two) broadcast by numpy rules, at most 7
// of them. 1-D operands are not accepted (reshape them to [1, K] / [K, 1]).
Tensor matmul(const Tensor& a, const Tensor& b);
// y = x · wᵀ + bias with w in nn.Linear layout [N, K], bias [N] or an
// undefined Tensor, x [..., K] -> y [..., N].
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias = Tensor());
// relu(linear(x, w, bias)) in one op: the relu runs in place on the GEMM
// output and the backward keeps a bit mask instead of a second tensor.
Tensor linear_relu(const Tensor& x, const Tensor& w, const Tensor& bias = Tensor());
// linear(x, w, bias) + residual in one op: a residual connection's add,
// which on CUDA rides in the linear's cuBLASLt GEMM (C = residual, beta 1).
// The residual is added before the bias, in the GEMM epilogue's order:
// y = add(add(x · wᵀ, residual), bias) with each add rounded to the dtype
// (the same values as linear(x, w) + residual + bias, not bit for bit
// linear(x, w, bias) + residual; checked once per shape that the GEMM gives
// exactly these bits, else it runs the adds itself: kernels/linalg.h
// linear_bias_add). residual has the output's shape [..., N], dtype and
// device; the gradients are linear's, and dy for the residual.
Tensor linear_add(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& residual);
// How f32 matmuls on CUDA (matmul, linear, linear_relu, linear_add,
// scaled_dot_product_attention's products) compute (core/dtype.h
// Float32Matmul): ieee (the default) with f32 FMAs; tf32 on TF32 tensor
// cores, each operand rounded to 10 mantissa bits (cuBLAS
// CUBLAS_COMPUTE_32F_FAST_TF32, PyTorch's torch.backends.cuda.matmul.allow_tf32,
// off by default there too); tf32x3 on the same tensor cores at f32's level
// of accuracy: each operand a = big + small with big a TF32 value (a rounded
// to nearest) and small = a - big exactly, c = small_a·big_b + big_a·small_b
// + big_a·big_b, three TF32 products summed in f32 in two cuBLAS GEMMs (the
// small terms first, as one product over 2k), the small_a·small_b term
// (2^-22 of |a||b| at most) dropped.
// tf32x3 applies to products of at least 2^27 multiply-adds (smaller ones
// stay ieee) and costs two f32 copies of each operand for the GEMM's
// duration. Bounds against the f64 product: docs/ops.md "linear". Read when
// the op runs; its backward takes the forward's setting. Process-wide,
// thread-safe; no effect on the CPU, f64, f16 or bf16.
void set_float32_matmul(Float32Matmul math);
Float32Matmul float32_matmul();
// set_float32_matmul(allow ? tf32 : ieee); true when the setting is tf32.
void set_matmul_allow_tf32(bool allow);
bool matmul_allow_tf32();

// A contiguous copy of x with dims dim0 and dim1 swapped (negative dims count
// from the end). Any dtype; differentiable for floating ones.
Tensor transpose(const Tensor& x, std::int64_t dim0, std::int64_t dim1);

}  // namespace qgrad
