// Int4-weight linear layers for inference (issue #14 item 4): W4A16
// (weight-only int4, GPTQ/AWQ style) and W4A8 (torchao's 8da4w: dynamic
// per-token int8 activations, symmetric int4 per-group weights). Not
// differentiable. Formulas, limits and precision: docs/ops.md, "Int4 linear
// layers"; scalar math: kernels/formulas/lowbit_linear.h.
//
// Weights are packed int4 [N, K] (nn.Linear layout, core/dtype.h's nibble
// order: element 2k in the low nibble of byte k, ONNX's and torchao's), with
// one f32 scale (and, for u4, one s32 zero point) per group of G consecutive
// input channels: w_scale [N, K / G], as choose_qparams_int4 /
// quantize_int4 (ops/lowbit.h) produce them for the weight.
#pragma once

#include <cstdint>

#include "qgrad/core/tensor.h"
#include "qgrad/ops/dynamic_quant.h"  // QuantMode

namespace qgrad {

// W4A16: y = x · W^T + bias with W[n, k] = T((q[n, k] - zp[n, k / G]) * scale[n, k / G])
// (the f32 product rounded once to x's dtype T: dequantize_int4's output in
// T), the dot products accumulated in f32 and rounded once to T, bias (in T)
// added in f32 before that rounding.
// x f32 / bf16 / f16 [..., K] (M = numel / K >= 0); w_q s4 (symmetric: the
// zero point must be undefined) or u4 (w_zero_point s32 [N, K / G], values in
// [0, 15]) packed [N, K], K even; w_scale [N, K / G] (finite, > 0), f32 or
// x's 16-bit dtype T (as torchao's and GPTQ's int4 weights keep them: the
// same formula with s = float(scale); on CUDA the decode-size kernel then
// dequantizes with packed T arithmetic, which gives the same bits because
// (q - zp) * s is exact in f32 for a T scale); G > 0
// divides K (32, 64, 128, 256 in practice); bias undefined or floating [N]
// (rounded to T). Out: x's dtype, [..., N].
Tensor linear_w4a16(const Tensor& x, const Tensor& w_q, const Tensor& w_scale, const Tensor& w_zero_point,
                    std::int64_t group_size, const Tensor& bias = Tensor());

// A W4A16 weight packed once for decode (pack_w4a16): the weight in the
// fragment order of the CUDA split-K GEMV (kernels/formulas/lowbit_linear.h:
// 16-channel x 128-column units of 1024 bytes, each warp load 512
// contiguous bytes, nibbles in x's pair order), and copies of its scales and
// zero points. It owns all three and exposes none, so nothing but
// pack_w4a16 writes them: the GEMV may load them before it waits for the
// kernel before it, and a decode step's layer starts its weight's reads
// during the previous layer (H200, M = 1, N = K = 4096, groups of 128: a
// layer of a captured decode chain 4.8 -> 4.6 us, M = 16 6.4 -> 5.8). Bytes held: the packed
// weight (N and K padded to multiples of 32 and 128) plus the scales and
// zero points, as many as the plain weight's. Cheap to copy (shared
// buffers, all immutable).
class PackedW4A16 {
 public:
  PackedW4A16() = default;
  bool defined() const { return frag_.defined(); }
  Device device() const { return frag_.device(); }
  std::int64_t out_features() const { return n_; }  // N
  std::int64_t in_features() const { return k_; }   // K
  std::int64_t group_size() const { return g_; }
  DType weight_dtype() const { return wdtype_; }  // s4 or u4
  DType scale_dtype() const { return scale_.dtype(); }
  std::int64_t nbytes() const;  // device (or host) bytes held

 private:
  friend PackedW4A16 pack_w4a16(const Tensor&, const Tensor&, const Tensor&, std::int64_t);
  friend Tensor linear_w4a16(const Tensor&, const PackedW4A16&, const Tensor&);
  Tensor frag_, scale_, zero_point_;
  std::int64_t n_ = 0, k_ = 0, g_ = 0;
  DType wdtype_ = DType::s4;
};

// The weight of linear_w4a16 (w_q, w_scale, w_zero_point, group_size: the
// same arguments and checks) packed for decode, on w_q's device (CPU or
// CUDA). A one-time conversion (a model's convert step): on CUDA two
// kernels, the pack and an empty one after it, so that the next kernel in
// the stream never overlaps the one that wrote the packed weight.
PackedW4A16 pack_w4a16(const Tensor& w_q, const Tensor& w_scale, const Tensor& w_zero_point,
                       std::int64_t group_size);

// linear_w4a16 with a packed weight: the same formula and precision
// guarantee. CUDA, 16-bit x, M <= 16, K and G multiples of 32, x 16-byte
// aligned: the split-K GEMV on the packed weight, its first loads issued
// before it waits. Where the plain weight takes the same GEMV (M <= 8; 8 <
// M <= 16 with K a multiple of 4096 and G a power of two) its products and
// their order are those of the plain weight with f32 scales: the same bits
// as linear_w4a16(x, w_q, scale.to(f32), ...) with scales of either dtype
// (the plain weight with 16-bit scales pairs columns differently, so its
// outputs may differ in the last bit; all within the bound). Elsewhere
// (CPU, f32 x, larger M, other shapes): the weight unpacked into a scratch
// [N, K] (N K / 2 bytes) and the plain weight's path.
// x f32 / bf16 / f16 [..., K] on w's device; the scales' dtype f32 or x's;
// bias undefined or floating [N].
Tensor linear_w4a16(const Tensor& x, const PackedW4A16& w, const Tensor& bias = Tensor());

// W4A8 (8da4w inference): a_q, sa, za = per-token dynamic int8 quantization
// of x viewed [M, K] (dynamic_range_quantize's formulas: act_mode symmetric:
// [-128, 127], za = 0, sa = max|x| / 127; asymmetric: sa = (max(hi, 0) -
// min(lo, 0)) / 255, za = clamp(-128 - round(min(lo, 0) / sa), -128, 127)),
// then
//   y[m, n] = sum_g sa[m] * sw[n, g] * (sum_{k in g} (a_q[m, k] - za[m]) * w_q[n, k]) + bias[n]
// with each group sum exact in int32, each group term float(acc) * (sa * sw)
// in f32, the terms added in increasing g, then bias (f32), rounded once to
// out_dtype: CPU and CUDA bit-identical (and, for G = K, bit-identical with
// quantized_linear on the widened weight).
// x f32 / bf16 / f16 [..., K]; w_q s4 packed [N, K], K even; w_scale f32
// [N, K / G] (finite, > 0); bias undefined or floating [N]; out_dtype f32,
// bf16 or f16. CUDA, G = K and symmetric: the weight is widened to s8 (a
// scratch buffer per call) and runs the int8 tensor-core GEMM of
// quantized_linear (cuBLASLt); otherwise a grouped dp4a kernel.
// w_s8 (optional cache): w_q's values widened to s8 [N, K] on
// x's device (w_q.to(DType::s8), kept by the caller: N K more bytes). When
// given, the per-channel symmetric path uses it and skips the per-call
// widening (same bits); other paths ignore it. Checked for dtype, shape and
// device; on the host also for equal values (on CUDA its values are the
// caller's promise: a stale cache gives the product with the cached values).
Tensor linear_w4a8(const Tensor& x, const Tensor& w_q, const Tensor& w_scale, std::int64_t group_size,
                   const Tensor& bias = Tensor(), QuantMode act_mode = QuantMode::asymmetric,
                   DType out_dtype = DType::f32, const Tensor& w_s8 = Tensor());

}  // namespace qgrad
