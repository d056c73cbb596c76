// The cost of a grid-wide barrier on this GPU (the fused QAT MLP kernel,
// kernels/cuda/qat_mlp.cu, has 2L + 1 of them, and its b256 phases measured
// ~10 us even where they do almost nothing: dev/cuda/qat_mlp_phases.cu).
// Variants, each a cooperative launch looping kIters barriers (µs a barrier,
// from CUDA events around the launch, minus nothing: 1000 barriers a launch):
//   cg       cooperative_groups::this_grid().sync()
//   counter  an arrival counter and a generation word (acquire/release loads
//            and stores, one atomic a block), block 0's thread 0 not special
//   cg+work  cg with each block reading every block's 2 floats first (the
//            kernel's per-phase combine of the observers' partial ranges)
// for grids of 1 and 2 blocks of 256 threads per SM and 1 of 512.
// Standalone (no library): nvcc -O3 -arch=sm_90 -o grid_barrier grid_barrier.cu
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cstdio>

#include "counter_barrier.cuh"

namespace {

constexpr int kIters = 1000;

__global__ void cg_kernel(float* sink) {
  auto grid = cooperative_groups::this_grid();
  for (int i = 0; i < kIters; ++i) grid.sync();
  if (threadIdx.x == 0 && blockIdx.x == 0) sink[0] = 1.0f;
}

__global__ void cg_work_kernel(float* partial, float* sink) {
  auto grid = cooperative_groups::this_grid();
  float acc = 0.0f;
  for (int i = 0; i < kIters; ++i) {
    if (threadIdx.x == 0) partial[2 * blockIdx.x] = static_cast<float>(i);
    grid.sync();
    for (unsigned k = threadIdx.x; k < gridDim.x; k += blockDim.x) acc += __ldcg(partial + 2 * k);
    __syncthreads();
  }
  if (acc == -1.0f) sink[0] = acc;
}

__global__ void counter_kernel(unsigned* count, float* sink) {
  for (int i = 0; i < kIters; ++i) counter_barrier(count);
  if (threadIdx.x == 0 && blockIdx.x == 0) sink[0] = 1.0f;
}

template <class... A>
float time_launch(void (*k)(A...), int blocks, int threads, A... args) {
  void* params[] = {&args...};
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  cudaLaunchCooperativeKernel(reinterpret_cast<void*>(k), blocks, threads, params, 0, nullptr);  // warm-up
  cudaEventRecord(e0);
  cudaLaunchCooperativeKernel(reinterpret_cast<void*>(k), blocks, threads, params, 0, nullptr);
  cudaEventRecord(e1);
  cudaEventSynchronize(e1);
  float ms = 0;
  cudaEventElapsedTime(&ms, e0, e1);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) std::printf("  error: %s\n", cudaGetErrorString(err));
  return ms * 1000.0f / kIters;
}

}  // namespace

int main() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  float* sink;
  float* partial;
  unsigned* count;
  cudaMalloc(&sink, 4);
  cudaMalloc(&partial, 8 * 4096);
  cudaMalloc(&count, 8);
  cudaMemset(count, 0, 8);
  std::printf("grid barrier, us each (%d SMs, %d barriers a launch)\n", sms, kIters);
  const int shapes[3][2] = {{sms, 256}, {2 * sms, 256}, {sms, 512}};
  for (const auto& s : shapes) {
    const float cg = time_launch(cg_kernel, s[0], s[1], sink);
    const float counter = time_launch(counter_kernel, s[0], s[1], count, sink);
    const float work = time_launch(cg_work_kernel, s[0], s[1], partial, sink);
    std::printf("  %4d x %3d: cg %.3f  counter %.3f  cg+work %.3f\n", s[0], s[1], cg, counter, work);
  }
  return 0;
}
