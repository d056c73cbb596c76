// Reductions over one axis, one source for both devices (kernels/loop.h);
// long rows on CUDA take the block reduction of kernels/cuda/reduce.cu.
#include "qgrad/kernels/reduce.h"

#include <algorithm>

#include "qgrad/kernels/cuda/entries.h"
#include "qgrad/kernels/loop.h"

namespace qgrad::kernels {

namespace {

// One output per index, summing its row in one fixed order.
template <class T>
struct SumRow {
  const T* x;
  T* o;
  AxisLayout v;
  bool mean;
  QGRAD_HD void operator()(std::int64_t idx) const {
    using M = op_math_t<T>;
    const M acc = sum_strided(x + v.base(idx), v.channels, v.inner);
    o[idx] = T(mean ? acc / M(v.channels) : acc);
  }
};

template <class T>
struct ExpandAxis {
  const T* x;
  T* o;
  AxisLayout v;
  op_math_t<T> s;
  QGRAD_HD void operator()(std::int64_t i) const {
    using M = op_math_t<T>;
    o[i] = T(M(x[(i / (v.channels * v.inner)) * v.inner + i % v.inner]) * s);
  }
};

template <class T>
struct ArgmaxRow {
  const T* x;
  std::int64_t* o;
  AxisLayout v;
  QGRAD_HD void operator()(std::int64_t idx) const { o[idx] = argmax_strided(x + v.base(idx), v.channels, v.inner); }
};

// The CPU's sums over an axis with at least kColumnRun consecutive outputs
// (column sums: a bias gradient over the batch): a task owns a run of
// kColumnRun outputs of one outer index and adds the rows into their
// accumulators one row at a time, a vectorisable loop over the run. Each
// output still adds its elements from row 0 upward starting from 0: the
// bits of SumRow's in-order sum.
constexpr std::int64_t kColumnRun = 64;

template <class T>
void column_sums_cpu(const T* x, T* o, const AxisLayout& v, bool mean) {
  using M = op_math_t<T>;
  const std::int64_t runs = (v.inner + kColumnRun - 1) / kColumnRun;
  cpu::parallel_for(
      v.outer * runs,
      [&](std::int64_t task) {
        const std::int64_t outer = task / runs, j0 = (task % runs) * kColumnRun;
        const std::int64_t len = std::min(kColumnRun, v.inner - j0);
        M acc[kColumnRun];
        for (std::int64_t j = 0; j < len; ++j) acc[j] = M(0);
        const T* row = x + outer * v.channels * v.inner + j0;
        for (std::int64_t r = 0; r < v.channels; ++r, row += v.inner)
          for (std::int64_t j = 0; j < len; ++j) acc[j] += M(row[j]);
        T* out = o + outer * v.inner + j0;
        for (std::int64_t j = 0; j < len; ++j) out[j] = T(mean ? acc[j] / M(v.channels) : acc[j]);
      },
      std::max<std::int64_t>(1, cpu::kParallelGrain / std::max<std::int64_t>(1, v.channels * kColumnRun)));
}

}  // namespace

void sum_axis(const Tensor& in, const Tensor& out, const AxisLayout& v, bool mean,
              [[maybe_unused]] DeferredPasses* defer) {  // used on CUDA only
  if (out.is_cuda() && v.channels > cuda::kSumThreadPerRowMax) {
    QGRAD_ON_CUDA(cuda::sum_axis_blocks(in, out, v, mean, defer));
    return;
  }
  dispatch_floating(out.dtype(), "sum", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (!out.is_cuda() && v.inner >= kColumnRun) {
      column_sums_cpu<T>(static_cast<const T*>(in.data_ptr()), static_cast<T*>(out.data_ptr()), v, mean);
      return;
    }
    for_each_index(out.device(), v.outer * v.inner,
                   SumRow<T>{static_cast<const T*>(in.data_ptr()), static_cast<T*>(out.data_ptr()), v, mean}, "sum");
  });
}

void expand_axis(const Tensor& in, const Tensor& out, const AxisLayout& v, double scale) {
  dispatch_floating(out.dtype(), "expand_axis", [&](auto tag) {
    using T = typename decltype(tag)::type;
    for_each_index(out.device(), out.numel(),
                   ExpandAxis<T>{static_cast<const T*>(in.data_ptr()), static_cast<T*>(out.data_ptr()), v,
                                 op_math_t<T>(scale)},
                   "expand_axis");
  });
}

void argmax_axis(const Tensor& in, const Tensor& out, const AxisLayout& v) {
  dispatch_floating(in.dtype(), "argmax", [&](auto tag) {
    using T = typename decltype(tag)::type;
    for_each_index(out.device(), v.outer * v.inner,
                   ArgmaxRow<T>{static_cast<const T*>(in.data_ptr()), static_cast<std::int64_t*>(out.data_ptr()), v},
                   "argmax");
  });
}

}  // namespace qgrad::kernels
