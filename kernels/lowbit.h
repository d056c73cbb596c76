// Kernels of the int4 and FP8 quantization ops (ops/lowbit.h). One shared
// source (kernels/lowbit.cpp) over the loop primitive of kernels/loop.h, so
// the CPU and CUDA run the same formulas (kernels/formulas/lowbit.h) and
// agree bit for bit. The per-block min/max they start from comes from the
// observer kernel (kernels/observer.h), whose combine is order-free.
//
// Tensors: scale f32, zero point s32, one per block ("channel" of the
// layout); block min/max f32. All on one device.
#pragma once

#include <cstdint>
#include <vector>

#include "qgrad/core/tensor.h"
#include "qgrad/kernels/layout.h"

namespace qgrad::kernels {

// scale / zp [C] from the blocks' min / max [C] (formulas::int4_qparams).
void int4_qparams(const Tensor& min, const Tensor& max, const Tensor& scale, const Tensor& zp, int qmin, int qmax,
                  bool symmetric, float eps);
// An elementwise function applied to x as fake_quantize_dynamic_rows loads it
// (gelu_fake_quantize_dynamic, ops/lowbit.h): gelu's erf or tanh form
// (formulas::gelu_erf / gelu_tanh, rounded to x's dtype as the gelu op does).
enum class RowPrologue { none, gelu, gelu_tanh };
// fake_quantize_dynamic (ops/lowbit.h) in one pass over contiguous rows of
// row_len elements: per row the qparams of int4_qparams from the row's
// min/max (of prologue(x)), then the per-token fake quantize
// (formulas::FakeQuantOp, f64 product form) into y and, when mask is not
// null, its bit mask. Only a CUDA kernel (kernels/cuda/entries.h says which
// rows it takes); returns false, writing nothing, where none applies (the
// caller composes the ops).
bool fake_quantize_dynamic_rows(const Tensor& x, const Tensor& y, std::uint32_t* mask, std::int64_t row_len, int qmin,
                                int qmax, bool symmetric, float eps, RowPrologue prologue = RowPrologue::none);
// One tensor of fake_quantize_dynamic_rows_batch: y has x's dtype, device
// and element count; mask as fake_quantize_dynamic_rows's (null: none).
struct RowsBatchItem {
  Tensor x, y;
  std::uint32_t* mask = nullptr;
};
// fake_quantize_dynamic_rows (no prologue) of every item in one CUDA launch
// (32 items a launch): each item's bits are those of its own call. The items
// share a dtype (f32, bf16, f16), a device and row_len (one that
// fake_quantize_dynamic_rows takes); returns false, writing nothing, otherwise.
bool fake_quantize_dynamic_rows_batch(const std::vector<RowsBatchItem>& items, std::int64_t row_len, int qmin,
                                      int qmax, bool symmetric, float eps);
// layer_norm over contiguous rows of d elements (mean and rstd written as
// kernels::layer_norm writes them), then fake_quantize_dynamic per row of
// its output (rounded to x's dtype first, as the two ops): the per-token fake
// quant of y into y and its mask (may be null); the layer norm's output is
// never written. Only a CUDA kernel, for d = 128, 256, 384, 512, 768 or 1024
// and f32 / bf16 / f16; returns false, writing nothing, elsewhere.
struct NormQuantRows {
  std::int64_t d = 0;
  double eps = 1e-5;       // layer_norm's
  int qmin = -128, qmax = 127;
  bool symmetric = false;
  float quant_eps = 0;     // choose_qparams_affine's
};
bool layer_norm_fake_quantize_dynamic_rows(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y,
                                           const Tensor& mean, const Tensor& rstd, std::uint32_t* mask,
                                           const NormQuantRows& a);
// q (s4 / u4, packed, x's numel) = clamp(nearbyint(x * (1/s)) + zp, qmin, qmax)
// per group of `group` consecutive elements (group g = i / group); NaN -> qmin.
// mask (bitmask_words(numel) words, or null): qmin <= unclamped q <= qmax.
void int4_quantize(const Tensor& x, const Tensor& q, const Tensor& scale, const Tensor& zp, std::int64_t group,
                   std::uint32_t* mask);
// y (floating) = (q - zp) * s per group (f32 product; f64 output: exact).
void int4_dequantize(const Tensor& q, const Tensor& y, const Tensor& scale, const Tensor& zp, std::int64_t group);

// scale [C] = max(amax, 1e-12) / fp8_max, amax from min / max [C].
void fp8_scale(const Tensor& min, const Tensor& max, const Tensor& scale, DType fp8);
// Element i uses scale[layout.channel(i)]:
//   fp8_fake_quantize: y = float(fp8(clamp(float(x) / s, +-max))) * s, in x's dtype;
//   fp8_quantize:      q = fp8(clamp(float(x) / s, +-max)) (q f8e4m3 / f8e5m2);
//   fp8_dequantize:    y = float(q) * s (f64 output: exact);
//   fp8_scale_grad:    dx = dy / s (divide) or dy * s (multiply), in dy's dtype.
void fp8_fake_quantize(const Tensor& x, const Tensor& y, const Tensor& scale, const AxisLayout& layout, DType fp8);
void fp8_quantize(const Tensor& x, const Tensor& q, const Tensor& scale, const AxisLayout& layout);
void fp8_dequantize(const Tensor& q, const Tensor& y, const Tensor& scale, const AxisLayout& layout);
void fp8_scale_grad(const Tensor& dy, const Tensor& dx, const Tensor& scale, const AxisLayout& layout, bool divide);

}  // namespace qgrad::kernels
