// cross_entropy's forward in one launch (issue #16 item 2: a QAT step's node
// count). The library computes the per-row losses and the softmax it saves
// (one index per row, kernels/softmax.cpp), then their batch mean
// (sum_block_kernel, kernels/cuda/reduce.cu: thread t sums rows t, t + 256,
// ... in order, then a fixed shared-memory tree): two launches in every
// step. One block can do both in the same order: thread t computes the
// losses of rows t, t + 256, ... and adds each as it comes, then the same
// tree and division, so the loss is the library's bits by construction.
//   library  cross_entropy(logits, labels) with logits requiring grad (softmax saved);
//   fused    one block of 256 threads: rows, softmax, and the mean.
// Checked against the library: the loss and the saved softmax (through the
// backward of 1: dlogits = (p - onehot) / B) byte for byte. Times: 20 calls
// captured in a qgrad::CudaGraph, median of 21 replays, µs a call. Shapes:
// the MLP steps' logits (10 classes, batch 256 and 4096); rows shorter than
// kWarpRowMin (wider ones take the library's warp-per-row kernel, another order).
// Run by hand on the GPU machine:  build-gpu/dev/dev_cross_entropy_mean
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "../../bench/bench_common.h"
#include "captured_timing.cuh"
#include "qgrad/core/cuda/common.cuh"
#include "qgrad/kernels/formulas/softmax.h"
#include "qgrad/kernels/softmax.h"
#include "qgrad/qgrad.h"

using namespace qgrad;
using bench::same_bytes;

namespace {

constexpr unsigned kThreads = 256;  // kReduceThreads of kernels/cuda/reduce.cu

__global__ void __launch_bounds__(kThreads)
    cross_entropy_mean_kernel(const float* __restrict__ x, const std::int64_t* __restrict__ labels,
                              float* __restrict__ p, float* __restrict__ loss, std::int64_t B, std::int64_t C) {
  ::qgrad::cuda::wait_for_prior_kernels();
  __shared__ float buf[kThreads];
  float acc = 0.0f;
  for (std::int64_t b = threadIdx.x; b < B; b += kThreads)
    acc += formulas::cross_entropy_row(x + b * C, labels[b], C, p + b * C);
  buf[threadIdx.x] = acc;
  __syncthreads();
  for (unsigned s = kThreads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) buf[threadIdx.x] += buf[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) loss[0] = buf[0] / static_cast<float>(B);
}

void launch_fused(const Tensor& x, const Tensor& labels, const Tensor& p, const Tensor& loss) {
  ::qgrad::cuda::launch_kernel(0, cross_entropy_mean_kernel, 1, kThreads, 0, static_cast<const float*>(x.data_ptr()),
                               static_cast<const std::int64_t*>(labels.data_ptr()), p.data<float>(),
                               loss.data<float>(), x.size(0), x.size(1));
}

void run_shape(std::int64_t B, std::int64_t C) {
  Generator g(0xce);
  const TensorOptions on_gpu = TensorOptions{}.with_device(Device::cuda());
  const Tensor x = (randn({B, C}, g, on_gpu) * 4.0).detach();
  const Tensor labels = randint(0, C, {B}, g, TensorOptions{}.with_device(Device::cuda()).with_dtype(DType::s64));
  Tensor xg = x.detach();
  xg.set_requires_grad(true);
  Tensor loss_lib = cross_entropy(xg, labels);
  loss_lib.backward();
  // dlogits = (p - onehot) / B: the saved softmax is p = dlogits * B + onehot, compared as dlogits.
  const Tensor dx_lib = xg.grad();
  Tensor p = Tensor::empty({B, C}, on_gpu), loss = Tensor::empty({}, on_gpu);
  DEV_CHECK_CUDA(cudaMemset(p.data_ptr(), 0xff, p.nbytes()));  // poisoned
  DEV_CHECK_CUDA(cudaMemset(loss.data_ptr(), 0xff, loss.nbytes()));
  launch_fused(x, labels, p, loss);
  // The library's backward kernel on the fused kernel's p, with the same g = 1.
  const Tensor dx = Tensor::empty({B, C}, on_gpu);
  kernels::cross_entropy_backward(p, labels, ones({}, on_gpu), dx);
  std::printf("{\"bench\":\"cross_entropy_mean\",\"B\":%lld,\"C\":%lld,\"loss\":\"%s\",\"softmax\":\"%s\"",
              static_cast<long long>(B), static_cast<long long>(C), same_bytes(loss, loss_lib) ? "same" : "DIFFERS",
              same_bytes(dx, dx_lib) ? "same" : "DIFFERS");
  const double lib = captured_us([&] {
    Tensor l = cross_entropy(xg, labels);
    (void)l;
  });
  const double fused = captured_us([&] { launch_fused(x, labels, p, loss); });
  std::printf(",\"library_us\":%.2f,\"fused_us\":%.2f}\n", lib, fused);
}

}  // namespace

int main() {
  if (!cuda_available()) {
    std::printf("{\"bench\":\"cross_entropy_mean\",\"skipped\":\"no CUDA device\"}\n");
    return 0;
  }
  const std::int64_t shapes[][2] = {{256, 10}, {4096, 10}};
  for (const auto& s : shapes) run_shape(s[0], s[1]);
  return 0;
}
