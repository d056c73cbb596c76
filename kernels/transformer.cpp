// gelu, silu, softmax, layer_norm, rms_norm, embedding and dropout, one
// source for both devices (kernels/loop.h): map_elements for the
// elementwise kernels, per row for softmax and the normalisations (the row
// formulas of kernels/formulas/transformer.h, summed in their fixed lane
// order), per (chunk, column) and then per column for the weight and bias
// gradients, per (vocabulary row, column) for embedding's gradient, per mask
// block for dropout's forward.
#include "qgrad/kernels/transformer.h"

#include <algorithm>
#include <numeric>
#include <type_traits>
#include <vector>

#include "qgrad/kernels/bitmask.h"
#include "qgrad/kernels/cuda/entries.h"
#include "qgrad/kernels/formulas/transformer.h"
#include "qgrad/kernels/loop.h"
#include "qgrad/kernels/softmax.h"
#include "qgrad/kernels/vec4.h"

namespace qgrad::kernels {

namespace {

template <class T>
const T* cdata(const Tensor& t) {
  return t.defined() ? static_cast<const T*>(t.data_ptr()) : nullptr;
}
template <class T>
T* mdata(const Tensor& t) {
  return t.defined() ? static_cast<T*>(t.data_ptr()) : nullptr;
}
TensorOptions opts(DType dt, Device d) { return TensorOptions{}.with_dtype(dt).with_device(d); }

// ---- elementwise activations (map_elements bodies) ----
template <class T, bool kTanh>
struct Gelu {
  QGRAD_HD T operator()(std::int64_t, T x) const {
    using M = op_math_t<T>;
    return T(kTanh ? formulas::gelu_tanh(M(x)) : formulas::gelu_erf(M(x)));
  }
};
// kMasked (gelu_fake_quantize_dynamic's): dy is first masked as the fake
// quant's straight-through backward masks it (formulas::FakeQuantGradOp:
// dy * bit). A compile-time switch, not a null test: the test's mask loads
// sat between the vector loads of dy and x, and the erf form ran at 0.84-0.88x
// of PyTorch (0.0323 ms against 0.0271 for the same math without them, H200).
template <class T, bool kTanh, bool kMasked>
struct GeluBackward {
  const std::uint32_t* mask;
  QGRAD_HD T operator()([[maybe_unused]] std::int64_t i, T dyv, T xv) const {
    using M = op_math_t<T>;
    M g = M(dyv);
    if constexpr (kMasked) g = M(T(g * M(bitmask_get(mask, i) ? 1 : 0)));
    return T(kTanh ? formulas::gelu_tanh_backward(g, M(xv)) : formulas::gelu_erf_backward(g, M(xv)));
  }
};
template <class T>
struct Silu {
  QGRAD_HD T operator()(std::int64_t, T x) const { return T(formulas::silu(op_math_t<T>(x))); }
};
template <class T>
struct SiluBackward {
  QGRAD_HD T operator()(std::int64_t, T dyv, T xv) const {
    using M = op_math_t<T>;
    return T(formulas::silu_backward(M(dyv), M(xv)));
  }
};

// ---- softmax: one index per row along the axis ----
template <class T, bool kBackward>
struct SoftmaxRow {
  const T* in;  // x, or y for the backward
  const T* dy;  // backward only
  T* out;
  AxisLayout v;
  QGRAD_HD void operator()(std::int64_t row) const {
    const std::int64_t b = v.base(row);
    if constexpr (kBackward) formulas::softmax_backward_row(in + b, dy + b, out + b, v.channels, v.inner);
    else formulas::softmax_row(in + b, out + b, v.channels, v.inner);
  }
};

// ---- normalisations: one index per row of d ----
template <class T>
struct LayerNormRow {
  const T* x;
  const T* w;
  const T* b;
  T* y;
  op_math_t<T>* mean;
  op_math_t<T>* rstd;
  std::int64_t d;
  op_math_t<T> eps;
  QGRAD_HD void operator()(std::int64_t r) const {
    formulas::layer_norm_row(x + r * d, w, b, y + r * d, d, eps, mean + r, rstd + r);
  }
};
template <class T>
struct RmsNormRow {
  const T* x;
  const T* w;
  T* y;
  op_math_t<T>* rstd;
  std::int64_t d;
  op_math_t<T> eps;
  QGRAD_HD void operator()(std::int64_t r) const { formulas::rms_norm_row(x + r * d, w, y + r * d, d, eps, rstd + r); }
};
template <class T, bool kCentered>
struct NormBackwardRow {
  const T* x;
  const T* w;
  const T* dy;
  T* dx;
  const op_math_t<T>* mean;  // null for rms_norm
  const op_math_t<T>* rstd;
  std::int64_t d;
  const std::uint32_t* dy_mask;  // null: dy as it is
  const T* pending;              // null: dx alone
  QGRAD_HD void operator()(std::int64_t r) const {
    using M = op_math_t<T>;
    formulas::norm_backward_row<T, kCentered>(x + r * d, w, dy + r * d, dx + r * d, d, kCentered ? mean[r] : M(0),
                                              rstd[r], dy_mask, r * d, pending != nullptr ? pending + r * d : nullptr);
  }
};
// Stage 1 of the weight and bias gradients (for_each_column_sum; stage 2 is
// ChunkSumsFinish, kernels/loop.h): column
// i = (chunk c, feature j) sums rows [c * kNormChunkRows, ...) of dy * xhat
// (NormWeightPartial) or dy (NormBiasPartial).
template <class T>
struct NormChunkColumns {
  using Acc = op_math_t<T>;
  static constexpr std::int64_t kMaxCount = kNormChunkRows;
  std::int64_t rows, d;
  QGRAD_HD std::int64_t row0(std::int64_t i) const { return i / d * kNormChunkRows; }
  QGRAD_HD std::int64_t count(std::int64_t i) const {
    const std::int64_t r0 = row0(i);
    return rows - r0 < kNormChunkRows ? rows - r0 : kNormChunkRows;
  }
};
template <class T>
struct NormWeightPartial : NormChunkColumns<T> {
  using M = op_math_t<T>;
  const T* x;
  const T* dy;
  const M* mean;  // null for rms_norm
  const M* rstd;
  M* pw;
  const std::uint32_t* dy_mask;  // null: dy as it is
  QGRAD_HD M term(std::int64_t k, std::int64_t i) const {
    const std::int64_t r = this->row0(i) + k, j = i % this->d;
    const M centered = mean != nullptr ? M(x[r * this->d + j]) - mean[r] : M(x[r * this->d + j]);
    return formulas::masked_grad(dy, dy_mask, r * this->d + j) * (centered * rstd[r]);
  }
  QGRAD_HD void write(std::int64_t i, M v) const { pw[i] = v; }
};
template <class T>
struct NormBiasPartial : NormChunkColumns<T> {
  using M = op_math_t<T>;
  const T* dy;
  M* pb;
  const std::uint32_t* dy_mask;  // null: dy as it is
  QGRAD_HD M term(std::int64_t k, std::int64_t i) const {
    return formulas::masked_grad(dy, dy_mask, (this->row0(i) + k) * this->d + i % this->d);
  }
  QGRAD_HD void write(std::int64_t i, M v) const { pb[i] = v; }
};
// ---- embedding ----
template <class T, class L>
struct EmbeddingGather {
  const T* w;
  const L* idx;
  T* out;
  std::int64_t V, D;
  QGRAD_HD void operator()(std::int64_t i) const {
    const std::int64_t n = i / D, j = i - n * D;
    const auto k = static_cast<std::int64_t>(idx[n]);
    out[i] = (k >= 0 && k < V) ? w[k * D + j] : T(formulas::quiet_nan<op_math_t<T>>());
  }
};
// CUDA, rows of a multiple of 4 on aligned storage: four consecutive
// elements of one row an index, one Vec4 load and store (one element a thread
// ran the gather at 56% of copy bandwidth); the same values.
template <class T, class L>
struct EmbeddingGatherFour {
  EmbeddingGather<T, L> e;
  QGRAD_HD void operator()(std::int64_t q) const {
    const std::int64_t i = 4 * q, n = i / e.D, j = i - n * e.D;
    const auto k = static_cast<std::int64_t>(e.idx[n]);
    Vec4<T> r;
    if (k >= 0 && k < e.V) r = *reinterpret_cast<const Vec4<T>*>(e.w + k * e.D + j);
    else
      for (int c = 0; c < 4; ++c) r.v[c] = T(formulas::quiet_nan<op_math_t<T>>());
    reinterpret_cast<Vec4<T>*>(e.out)[q] = r;
  }
};
template <class L>
struct ToKeys {
  const L* idx;
  std::int64_t* keys;
  QGRAD_HD void operator()(std::int64_t i) const { keys[i] = static_cast<std::int64_t>(idx[i]); }
};
// starts[v] = the first position of the sorted keys that is >= v (v in [0, V]).
struct SegmentStarts {
  const std::int64_t* sorted;
  std::int64_t* starts;
  std::int64_t n;
  QGRAD_HD void operator()(std::int64_t v) const {
    std::int64_t lo = 0, hi = n;
    while (lo < hi) {
      const std::int64_t mid = lo + (hi - lo) / 2;
      if (sorted[mid] < v) lo = mid + 1;
      else hi = mid;
    }
    starts[v] = lo;
  }
};
// dweight[v, j] = sum over the occurrences k of v (in increasing position) of dy[order[k], j].
template <class T>
struct EmbeddingRowGrad {
  const T* dy;
  const std::int64_t* order;
  const std::int64_t* starts;
  T* dw;
  std::int64_t D, padding_idx;
  QGRAD_HD void operator()(std::int64_t i) const {
    using M = op_math_t<T>;
    const std::int64_t v = i / D, j = i - v * D;
    M acc = M(0);
    if (v != padding_idx)
      for (std::int64_t k = starts[v]; k < starts[v + 1]; ++k) acc += M(dy[order[k] * D + j]);
    dw[i] = T(acc);
  }
};

// ---- dropout ----
template <class T>
struct Dropout {
  std::uint64_t seed, offset;
  double p;
  op_math_t<T> scale;
  QGRAD_HD T operator()(std::int64_t i, T x, bool& keep) const {
    keep = formulas::dropout_keep(seed, offset, i, p);
    return T(formulas::dropout_apply(op_math_t<T>(x), keep, scale));
  }
};
template <class T>
struct DropoutBackward {
  const std::uint32_t* words;
  op_math_t<T> scale;
  QGRAD_HD T operator()(std::int64_t i, T dyv) const {
    return T(formulas::dropout_apply(op_math_t<T>(dyv), bitmask_get(words, i), scale));
  }
};

// The scale 1 / (1 - p), computed in double (0 for p == 1: every element dropped).
double dropout_scale(double p) { return p < 1.0 ? 1.0 / (1.0 - p) : 0.0; }

}  // namespace

void gelu(const Tensor& x, const Tensor& y, bool tanh) {
  dispatch_floating(y.dtype(), "gelu", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (tanh) map_elements(y.device(), y.numel(), cdata<T>(x), mdata<T>(y), Gelu<T, true>{}, "gelu");
    else map_elements(y.device(), y.numel(), cdata<T>(x), mdata<T>(y), Gelu<T, false>{}, "gelu");
  });
}

void gelu_backward(const Tensor& dy, const Tensor& x, const Tensor& dx, bool tanh, const std::uint32_t* mask) {
  dispatch_floating(dx.dtype(), "gelu_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    auto run = [&](auto body) {
      map_elements(dx.device(), dx.numel(), cdata<T>(dy), cdata<T>(x), mdata<T>(dx), body, "gelu_backward");
    };
    if (mask != nullptr) {
      if (tanh) run(GeluBackward<T, true, true>{mask});
      else run(GeluBackward<T, false, true>{mask});
    } else {
      if (tanh) run(GeluBackward<T, true, false>{nullptr});
      else run(GeluBackward<T, false, false>{nullptr});
    }
  });
}

void silu(const Tensor& x, const Tensor& y) {
  dispatch_floating(y.dtype(), "silu", [&](auto tag) {
    using T = typename decltype(tag)::type;
    map_elements(y.device(), y.numel(), cdata<T>(x), mdata<T>(y), Silu<T>{}, "silu");
  });
}

void silu_backward(const Tensor& dy, const Tensor& x, const Tensor& dx) {
  dispatch_floating(dx.dtype(), "silu_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    map_elements(dx.device(), dx.numel(), cdata<T>(dy), cdata<T>(x), mdata<T>(dx), SiluBackward<T>{},
                 "silu_backward");
  });
}

void softmax(const Tensor& x, const Tensor& y, const AxisLayout& v) {
  if (y.is_cuda() && v.inner == 1 && cuda::use_norm_warp(v.channels)) {
    QGRAD_ON_CUDA(cuda::softmax_warp_rows(x, y, v.channels));
    return;
  }
  dispatch_floating(y.dtype(), "softmax", [&](auto tag) {
    using T = typename decltype(tag)::type;
    for_each_index(y.device(), v.outer * v.inner, SoftmaxRow<T, false>{cdata<T>(x), nullptr, mdata<T>(y), v},
                   "softmax");
  });
}

void softmax_backward(const Tensor& y, const Tensor& dy, const Tensor& dx, const AxisLayout& v) {
  if (dx.is_cuda() && v.inner == 1 && cuda::use_norm_warp(v.channels)) {
    QGRAD_ON_CUDA(cuda::softmax_backward_warp_rows(y, dy, dx, v.channels));
    return;
  }
  dispatch_floating(dx.dtype(), "softmax_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    for_each_index(dx.device(), v.outer * v.inner, SoftmaxRow<T, true>{cdata<T>(y), cdata<T>(dy), mdata<T>(dx), v},
                   "softmax_backward");
  });
}

void layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y, const Tensor& mean,
                const Tensor& rstd, std::int64_t d, double eps) {
  if (y.is_cuda() && cuda::use_norm_warp(d)) {
    QGRAD_ON_CUDA(cuda::layer_norm_warp_rows(x, w, b, y, mean, rstd, d, eps));
    return;
  }
  dispatch_floating(y.dtype(), "layer_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using M = op_math_t<T>;
    for_each_index(y.device(), y.numel() / d,
                   LayerNormRow<T>{cdata<T>(x), cdata<T>(w), cdata<T>(b), mdata<T>(y), mdata<M>(mean), mdata<M>(rstd),
                                   d, M(eps)},
                   "layer_norm");
  });
}

void rms_norm(const Tensor& x, const Tensor& w, const Tensor& y, const Tensor& rstd, std::int64_t d, double eps) {
  if (y.is_cuda() && cuda::use_norm_warp(d)) {
    QGRAD_ON_CUDA(cuda::rms_norm_warp_rows(x, w, y, rstd, d, eps));
    return;
  }
  dispatch_floating(y.dtype(), "rms_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using M = op_math_t<T>;
    for_each_index(y.device(), y.numel() / d,
                   RmsNormRow<T>{cdata<T>(x), cdata<T>(w), mdata<T>(y), mdata<M>(rstd), d, M(eps)}, "rms_norm");
  });
}

void norm_backward(const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd, const Tensor& dy,
                   const Tensor& dx, const Tensor& dw, const Tensor& db, std::int64_t d, const std::uint32_t* dy_mask,
                   const Tensor& dx_pending, DeferredPasses* defer) {
  dispatch_floating(x.dtype(), "norm_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using M = op_math_t<T>;
    const Device dev = x.device();
    const std::int64_t rows = x.numel() / d;
    const M* pm = cdata<M>(mean);
    const std::int64_t chunks = (rows + kNormChunkRows - 1) / kNormChunkRows;
    const DType mt = dtype_of<M>;
    Tensor pw = dw.defined() ? Tensor::empty({chunks, d}, opts(mt, dev)) : Tensor();
    Tensor pb = db.defined() ? Tensor::empty({chunks, d}, opts(mt, dev)) : Tensor();
    // On CUDA, dx and the parameters' chunk partials in one launch where it serves the shape.
    bool partials_done = false;
    if (dx.defined() && (dw.defined() || db.defined()) && dev.is_cuda()) {
      // Deferring, the launch also leaves dx's own chunk partials for a bias
      // gradient downstream to finish (DeferredPasses::column_partials).
      Tensor pd = defer != nullptr ? Tensor::empty({chunks, d}, opts(mt, dev)) : Tensor();
      QGRAD_ON_CUDA(partials_done =
                        cuda::norm_backward_chunks(x, w, mean, rstd, dy, dy_mask, dx, pw, pb, pd, d, dx_pending));
      if (partials_done && pd.defined()) defer->note_column_partials(dx, pd, kNormChunkRows);
    }
    if (!partials_done && dx.defined()) {
      if (dev.is_cuda() && cuda::use_norm_warp(d))
        QGRAD_ON_CUDA(cuda::norm_backward_warp_rows(x, w, mean, rstd, dy, dx, d, dy_mask, dx_pending));
      else if (mean.defined())
        for_each_index(dev, rows, NormBackwardRow<T, true>{cdata<T>(x), cdata<T>(w), cdata<T>(dy), mdata<T>(dx), pm,
                                                           cdata<M>(rstd), d, dy_mask, cdata<T>(dx_pending)},
                       "layer_norm_backward");
      else
        for_each_index(dev, rows, NormBackwardRow<T, false>{cdata<T>(x), cdata<T>(w), cdata<T>(dy), mdata<T>(dx),
                                                            nullptr, cdata<M>(rstd), d, dy_mask,
                                                            cdata<T>(dx_pending)},
                       "rms_norm_backward");
    }
    if (!dw.defined() && !db.defined()) return;
    const NormChunkColumns<T> cols{rows, d};
    if (dw.defined() && db.defined()) {  // both in one pass a stage (dy read once)
      const NormWeightPartial<T> wp{cols, cdata<T>(x), cdata<T>(dy), pm, cdata<M>(rstd), mdata<M>(pw), dy_mask};
      const NormBiasPartial<T> bp{cols, cdata<T>(dy), mdata<M>(pb), dy_mask};
      if (!partials_done)
        for_each_column_sum(dev, chunks * d, ColumnSumPair<NormWeightPartial<T>, NormBiasPartial<T>>{{wp, bp}},
                            "norm_backward");
      if (defer != nullptr) {
        defer->column_sums_finish(pw, dw);
        defer->column_sums_finish(pb, db);
        return;
      }
      const ChunkSumsFinish<T> fw{cdata<M>(pw), mdata<T>(dw), chunks, d}, fb{cdata<M>(pb), mdata<T>(db), chunks, d};
      for_each_column_sum(dev, d, ColumnSumPair<ChunkSumsFinish<T>, ChunkSumsFinish<T>>{{fw, fb}}, "norm_backward");
      return;
    }
    if (dw.defined()) {
      const NormWeightPartial<T> wp{cols, cdata<T>(x), cdata<T>(dy), pm, cdata<M>(rstd), mdata<M>(pw), dy_mask};
      if (!partials_done) for_each_column_sum(dev, chunks * d, wp, "norm_backward");
      if (defer != nullptr) defer->column_sums_finish(pw, dw);
      else for_each_column_sum(dev, d, ChunkSumsFinish<T>{cdata<M>(pw), mdata<T>(dw), chunks, d}, "norm_backward");
    }
    if (db.defined()) {
      const NormBiasPartial<T> bp{cols, cdata<T>(dy), mdata<M>(pb), dy_mask};
      if (!partials_done) for_each_column_sum(dev, chunks * d, bp, "norm_backward");
      if (defer != nullptr) defer->column_sums_finish(pb, db);
      else for_each_column_sum(dev, d, ChunkSumsFinish<T>{cdata<M>(pb), mdata<T>(db), chunks, d}, "norm_backward");
    }
  });
}

void embedding(const Tensor& weight, const Tensor& indices, const Tensor& out) {
  dispatch_floating_label(weight.dtype(), indices.dtype(), "embedding", [&](auto tag, auto ltag) {
    using T = typename decltype(tag)::type;
    using L = typename decltype(ltag)::type;
    const EmbeddingGather<T, L> gather{cdata<T>(weight), cdata<L>(indices), mdata<T>(out), weight.size(0),
                                       weight.size(1)};
    if (out.is_cuda() && gather.D % 4 == 0 && vec4_aligned<T>(gather.w) && vec4_aligned<T>(gather.out))
      for_each_index(out.device(), out.numel() / 4, EmbeddingGatherFour<T, L>{gather}, "embedding");
    else
      for_each_index(out.device(), out.numel(), gather, "embedding");
  });
}

void embedding_backward(const Tensor& dy, const Tensor& indices, const Tensor& dweight, std::int64_t padding_idx) {
  const Device dev = dweight.device();
  const std::int64_t n = indices.numel(), V = dweight.size(0), D = dweight.size(1);
  // 1. The indices as s64 keys, and the positions 0..n-1 stably sorted by key.
  Tensor keys = Tensor::empty({n}, opts(DType::s64, dev));
  dispatch_label(indices.dtype(), [&](auto ltag) {
    using L = typename decltype(ltag)::type;
    for_each_index(dev, n, ToKeys<L>{cdata<L>(indices), mdata<std::int64_t>(keys)}, "embedding_backward");
  });
  Tensor sorted = Tensor::empty({n}, opts(DType::s64, dev));
  Tensor order = Tensor::empty({n}, opts(DType::s64, dev));
  if (dev.is_cuda()) {
    QGRAD_ON_CUDA(cuda::sort_keys_with_positions(keys, sorted, order));
  } else {
    const std::int64_t* k = cdata<std::int64_t>(keys);
    std::int64_t* o = mdata<std::int64_t>(order);
    std::iota(o, o + n, std::int64_t{0});
    std::stable_sort(o, o + n, [k](std::int64_t a, std::int64_t b) { return k[a] < k[b]; });
    std::int64_t* s = mdata<std::int64_t>(sorted);
    for (std::int64_t i = 0; i < n; ++i) s[i] = k[o[i]];
  }
  // 2. Each vocabulary row's segment of the sorted keys (keys outside [0, V)
  // fall before starts[0] or after starts[V]: they contribute nothing).
  Tensor starts = Tensor::empty({V + 1}, opts(DType::s64, dev));
  for_each_index(dev, V + 1, SegmentStarts{cdata<std::int64_t>(sorted), mdata<std::int64_t>(starts), n},
                 "embedding_backward");
  // 3. Each (row, column) sums its segment in order.
  dispatch_floating(dweight.dtype(), "embedding_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    for_each_index(dev, V * D,
                   EmbeddingRowGrad<T>{cdata<T>(dy), cdata<std::int64_t>(order), cdata<std::int64_t>(starts),
                                       mdata<T>(dweight), D, padding_idx},
                   "embedding_backward");
  });
}

void dropout(const Tensor& x, const Tensor& y, const Tensor& mask, std::uint64_t seed, std::uint64_t offset, double p) {
  dispatch_floating(y.dtype(), "dropout", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using M = op_math_t<T>;
    map_elements_masked(y.device(), y.numel(), cdata<T>(x), mdata<T>(y), mdata<std::uint32_t>(mask),
                        Dropout<T>{seed, offset, p, M(dropout_scale(p))}, "dropout");
  });
}

void dropout_backward(const Tensor& dy, const Tensor& mask, const Tensor& dx, double p) {
  dispatch_floating(dx.dtype(), "dropout_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using M = op_math_t<T>;
    map_elements(dx.device(), dx.numel(), cdata<T>(dy), mdata<T>(dx),
                 DropoutBackward<T>{cdata<std::uint32_t>(mask), M(dropout_scale(p))}, "dropout_backward");
  });
}

}  // namespace qgrad::kernels
