// The binary kernels, one source for both devices (kernels/loop.h).
#include "qgrad/kernels/binary.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "qgrad/kernels/basic.h"
#include "qgrad/kernels/broadcast.h"
#include "qgrad/kernels/formulas/cast.h"
#include "qgrad/kernels/layout.h"
#include "qgrad/kernels/loop.h"
#include "qgrad/kernels/reduce.h"
#include "qgrad/kernels/vec4.h"

namespace qgrad::kernels {

namespace {

// Inputs of out's shape: both offsets are the output index.
struct SameShapeIndex {
  QGRAD_HD void offsets(std::int64_t i, std::int64_t& oa, std::int64_t& ob) const { oa = ob = i; }
};

// Index is SameShapeIndex or BroadcastIndex (broadcast.h).
template <class T, class Index>
struct Binary {
  formulas::BinaryOp op;
  const T* x;
  const T* y;
  T* o;
  Index index;
  QGRAD_HD void operator()(std::int64_t i) const {
    using M = op_math_t<T>;
    std::int64_t oa, ob;
    index.offsets(i, oa, ob);
    o[i] = T(formulas::binary_apply<M>(op, M(x[oa]), M(y[ob])));
  }
};

// Same-shape inputs on CUDA, four elements an index through one aligned
// vector access per operand (Binary's one element a thread left the loads too
// few in flight: 11 us for the ViT's 1.6 M-element residual adds, about half
// of copy bandwidth). The same formula per element, so the same bits.
template <class T>
struct BinaryFour {
  formulas::BinaryOp op;
  const Vec4<T>* x;
  const Vec4<T>* y;
  Vec4<T>* o;
  QGRAD_HD void operator()(std::int64_t q) const {
    using M = op_math_t<T>;
    const Vec4<T> a = x[q], b = y[q];
    Vec4<T> r;
    for (int k = 0; k < 4; ++k) r.v[k] = T(formulas::binary_apply<M>(op, M(a.v[k]), M(b.v[k])));
    o[q] = r;
  }
};

// The CPU form of a broadcast: one index per row of the innermost
// (collapsed) dim, whose offsets are decomposed once; the row is walked with
// each operand's stride there (1, or 0 where it is broadcast). The same
// formula per element as Binary, so the results are the same bits.
template <class T>
struct BinaryRows {
  formulas::BinaryOp op;
  const T* x;
  const T* y;
  T* o;
  BroadcastIndex index;
  std::int64_t len, step_a, step_b;
  QGRAD_HD void operator()(std::int64_t r) const {
    using M = op_math_t<T>;
    std::int64_t oa, ob;
    index.offsets(r * len, oa, ob);
    T* out = o + r * len;
    for (std::int64_t j = 0; j < len; ++j)
      out[j] = T(formulas::binary_apply<M>(op, M(x[oa + j * step_a]), M(y[ob + j * step_b])));
  }
};

template <class T>
struct BinaryScalar {
  formulas::BinaryOp op;
  const T* x;
  op_math_t<T> s;
  T* o;
  QGRAD_HD void operator()(std::int64_t i) const {
    using M = op_math_t<T>;
    o[i] = T(formulas::binary_apply<M>(op, M(x[i]), s));
  }
};

// sum_to_shape's short reductions (for_each_row_sum): output j sums its
// red_count inputs, enumerated row-major over the reduced dims, in
// formulas::lane_sum's order, so CPU and CUDA agree bit for bit (and the
// result is deterministic); a warp per output on CUDA.
template <class T>
struct SumToShapeRows {
  using Acc = op_math_t<T>;
  const T* x;
  T* o;
  ReduceIndex ri;
  QGRAD_HD std::int64_t count(std::int64_t) const { return ri.red_count; }
  QGRAD_HD Acc term(std::int64_t r, std::int64_t j) const { return Acc(x[ri.base(j) + ri.reduced(r)]); }
  QGRAD_HD void write(std::int64_t j, Acc s) const { o[j] = T(s); }
};

// channel_mul's backward in one pass, for channels of fewer than
// kAxisPassesMinReduction elements (where sum_to_shape takes SumToShapeRows):
// channel c's terms are T(dy * x) over its elements in [outer, inner] order
// (sum_to_shape's order for mul(dy, x) summed to scale's broadcast shape),
// and a term's visit also writes dx = T(dy * scale[c]) (Binary's product),
// so dx costs no launch of its own. The terms of a channel partition the
// tensor, so every dx element is written; lane_terms_sum repeats a term past
// the end of its last batch (unused), whose dx store repeats the same value.
// A pending gradient is added as the engine's accumulate adds it.
template <class T>
struct ChannelMulBackwardRows {
  using Acc = op_math_t<T>;
  const T* dy;
  const T* x;
  const T* scale;
  const T* pending;  // or null
  T* dx;             // or null
  T* dscale;
  AxisLayout v;
  QGRAD_HD std::int64_t count(std::int64_t) const { return v.outer * v.inner; }
  QGRAD_HD Acc term(std::int64_t r, std::int64_t c) const {
    using M = op_math_t<T>;
    // offset_in_channel's value; with one outer run (a conv weight along axis
    // 0) without its 64-bit division a term.
    const std::int64_t k = v.outer == 1 ? c * v.inner + r : v.offset_in_channel(r, c);
    const M g = M(dy[k]);
    if (dx != nullptr) dx[k] = T(formulas::binary_apply<M>(formulas::BinaryOp::mul, g, M(scale[c])));
    return Acc(T(formulas::binary_apply<M>(formulas::BinaryOp::mul, g, M(x[k]))));
  }
  QGRAD_HD void write(std::int64_t c, Acc s) const {
    using M = op_math_t<T>;
    const T sum = T(s);
    dscale[c] = pending != nullptr ? T(formulas::binary_apply<M>(formulas::BinaryOp::add, M(pending[c]), M(sum))) : sum;
  }
};

}  // namespace

void binary(formulas::BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  dispatch_floating(out.dtype(), "binary", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* x = static_cast<const T*>(a.data_ptr());
    const T* y = static_cast<const T*>(b.data_ptr());
    T* o = static_cast<T*>(out.data_ptr());
    if (a.shape() == b.shape()) {
      const std::int64_t n = out.numel();
      if (out.is_cuda() && n % 4 == 0 && vec4_aligned<T>(x) && vec4_aligned<T>(y) && vec4_aligned<T>(o)) {
        for_each_index(out.device(), n / 4,
                       BinaryFour<T>{op, reinterpret_cast<const Vec4<T>*>(x), reinterpret_cast<const Vec4<T>*>(y),
                                     reinterpret_cast<Vec4<T>*>(o)},
                       "binary");
        return;
      }
      for_each_index(out.device(), n, Binary<T, SameShapeIndex>{op, x, y, o, {}}, "binary");
      return;
    }
    const BroadcastIndex bi = make_broadcast_index(a.shape(), b.shape(), out.shape());
    const std::int64_t len = bi.ndim > 0 ? bi.sizes[bi.ndim - 1] : 1;
    if (!out.is_cuda() && len >= 8) {
      const BinaryRows<T> rows{op, x, y, o, bi, len, bi.stride_a[bi.ndim - 1], bi.stride_b[bi.ndim - 1]};
      for_each_index(out.device(), out.numel() / len, rows, "binary",
                     std::max<std::int64_t>(1, cpu::kParallelGrain / len));
      return;
    }
    for_each_index(out.device(), out.numel(), Binary<T, BroadcastIndex>{op, x, y, o, bi}, "binary");
  });
}

void binary_scalar(formulas::BinaryOp op, const Tensor& a, double b, const Tensor& out) {
  dispatch_floating(out.dtype(), "binary_scalar", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const op_math_t<T> s = op_math_t<T>(formulas::cast_value<T>(b));
    for_each_index(out.device(), out.numel(),
                   BinaryScalar<T>{op, static_cast<const T*>(a.data_ptr()), s, static_cast<T*>(out.data_ptr())},
                   "binary_scalar");
  });
}

// SumToShapeRows is one warp per output on CUDA, looping over every reduced
// element (with an index decomposition per element): a gradient [N, C, H, W]
// summed to [1, C, 1, 1] (a per-channel factor's backward) is then C warps
// reading N H W elements each (with a thread per output, as before, it cost
// hundreds of milliseconds on a large batch). Reductions of
// kAxisPassesMinReduction or more per output (binary.h) run instead as passes
// of sum_axis (block reductions for long rows on CUDA, contiguous row sums on
// the CPU).

// Out = in summed to out's shape as a sequence of sum_axis passes over runs
// of adjacent reduced dims, innermost run first. 16-bit inputs are summed in
// f32 and rounded once at the end. The order of the additions differs from
// SumToShapeRows: the usual f32 summation error, not bit identity, across devices
// for such long reductions (sum_axis's CUDA block trees differ from the CPU's
// in-order row sums); each device stays deterministic.
void sum_to_shape_by_axes(const Tensor& in, const Tensor& out) {
  const Shape& is = in.shape();
  const Shape& os = out.shape();
  const std::size_t lead = is.size() - os.size();
  std::vector<std::pair<std::int64_t, bool>> runs;  // (size, reduced), adjacent runs alternate
  for (std::size_t k = 0; k < is.size(); ++k) {
    if (is[k] == 1) continue;
    const bool reduced = k < lead || os[k - lead] == 1;
    if (!runs.empty() && runs.back().second == reduced) runs.back().first *= is[k];
    else runs.emplace_back(is[k], reduced);
  }
  const DType acc_dtype = out.dtype() == DType::f64 ? DType::f64 : DType::f32;
  Tensor cur = in;
  if (in.dtype() != acc_dtype) {
    cur = Tensor::empty(in.shape(), TensorOptions{}.with_dtype(acc_dtype).with_device(in.device()));
    cast(in, cur);
  }
  for (;;) {
    std::size_t j = runs.size();
    for (std::size_t k = 0; k < runs.size(); ++k)
      if (runs[k].second) j = k;
    if (j == runs.size()) break;
    AxisLayout v;
    for (std::size_t k = 0; k < j; ++k) v.outer *= runs[k].first;
    v.channels = runs[j].first;
    for (std::size_t k = j + 1; k < runs.size(); ++k) v.inner *= runs[k].first;
    runs.erase(runs.begin() + static_cast<std::ptrdiff_t>(j));
    if (j > 0 && j < runs.size()) {  // the kept runs on both sides become one
      runs[j - 1].first *= runs[j].first;
      runs.erase(runs.begin() + static_cast<std::ptrdiff_t>(j));
    }
    const bool last = std::none_of(runs.begin(), runs.end(), [](const auto& r) { return r.second; });
    Tensor next = last && acc_dtype == out.dtype()
                      ? out
                      : Tensor::empty({v.outer * v.inner}, TensorOptions{}.with_dtype(acc_dtype).with_device(out.device()));
    sum_axis(cur, next, v, /*mean=*/false);
    cur = next;
  }
  if (cur.data_ptr() != out.data_ptr()) cast(cur, out);
}

void sum_to_shape(const Tensor& in, const Tensor& out) {
  if (out.numel() > 0 && in.numel() / out.numel() >= kAxisPassesMinReduction) {
    sum_to_shape_by_axes(in, out);
    return;
  }
  dispatch_floating(out.dtype(), "sum_to_shape", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const ReduceIndex ri = make_reduce_index(in.shape(), out.shape());
    for_each_row_sum(out.device(), out.numel(),
                     SumToShapeRows<T>{static_cast<const T*>(in.data_ptr()), static_cast<T*>(out.data_ptr()), ri},
                     "sum_to_shape");
  });
}

void channel_mul_backward(const Tensor& dy, const Tensor& x, const Tensor& scale, std::int64_t axis,
                          const Tensor& pending, const Tensor& dx, const Tensor& dscale) {
  const AxisLayout v = AxisLayout::of(dy.shape(), axis);
  dispatch_floating(dy.dtype(), "channel_mul_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const auto ptr = [](const Tensor& t) { return t.defined() ? static_cast<T*>(t.data_ptr()) : nullptr; };
    for_each_row_sum(dy.device(), v.channels,
                     ChannelMulBackwardRows<T>{ptr(dy), ptr(x), ptr(scale), ptr(pending), ptr(dx), ptr(dscale), v},
                     "channel_mul_backward");
  });
}

}  // namespace qgrad::kernels
