// Multi-tensor fused optimizer step: up to kOptimChunk parameters per
// launch; blockIdx.y picks the parameter, a grid-stride loop over x covers
// its elements. The pointer table is a kernel argument (like PyTorch's
// TensorListMetadata), so nothing is copied to the device and the host
// never waits.
#include "qgrad/core/cuda/common.cuh"
#include "qgrad/kernels/cuda/entries.h"

namespace qgrad::kernels::cuda {

namespace {

constexpr int kOptimChunk = 32;

template <class T>
struct OptimTable {
  OptimElems<T> elems[kOptimChunk];
  std::int64_t numel[kOptimChunk];
};

template <class T>
__global__ void optim_kernel(OptimTable<T> table, formulas::OptimScalars<op_math_t<T>> s) {
  const int t = static_cast<int>(blockIdx.y);
  const std::int64_t n = table.numel[t];
  const OptimElems<T> e = table.elems[t];
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    e.update(i, s);
}

template <class T>
void optim_impl(const OptimizerHyper& hyper, const std::vector<OptimizerSlot>& slots) {
  using M = op_math_t<T>;
  const formulas::OptimScalars<M> s = optim_scalars<M>(hyper);
  const int dev = slots.front().param.device().index;
  constexpr unsigned threads = 256;
  cudaStream_t stream = ::qgrad::cuda::stream(dev);
  const std::int64_t max_x = ::qgrad::cuda::fill_blocks(dev, threads) * 2LL;
  for (std::size_t first = 0; first < slots.size(); first += kOptimChunk) {
    OptimTable<T> table{};
    int count = 0;
    std::int64_t largest = 0;
    for (std::size_t k = first; k < slots.size() && count < kOptimChunk; ++k, ++count) {
      const OptimizerSlot& slot = slots[k];
      table.elems[count] = optim_elems<T>(hyper, slot);
      table.numel[count] = slot.param.numel();
      largest = std::max(largest, slot.param.numel());
    }
    if (largest == 0) continue;
    const dim3 grid(::qgrad::cuda::blocks_for(largest, threads, max_x), static_cast<unsigned>(count));
    optim_kernel<T><<<grid, threads, 0, stream>>>(table, s);
    QGRAD_LAUNCH_CHECK();
  }
}

}  // namespace

void optim_step(const OptimizerHyper& hyper, const std::vector<OptimizerSlot>& slots) {
  dispatch_floating(slots.front().param.dtype(), "optim_step",
                    [&](auto tag) { optim_impl<typename decltype(tag)::type>(hyper, slots); });
}

}  // namespace qgrad::kernels::cuda
