// Kernels of the transformer ops: gelu, silu, softmax, layer_norm, rms_norm,
// embedding and dropout. Each is written once over kernels/loop.h (the
// formulas in kernels/formulas/transformer.h); the only device-specific step
// is the stable sort of embedding's backward (std::stable_sort on the CPU,
// CUB's radix sort on CUDA: a stable sort has one result, so both agree).
#pragma once

#include <cstdint>

#include "qgrad/core/tensor.h"
#include "qgrad/kernels/deferred.h"
#include "qgrad/kernels/layout.h"

namespace qgrad::kernels {

// y = gelu(x), erf form or (tanh) the tanh approximation.
void gelu(const Tensor& x, const Tensor& y, bool tanh);
// dx = gelu'(x) * dy; with a bit mask (bitmask_words(numel) words), dy * bit
// in its place (gelu_fake_quantize_dynamic's backward: the fake quant's
// straight-through mask and gelu's derivative in one pass).
void gelu_backward(const Tensor& dy, const Tensor& x, const Tensor& dx, bool tanh,
                   const std::uint32_t* mask = nullptr);
// y = x * sigmoid(x).
void silu(const Tensor& x, const Tensor& y);
void silu_backward(const Tensor& dy, const Tensor& x, const Tensor& dx);

// Softmax along the channels axis of v: y = exp(x - max) / sum(exp(x - max)).
void softmax(const Tensor& x, const Tensor& y, const AxisLayout& v);
// dx = y * (dy - sum(dy * y)) along the axis.
void softmax_backward(const Tensor& y, const Tensor& dy, const Tensor& dx, const AxisLayout& v);

// layer_norm over contiguous rows of d elements (x.numel() / d rows).
// w, b: [d] or undefined. mean, rstd: [rows] in op math (f32, f64 for f64).
void layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y, const Tensor& mean,
                const Tensor& rstd, std::int64_t d, double eps);
// rms_norm over rows of d: rstd [rows] in op math.
void rms_norm(const Tensor& x, const Tensor& w, const Tensor& y, const Tensor& rstd, std::int64_t d, double eps);
// The backward of both (mean undefined: rms_norm). dx, dw, db: each
// undefined when not wanted; dw and db are column sums over the rows in
// chunks of kNormChunkRows, in a fixed order on both devices. With dy_mask
// (a fake quant's saved bit mask over dy's elements), dy is read masked as
// the fake quant's backward would have written it (formulas::masked_grad):
// the same bits as that pass, without it. With dx_pending (x's shape and
// dtype), dx = dx_pending + the norm's dx (formulas::fold_pending: the
// backward engine's sum of the two, in this pass). With `defer`, dw's and
// db's finishing passes are queued there (kernels/deferred.h): written by
// defer->flush().
inline constexpr std::int64_t kNormChunkRows = 64;
void norm_backward(const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd, const Tensor& dy,
                   const Tensor& dx, const Tensor& dw, const Tensor& db, std::int64_t d,
                   const std::uint32_t* dy_mask = nullptr, const Tensor& dx_pending = Tensor(),
                   DeferredPasses* defer = nullptr);

// out[n, :] = weight[indices[n], :] (weight [V, D], indices s32/s64); a row
// whose index is outside [0, V) is NaN (the op rejects those on the CPU first).
void embedding(const Tensor& weight, const Tensor& indices, const Tensor& out);
// dweight[v, :] = sum of dy[n, :] over the n with indices[n] == v, in
// increasing n (0 for v == padding_idx; padding_idx < 0: none).
void embedding_backward(const Tensor& dy, const Tensor& indices, const Tensor& dweight, std::int64_t padding_idx);

// y = x * (keep_i ? 1 / (1 - p) : 0), keep_i = uniform(seed, offset + i) >= p;
// mask (s32, bitmask_words(n) words) receives keep_i.
void dropout(const Tensor& x, const Tensor& y, const Tensor& mask, std::uint64_t seed, std::uint64_t offset, double p);
// dx = dy * (mask bit ? 1 / (1 - p) : 0).
void dropout_backward(const Tensor& dy, const Tensor& mask, const Tensor& dx, double p);

}  // namespace qgrad::kernels
