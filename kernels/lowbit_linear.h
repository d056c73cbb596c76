// Kernels of the int4 linear layers (ops/lowbit_linear.h); scalar formulas
// in kernels/formulas/lowbit_linear.h. CPU: kernels/cpu/lowbit_linear.cpp;
// CUDA: kernels/cuda/lowbit_linear.cu, its decode GEMVs in
// kernels/cuda/w4a16_gemv.cuh (hand-written: the decode GEMV is the point of
// W4A16, and the W4A8 group sums need int4 unpacking in the loop).
// All tensors on out's device; the op has validated shapes and dtypes.
#pragma once

#include <cstdint>

#include "qgrad/core/tensor.h"

namespace qgrad::kernels {

// W4A16: out [M, N] (x's dtype T) = x [M, K] · W^T (+ bias), W[n, k] =
// T((q - zp) * s) (formulas::w4a16_weight), f32 accumulation, one rounding.
// w packed s4 / u4 [N, K]; scale f32 [N, K / G]; zp s32 [N, K / G] for u4,
// undefined for s4; bias undefined or T [N].
//   CPU: W in f32, an Eigen GEMM.
//   CUDA: M <= kW4A16GemvMaxM, 16-bit x, K and G multiples of 32, 16-byte
//   aligned x and w: a tensor-core GEMV (weight rows streamed into shared
//   memory by bulk copies, mma.sync m16n8k16, bf16/f16 in, f32 accumulate;
//   each dequantized weight fragment feeds up to 64 rows of x); larger M: W dequantized to T into a scratch [N, K] and a cuBLAS
//   GEMM (f32 compute, no reduced-precision reduction); other shapes at
//   M <= kW4A16GemvMaxM: a warp per output. 64: one block row of the GEMV
//   reads the packed weight once; past that every further 64 rows re-read and
//   re-dequantize it, and the tensor-core GEMM wins (H100, N = K = 4096: the
//   GEMV takes 0.028 ms at M = 64; an older GEMV took 0.095 ms at M = 128,
//   cuBLAS 0.018 ms + the dequantize pass).
inline constexpr std::int64_t kW4A16GemvMaxM = 64;
void w4a16_linear(const Tensor& x, const Tensor& w, const Tensor& scale, const Tensor& zp, std::int64_t group,
                  const Tensor& bias, const Tensor& out);

// pack_w4a16's fragment order (kernels/formulas/lowbit_linear.h,
// formulas::w4a16_frag_*): frag (u8 [w4a16_frag_bytes(N, K)]) from w (s4 /
// u4 packed [N, K]), zeros past N and K; and back. CUDA: the pack ends with
// an empty kernel, so the next kernel in the stream never overlaps the one
// that wrote frag (the GEMV loads it before it waits).
void w4a16_frag_pack(const Tensor& w, const Tensor& frag);
void w4a16_frag_unpack(const Tensor& frag, const Tensor& w);
// W4A16 with the weight in the fragment order (scale, zp, bias and out as in
// w4a16_linear; zp defined: u4): on CUDA for 16-bit x, M <= kW4A16FragMaxM,
// K and G multiples of 32 and 16-byte aligned x, the split-K GEMV, which
// loads its first iterations' weight and scales before it waits for the
// kernel before (they must not be written by any kernel that may still be
// running: PackedW4A16 owns them). Returns false, having launched nothing,
// elsewhere (the caller unpacks and calls w4a16_linear).
inline constexpr std::int64_t kW4A16FragMaxM = 16;
bool w4a16_linear_frag(const Tensor& x, const Tensor& frag, const Tensor& scale, const Tensor& zp, std::int64_t group,
                       const Tensor& bias, const Tensor& out);

// W4A8 with groups: out [M, N] (f32, bf16, f16) from a (s8 [M, lda], K
// columns used), sa (f32 [M]), za (s32 [M], or undefined: 0), w (s4 packed
// [N, K]), sw (f32 [N, K / G]) and bias (undefined or f32 [N]):
//   out[m, n] = T(sum_g (in g order) float(acc_g) * (sa[m] * sw[n, g]) + bias[n]),
//   acc_g = sum_{k in g} (a[m, k] - za[m]) * w[n, k] exact in int32.
void w4a8_linear(const Tensor& a, std::int64_t lda, std::int64_t K, const Tensor& sa, const Tensor& za,
                 const Tensor& w, const Tensor& sw, std::int64_t group, const Tensor& bias, const Tensor& out);

// w8 (s8 [N, K], contiguous) = the values of w (s4 packed [N, K]).
void int4_widen(const Tensor& w, const Tensor& w8);

namespace cpu {
void w4a16_frag_pack(const Tensor& w, const Tensor& frag);
void w4a16_frag_unpack(const Tensor& frag, const Tensor& w);
void w4a16_linear(const Tensor& x, const Tensor& w, const Tensor& scale, const Tensor& zp, std::int64_t group,
                  const Tensor& bias, const Tensor& out);
void w4a8_linear(const Tensor& a, std::int64_t lda, std::int64_t K, const Tensor& sa, const Tensor& za,
                 const Tensor& w, const Tensor& sw, std::int64_t group, const Tensor& bias, const Tensor& out);
void int4_widen(const Tensor& w, const Tensor& w8);
}  // namespace cpu

namespace cuda {
void w4a16_frag_pack(const Tensor& w, const Tensor& frag);
void w4a16_frag_unpack(const Tensor& frag, const Tensor& w);
bool w4a16_linear_frag(const Tensor& x, const Tensor& frag, const Tensor& scale, const Tensor& zp, std::int64_t group,
                       const Tensor& bias, const Tensor& out);
void w4a16_linear(const Tensor& x, const Tensor& w, const Tensor& scale, const Tensor& zp, std::int64_t group,
                  const Tensor& bias, const Tensor& out);
void w4a8_linear(const Tensor& a, std::int64_t lda, std::int64_t K, const Tensor& sa, const Tensor& za,
                 const Tensor& w, const Tensor& sw, std::int64_t group, const Tensor& bias, const Tensor& out);
void int4_widen(const Tensor& w, const Tensor& w8);
}  // namespace cuda

}  // namespace qgrad::kernels
