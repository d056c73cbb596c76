// Observer kernels on CUDA. The min/max reduction is one launch. Channels
// that need no splitting to fill the device: a warp per channel. Otherwise:
// grid (G, C) blocks write per-block partial min/max of channel c to a scratch
// [C, G], and the last of channel c's G blocks to finish (a per-channel
// counter, core/cuda/common.cuh's block_counters) combines them and applies
// the running update. More channels than counters: a second launch, one
// block per channel, does the combine. The combine is exact and order-free
// (formulas::min_combine), so the result equals the CPU's bit for bit.
#include <algorithm>
#include <type_traits>

#include "qgrad/kernels/cuda/launch.cuh"
#include "qgrad/kernels/cuda/minmax.cuh"
#include "qgrad/kernels/observer.h"

namespace qgrad::kernels::cuda {

namespace {

// Vectors in flight a thread of partial_minmax_kernel (its f32 slices, read
// in block chunks: minmax.cuh's block_chunk_share). Bounded to 5 resident
// blocks an SM (46 registers, no spills; unbounded it takes 72 and 3 blocks,
// the same time per tensor on an H200: 0.0692 against 0.0693 ms), which
// minmax_parts' wave follows.
inline constexpr int kPartialUnroll = 8;

// counters == nullptr: only the partials (finish_minmax_kernel follows).
template <class T>
__global__ void __launch_bounds__(kMinmaxThreads, 5)
    partial_minmax_kernel(const T* x, std::int64_t channels, std::int64_t inner, std::int64_t count, float* partial,
                          std::uint32_t* counters, float* run_min, float* run_max, float c, bool moving,
                          QparamsArgs q) {
  ::qgrad::cuda::wait_for_prior_kernels();
  const std::int64_t ch = blockIdx.y;
  float lo, hi;
  slice_minmax<T, kPartialUnroll, true>(x, channels, inner, count, ch,
                                        std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x,
                                        std::int64_t{gridDim.x} * blockDim.x, lo, hi);
  block_minmax(lo, hi);
  __shared__ bool last;
  if (threadIdx.x == 0) {
    const std::int64_t slot = ch * gridDim.x + blockIdx.x;
    partial[2 * slot] = lo;
    partial[2 * slot + 1] = hi;
    if (counters) {
      __threadfence();  // the partial is visible before the count says so
      last = atomicAdd(counters + ch, 1u) == gridDim.x - 1;
    }
  }
  if (!counters) return;
  __syncthreads();
  if (!last) return;
  __threadfence();
  finish_channel(partial, gridDim.x, ch, run_min, run_max, c, moving, q);
  if (threadIdx.x == 0) counters[ch] = 0;  // ready for the next launch
}

// One part per channel (minmax_parts == 1: per-token ranges, weight rows,
// any channels that fill the device without splitting): one warp per channel,
// no shared memory or barrier. A block per channel left most of its 256
// threads idle on rows of 128-256 elements and paid a block reduction each
// (43 us per call in the ViT step), and measured slower on long channels too
// (4096 channels of 16384: 0.147 ms against a warp each, 0.113 ms).
inline constexpr unsigned kWarpMinmaxThreads = 256;

template <class T>
__global__ void warp_minmax_kernel(const T* x, std::int64_t channels, std::int64_t inner, std::int64_t count,
                                   float* run_min, float* run_max, float c, bool moving, QparamsArgs q) {
  ::qgrad::cuda::wait_for_prior_kernels();
  const std::int64_t ch = std::int64_t{blockIdx.x} * (kWarpMinmaxThreads / 32) + threadIdx.x / 32;
  if (ch >= channels) return;  // whole warps leave together
  const unsigned lane = threadIdx.x % 32;
  float lo, hi;
  slice_minmax(x, channels, inner, count, ch, lane, 32, lo, hi);
  warp_minmax(lo, hi);
  if (lane == 0) update_channel(ch, lo, hi, run_min, run_max, c, moving, q);
}

__global__ void finish_minmax_kernel(const float* partial, unsigned parts, float* run_min, float* run_max, float c,
                                     bool moving, QparamsArgs q) {
  ::qgrad::cuda::wait_for_prior_kernels();
  finish_channel(partial, parts, blockIdx.x, run_min, run_max, c, moving, q);
}

template <class T>
void minmax_impl(const Tensor& x, const Tensor& run_min, const Tensor& run_max, std::int64_t axis, double c,
                 const QparamsArgs& q) {
  const AxisLayout v = AxisLayout::of(x.shape(), axis);
  const int dev = x.device().index;
  const std::int64_t count = v.outer * v.inner;
  unsigned parts = minmax_parts(dev, v.channels, count);
  // f32 channels in one slice are read in block chunks of kMinmaxThreads *
  // kPartialUnroll vectors: blocks beyond the chunks would find none.
  if (std::is_same_v<T, float> && v.outer == 1 && parts > 1) {
    const std::int64_t chunk = std::int64_t{kMinmaxThreads} * 4 * kPartialUnroll;
    const std::int64_t chunks = std::max<std::int64_t>((count + chunk - 1) / chunk, 2);
    parts = static_cast<unsigned>(std::min<std::int64_t>(parts, chunks));
  }
  if (parts == 1 || v.channels > 65535) {
    const std::int64_t blocks = (v.channels + kWarpMinmaxThreads / 32 - 1) / (kWarpMinmaxThreads / 32);
    ::qgrad::cuda::launch_kernel(dev, warp_minmax_kernel<T>, static_cast<unsigned>(blocks), kWarpMinmaxThreads, 0,
                                 static_cast<const T*>(x.data_ptr()), v.channels, v.inner, count, run_min.data<float>(),
                                 run_max.data<float>(), static_cast<float>(c), c >= 0.0, q);
    return;
  }
  Tensor partial = Tensor::empty({v.channels, static_cast<std::int64_t>(parts), 2},
                                 TensorOptions{}.with_device(x.device()));
  const bool one_launch = static_cast<std::size_t>(v.channels) <= ::qgrad::cuda::kBlockCounters;
  std::uint32_t* counters = one_launch ? ::qgrad::cuda::block_counters(dev) : nullptr;
  ::qgrad::cuda::launch_kernel(dev, partial_minmax_kernel<T>, dim3(parts, static_cast<unsigned>(v.channels)),
                               kMinmaxThreads, 0, static_cast<const T*>(x.data_ptr()), v.channels, v.inner, count,
                               partial.data<float>(), counters, run_min.data<float>(), run_max.data<float>(),
                               static_cast<float>(c), c >= 0.0, q);
  if (one_launch) return;
  ::qgrad::cuda::launch_kernel(dev, finish_minmax_kernel, static_cast<unsigned>(v.channels), kMinmaxThreads, 0,
                               partial.data<float>(), parts, run_min.data<float>(), run_max.data<float>(),
                               static_cast<float>(c), c >= 0.0, q);
}

}  // namespace

unsigned minmax_parts(int device, std::int64_t channels, std::int64_t count) {
  // One wave: as many blocks in all as the device holds resident at once
  // (a second, partial wave left most SMs idle at the end: 1024 blocks per
  // tensor were 1.3 waves, 77% of copy), at least 16 elements per thread,
  // at most 1024 blocks per channel.
  static int per_sm[16] = {};
  const int d = std::min(device, 15);
  if (per_sm[d] == 0) {
    int n = 0;
    QGRAD_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, partial_minmax_kernel<float>, kMinmaxThreads, 0));
    per_sm[d] = std::max(n, 1);
  }
  const std::int64_t wave = std::int64_t{::qgrad::cuda::fill_blocks(device, kMinmaxThreads)} /
                            (2048 / kMinmaxThreads) * per_sm[d];
  const std::int64_t target = std::max<std::int64_t>(1, wave / channels);
  const std::int64_t per_block = kMinmaxThreads * 16LL;
  return static_cast<unsigned>(
      std::clamp<std::int64_t>((count + per_block - 1) / per_block, 1, std::min<std::int64_t>(target, 1024)));
}

void observer_minmax(const Tensor& x, const Tensor& run_min, const Tensor& run_max, std::int64_t axis,
                     double averaging_constant, const ObserverQparams* qparams) {
  const QparamsArgs q = qparams_args(qparams);
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
