// Shared by the dev programs that time grid barriers (grid_barrier.cu,
// cluster_splitk.cu): a grid-wide barrier from an arrival counter and a
// generation word, with acquire/release loads and stores and one atomic a
// block, for grids whose blocks are all resident (no cooperative launch needed).
#pragma once

#include <cuda_runtime.h>

__device__ inline unsigned load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ inline void store_release(unsigned* p, unsigned v) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// count[0]: arrivals, count[1]: generation (both start at 0).
__device__ inline void counter_barrier(unsigned* count) {
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned gen = load_acquire(count + 1);
    __threadfence();
    if (atomicAdd(count, 1u) == gridDim.x - 1) {
      count[0] = 0;
      store_release(count + 1, gen + 1);
    } else {
      while (load_acquire(count + 1) == gen) {
      }
    }
  }
  __syncthreads();
}
