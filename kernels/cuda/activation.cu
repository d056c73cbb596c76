// CUDA relu: the forward packs the x > 0 mask with one warp ballot per 32
// elements (no atomics); the backward reads one bit per element.
#include "qgrad/kernels/activation.h"
#include "qgrad/kernels/bitmask.h"
#include "qgrad/kernels/cuda/launch.cuh"
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
void relu_impl(const Tensor& in, const Tensor& out, const Tensor& mask) {
  using M = op_math_t<T>;
  const T* x = static_cast<const T*>(in.data_ptr());
  T* y = static_cast<T*>(out.data_ptr());
  const std::int64_t n = out.numel();
  const int dev = out.device().index;
  if (!mask.defined()) {
    launch_elementwise(dev, n, [=] __device__(std::int64_t i) { y[i] = T(formulas::relu(M(x[i]))); });
    return;
  }
  if (n == 0) return;
  auto* words = static_cast<std::uint32_t*>(mask.data_ptr());
  const unsigned blocks =
      ::qgrad::cuda::blocks_for(bitmask_words(n) * 32, kThreads, ::qgrad::cuda::fill_blocks(dev, kThreads) * 4LL);
  relu_mask_kernel<T><<<blocks, kThreads, 0, ::qgrad::cuda::stream(dev)>>>(x, y, words, n);
  QGRAD_LAUNCH_CHECK();
}

template <class T>
void relu_backward_impl(const Tensor& g, const Tensor& mask, const Tensor& dx) {
  using M = op_math_t<T>;
  const T* pg = static_cast<const T*>(g.data_ptr());
  const auto* words = static_cast<const std::uint32_t*>(mask.data_ptr());
  T* d = static_cast<T*>(dx.data_ptr());
  launch_elementwise(dx.device().index, dx.numel(),
                     [=] __device__(std::int64_t i) { d[i] = bitmask_get(words, i) ? pg[i] : T(M(0)); });
}

}  // namespace

void relu(const Tensor& in, const Tensor& out, const Tensor& mask) {
  dispatch_floating(out.dtype(), "relu", [&](auto tag) { relu_impl<typename decltype(tag)::type>(in, out, mask); });
}

void relu_backward(const Tensor& g, const Tensor& mask, const Tensor& dx) {
  dispatch_floating(dx.dtype(), "relu_backward",
                    [&](auto tag) { relu_backward_impl<typename decltype(tag)::type>(g, mask, dx); });
}

}  // namespace qgrad::kernels::cuda
