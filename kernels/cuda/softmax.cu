// The warp-per-row CUDA kernels of log_softmax and the fused cross-entropy,
// for contiguous rows of at least kWarpRowMin elements (use_warp_rows): lanes
// stride over the row, then butterfly shuffles combine them. Deterministic:
// the choice and the order depend only on the shape. (Commutative butterfly
// steps leave every lane with the same sum; the max is taken from lane 0.)
// Shorter or strided rows, and the gradients, are kernels/softmax.cpp.
#include "qgrad/core/cuda/common.cuh"
#include "qgrad/kernels/cuda/entries.h"
#include "qgrad/kernels/cuda/warp_rows.cuh"
#include "qgrad/kernels/formulas/softmax.h"
#include "qgrad/kernels/softmax.h"

namespace qgrad::kernels::cuda {

namespace {

// max and sum(exp(x - max)) of a contiguous row of n, across the warp.
template <class T>
__device__ __forceinline__ void warp_row_stats(const T* x, std::int64_t n, int lane, op_math_t<T>& mx,
                                               op_math_t<T>& sum) {
  using M = op_math_t<T>;
  M m = -std::numeric_limits<M>::infinity();
  for (std::int64_t c = lane; c < n; c += 32) m = formulas::max_nan(m, M(x[c]));
  mx = warp_max(m);
  M s = M(0);
  for (std::int64_t c = lane; c < n; c += 32) s += formulas::exp_m(M(x[c]) - mx);
  sum = warp_sum(s);
}

template <class T>
void log_softmax_impl(const Tensor& x, const Tensor& y, const AxisLayout& v) {
  using M = op_math_t<T>;
  const T* in = static_cast<const T*>(x.data_ptr());
  T* out = static_cast<T*>(y.data_ptr());
  const std::int64_t n = v.channels;
  launch_warp_rows(y.device().index, v.outer, [=] __device__(std::int64_t row, int lane) {
    const T* xr = in + row * n;
    M mx, sum;
    warp_row_stats(xr, n, lane, mx, sum);
    const M lse = formulas::log_m(sum);
    for (std::int64_t c = lane; c < n; c += 32) out[row * n + c] = T((M(xr[c]) - mx) - lse);
  });
}

template <class T>
void log_softmax_backward_impl(const Tensor& y, const Tensor& dy, const Tensor& dx, const AxisLayout& v) {
  using M = op_math_t<T>;
  const T* py = static_cast<const T*>(y.data_ptr());
  const T* pg = static_cast<const T*>(dy.data_ptr());
  T* out = static_cast<T*>(dx.data_ptr());
  const std::int64_t n = v.channels;
  launch_warp_rows(dx.device().index, v.outer, [=] __device__(std::int64_t row, int lane) {
    const std::int64_t base = row * n;
    M s = M(0);
    for (std::int64_t c = lane; c < n; c += 32) s += M(pg[base + c]);
    const M sum = warp_sum(s);
    for (std::int64_t c = lane; c < n; c += 32)
      out[base + c] = T(formulas::log_softmax_grad(M(pg[base + c]), M(py[base + c]), sum));
  });
}

template <class T, class L>
void cross_entropy_forward_impl(const Tensor& logits, const Tensor& labels, const Tensor& probs,
                                const Tensor& row_loss) {
  using M = op_math_t<T>;
  const std::int64_t B = logits.size(0), C = logits.size(1);
  const T* x = static_cast<const T*>(logits.data_ptr());
  const L* lab = static_cast<const L*>(labels.data_ptr());
  T* p = probs.defined() ? static_cast<T*>(probs.data_ptr()) : nullptr;
  M* loss = static_cast<M*>(row_loss.data_ptr());
  launch_warp_rows(row_loss.device().index, B, [=] __device__(std::int64_t b, int lane) {
    const T* xr = x + b * C;
    M mx, sum;
    warp_row_stats(xr, C, lane, mx, sum);
    if (p != nullptr)
      for (std::int64_t c = lane; c < C; c += 32) p[b * C + c] = T(formulas::exp_m(M(xr[c]) - mx) / sum);
    if (lane == 0) loss[b] = formulas::cross_entropy_loss(xr, static_cast<std::int64_t>(lab[b]), C, mx, sum);
  });
}

// One block: thread t the loss (and softmax) of row t, then the mean in the
// order sum_axis would take over the B row losses (see entries.h).
template <class T, class L>
__global__ void __launch_bounds__(kSumBlockThreads)
    cross_entropy_mean_kernel(const T* __restrict__ x, const L* __restrict__ lab, T* __restrict__ p,
                              op_math_t<T>* __restrict__ mean, std::int64_t B, std::int64_t C) {
  ::qgrad::cuda::wait_for_prior_kernels();
  using M = op_math_t<T>;
  __shared__ M rows[kSumBlockThreads];
  const unsigned t = threadIdx.x;
  M acc = M(0);  // sum_block_kernel's accumulator for its one row (0 past B)
  if (t < B)
    acc += formulas::cross_entropy_row(x + t * C, static_cast<std::int64_t>(lab[t]), C, p ? p + t * C : nullptr);
  rows[t] = acc;
  __syncthreads();
  if (B <= kSumThreadPerRowMax) {  // SumRow (kernels/reduce.cpp): one thread, in order
    if (t == 0) mean[0] = sum_strided(rows, B, 1) / M(B);
    return;
  }
  for (unsigned s = kSumBlockThreads / 2; s > 0; s >>= 1) {  // sum_block_kernel's tree
    if (t < s) rows[t] += rows[t + s];
    __syncthreads();
  }
  if (t == 0) mean[0] = rows[0] / M(B);
}

}  // namespace

void cross_entropy_mean_one_block(const Tensor& logits, const Tensor& labels, const Tensor& probs,
                                  const Tensor& mean) {
  dispatch_floating_label(logits.dtype(), labels.dtype(), "cross_entropy", [&](auto tag, auto ltag) {
    using T = typename decltype(tag)::type;
    using L = typename decltype(ltag)::type;
    ::qgrad::cuda::launch_kernel(mean.device().index, cross_entropy_mean_kernel<T, L>, 1, kSumBlockThreads, 0,
                                 static_cast<const T*>(logits.data_ptr()), static_cast<const L*>(labels.data_ptr()),
                                 probs.defined() ? static_cast<T*>(probs.data_ptr()) : nullptr,
                                 static_cast<op_math_t<T>*>(mean.data_ptr()), logits.size(0), logits.size(1));
  });
}

void log_softmax_warp_rows(const Tensor& x, const Tensor& y, const AxisLayout& v) {
  dispatch_floating(y.dtype(), "log_softmax", [&](auto tag) { log_softmax_impl<typename decltype(tag)::type>(x, y, v); });
}

void log_softmax_backward_warp_rows(const Tensor& y, const Tensor& dy, const Tensor& dx, const AxisLayout& v) {
  dispatch_floating(dx.dtype(), "log_softmax_backward",
                    [&](auto tag) { log_softmax_backward_impl<typename decltype(tag)::type>(y, dy, dx, v); });
}

void cross_entropy_forward_warp_rows(const Tensor& logits, const Tensor& labels, const Tensor& probs,
                                     const Tensor& row_loss) {
  dispatch_floating_label(logits.dtype(), labels.dtype(), "cross_entropy", [&](auto tag, auto ltag) {
    cross_entropy_forward_impl<typename decltype(tag)::type, typename decltype(ltag)::type>(logits, labels, probs,
                                                                                            row_loss);
  });
}

}  // namespace qgrad::kernels::cuda
