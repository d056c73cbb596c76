// CUDA relu with its mask: the forward packs the x > 0 mask with one warp
// ballot per 32 elements (no atomics). The rest of relu is kernels/activation.cpp.
#include "qgrad/kernels/bitmask.h"
#include "qgrad/kernels/cuda/entries.h"
#include "qgrad/core/cuda/common.cuh"
#include "qgrad/kernels/formulas/activation.h"

namespace qgrad::kernels::cuda {

namespace {

constexpr unsigned kThreads = 256;  // a multiple of 32: warps cover aligned runs of 32 indices

// Grid-stride over [0, n rounded up to 32) so every warp stays converged for
// the ballot: lanes past n write nothing and contribute a zero bit.
template <class T>
__global__ void relu_mask_kernel(const T* x, T* y, std::uint32_t* words, std::int64_t n) {
  using M = op_math_t<T>;
  const std::int64_t padded = bitmask_words(n) * 32;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < padded; i += stride) {
    bool bit = false;
    if (i < n) {
      const M v = M(x[i]);
      y[i] = T(formulas::relu(v));
      bit = formulas::relu_mask(v);
    }
    bitmask_ballot_store(words, i, n, bit);
  }
}

template <class T>
void relu_masked_impl(const Tensor& in, const Tensor& out, const Tensor& mask) {
  const T* x = static_cast<const T*>(in.data_ptr());
  T* y = static_cast<T*>(out.data_ptr());
  const std::int64_t n = out.numel();
  const int dev = out.device().index;
  if (n == 0) return;
  auto* words = static_cast<std::uint32_t*>(mask.data_ptr());
  const unsigned blocks =
      ::qgrad::cuda::blocks_for(bitmask_words(n) * 32, kThreads, ::qgrad::cuda::fill_blocks(dev, kThreads) * 4LL);
  relu_mask_kernel<T><<<blocks, kThreads, 0, ::qgrad::cuda::stream(dev)>>>(x, y, words, n);
  QGRAD_LAUNCH_CHECK();
}

}  // namespace

void relu_masked(const Tensor& in, const Tensor& out, const Tensor& mask) {
  dispatch_floating(out.dtype(), "relu",
                    [&](auto tag) { relu_masked_impl<typename decltype(tag)::type>(in, out, mask); });
}

}  // namespace qgrad::kernels::cuda
