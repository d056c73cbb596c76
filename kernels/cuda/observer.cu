// Observer kernels on CUDA. The min/max reduction runs in two launches:
// grid (G, C) blocks write per-block partial min/max of channel c to a
// scratch [C, G]; then one block per channel combines its G partials and
// applies the running update. The combine is exact and order-free
// (formulas::min_combine), so the result equals the CPU's bit for bit.
#include "kernels/cuda/launch.cuh"
#include "kernels/formulas/cast.h"
#include "kernels/formulas/observer.h"
#include "kernels/observer.h"

namespace qgrad::kernels::cuda {

namespace {

constexpr unsigned kThreads = 256;

__device__ void block_minmax(float& lo, float& hi) {
  __shared__ float smin[kThreads];
  __shared__ float smax[kThreads];
  smin[threadIdx.x] = lo;
  smax[threadIdx.x] = hi;
  __syncthreads();
  for (unsigned w = kThreads / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) {
      smin[threadIdx.x] = formulas::min_combine(smin[threadIdx.x], smin[threadIdx.x + w]);
      smax[threadIdx.x] = formulas::max_combine(smax[threadIdx.x], smax[threadIdx.x + w]);
    }
    __syncthreads();
  }
  lo = smin[0];
  hi = smax[0];
}

template <class T>
__global__ void partial_minmax_kernel(const T* x, std::int64_t channels, std::int64_t inner, std::int64_t count,
                                      float* partial) {
  const std::int64_t ch = blockIdx.y;
  float lo = INFINITY, hi = -INFINITY;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t k = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < count; k += stride) {
    // One outer slice (per tensor, or channels on axis 0) needs no division.
    const std::int64_t o = count == inner ? 0 : k / inner, i = k - o * inner;
    const float f = formulas::cast_value<float>(x[(o * channels + ch) * inner + i]);
    lo = formulas::min_combine(lo, f);
    hi = formulas::max_combine(hi, f);
  }
  block_minmax(lo, hi);
  if (threadIdx.x == 0) {
    const std::int64_t slot = ch * gridDim.x + blockIdx.x;
    partial[2 * slot] = lo;
    partial[2 * slot + 1] = hi;
  }
}

// Optional qparams (scale == nullptr: none), as observer_qparams computes them.
struct QparamsArgs {
  float* scale = nullptr;
  std::int32_t* zero_point = nullptr;
  std::int64_t qmin = 0, qmax = 0;
  bool symmetric = false;
  std::int32_t symmetric_zero_point = 0;
};

__global__ void finish_minmax_kernel(const float* partial, unsigned parts, float* run_min, float* run_max, float c,
                                     bool moving, QparamsArgs q) {
  const std::int64_t ch = blockIdx.x;
  float lo = INFINITY, hi = -INFINITY;
  for (unsigned k = threadIdx.x; k < parts; k += blockDim.x) {
    const std::int64_t slot = ch * parts + k;
    lo = formulas::min_combine(lo, partial[2 * slot]);
    hi = formulas::max_combine(hi, partial[2 * slot + 1]);
  }
  block_minmax(lo, hi);
  if (threadIdx.x == 0) {
    formulas::observer_update(run_min[ch], run_max[ch], lo, hi, c, moving);
    if (q.scale)
      formulas::observer_qparams(run_min[ch], run_max[ch], q.qmin, q.qmax, q.symmetric, q.symmetric_zero_point,
                                 q.scale[ch], q.zero_point[ch]);
  }
}

template <class T>
void minmax_impl(const Tensor& x, const Tensor& run_min, const Tensor& run_max, std::int64_t axis, double c,
                 const QparamsArgs& q) {
  const ChannelView v = channel_view(x, axis);
  const int dev = x.device().index;
  const std::int64_t count = v.outer * v.inner;
  // Enough blocks to fill the device across all channels, at most 1024 per channel.
  const std::int64_t target = std::max<std::int64_t>(1, ::qgrad::cuda::fill_blocks(dev, kThreads) * 2LL / v.channels);
  const unsigned parts = ::qgrad::cuda::blocks_for(count, kThreads, std::min<std::int64_t>(target, 1024));
  Tensor partial = Tensor::empty({v.channels, static_cast<std::int64_t>(parts), 2},
                                 TensorOptions{}.with_device(x.device()));
  cudaStream_t s = ::qgrad::cuda::stream(dev);
  partial_minmax_kernel<T><<<dim3(parts, static_cast<unsigned>(v.channels)), kThreads, 0, s>>>(
      static_cast<const T*>(x.data_ptr()), v.channels, v.inner, count, partial.data<float>());
  QGRAD_LAUNCH_CHECK();
  finish_minmax_kernel<<<static_cast<unsigned>(v.channels), kThreads, 0, s>>>(
      partial.data<float>(), parts, run_min.data<float>(), run_max.data<float>(), static_cast<float>(c), c >= 0.0, q);
  QGRAD_LAUNCH_CHECK();
}

}  // namespace

void observer_minmax(const Tensor& x, const Tensor& run_min, const Tensor& run_max, std::int64_t axis,
                     double averaging_constant, const ObserverQparams* qparams) {
  QparamsArgs q;
  if (qparams) {
    q.scale = qparams->scale.data<float>();
    q.zero_point = qparams->zero_point.data<std::int32_t>();
    q.qmin = qparams->qmin;
    q.qmax = qparams->qmax;
    q.symmetric = qparams->symmetric;
    q.symmetric_zero_point = qparams->symmetric_zero_point;
  }
  dispatch_floating(x.dtype(), "observer_minmax", [&](auto tag) {
    minmax_impl<typename decltype(tag)::type>(x, run_min, run_max, axis, averaging_constant, q);
  });
}

void observer_qparams(const Tensor& run_min, const Tensor& run_max, const Tensor& scale, const Tensor& zero_point,
                      std::int64_t qmin, std::int64_t qmax, bool symmetric, std::int32_t symmetric_zero_point) {
  const float* mn = run_min.data<float>();
  const float* mx = run_max.data<float>();
  float* s = scale.data<float>();
  std::int32_t* z = zero_point.data<std::int32_t>();
  launch_elementwise(scale.device().index, scale.numel(), [=] __device__(std::int64_t c) {
    formulas::observer_qparams(mn[c], mx[c], qmin, qmax, symmetric, symmetric_zero_point, s[c], z[c]);
  });
}

}  // namespace qgrad::kernels::cuda
