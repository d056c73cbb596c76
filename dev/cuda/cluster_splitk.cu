// What a split-K exchange costs in the fused QAT MLP kernel's shape
// (kernels/cuda/qat_mlp.cu: a cooperative grid of 2 blocks of 256 threads
// per SM, 64 x 32 output tiles, a grid barrier after each phase), and
// whether thread-block clusters can carry it instead of global memory.
// Each round: every block holds a 64 x 32 tile's partial sums (8 a thread);
// the C blocks of a group are one tile's C parts; the tile is summed in part
// order; then a grid barrier. Variants (µs a round, CUDA events around a
// launch of kRounds rounds):
//   barrier   the grid barrier alone
//   global    the kernel's way: parts stored (st.cg), fence, an atomic per
//             tile, the last block to arrive sums the C parts (ld.cg)
//   dsmem     the C blocks of a tile are one cluster: parts in shared memory,
//             cluster.sync(), rank r sums rows [64 r / C, 64 (r + 1) / C)
//             of every rank's part (map_shared_rank), in rank order
// global and dsmem must give the same bits. Asks first whether a cooperative
// launch takes a cluster dimension (cudaLaunchKernelEx with both attributes)
// and how many clusters fit (cudaOccupancyMaxActiveClusters); where it does
// not, the cluster variants use a counter barrier (dev/cuda/grid_barrier.cu).
// Standalone (no library): nvcc -O3 -arch=sm_90 -std=c++17 -o cluster_splitk cluster_splitk.cu
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#include "counter_barrier.cuh"

namespace cg = cooperative_groups;

namespace {

constexpr int kThreads = 256, kTileM = 64, kTileN = 32, kRounds = 1000;
constexpr int kSmem = 53 * 1024;  // the fused kernel's dynamic shared memory: 2 blocks an SM

struct Args {
  float* parts;        // [C][tiles][64 * 32]
  float* out;          // [tiles][64 * 32]
  unsigned* counters;  // [tiles], left at 0
  unsigned* barrier;   // counter_barrier's two words
  int C;
  int coop;  // 1: grid.sync(), 0: counter_barrier
};

__device__ float partial(int part, int tile, int o, int round) {
  // Values whose sum depends on the order (mixed magnitudes).
  unsigned h = (part * 7919u + tile * 104729u + o * 2654435761u + round * 40503u) * 2246822519u;
  h ^= h >> 13;
  const float m = 1.0f + static_cast<float>(h & 0xffffu) / 65536.0f;
  return (h & 0x10000u ? -m : m) * (h & 0x20000u ? 1.0e4f : 1.0e-3f);
}

__device__ void grid_barrier(const Args& a) {
  if (a.coop) cg::this_grid().sync();
  else counter_barrier(a.barrier);
}

// Thread (ty, tx)'s outputs rows ty*4+i, cols tx+16j, as in the fused kernel.
__device__ int out_index(int i, int j) { return ((threadIdx.x >> 4) * 4 + i) * kTileN + (threadIdx.x & 15) + 16 * j; }

__global__ void barrier_kernel(Args a) {
  for (int r = 0; r < kRounds; ++r) grid_barrier(a);
}

__global__ void global_kernel(Args a) {
  __shared__ bool last;
  const int tile = blockIdx.x / a.C, part = blockIdx.x % a.C, tiles = gridDim.x / a.C;
  const long plane = static_cast<long>(tiles) * kTileM * kTileN;
  float* tile_out = a.out + static_cast<long>(tile) * kTileM * kTileN;
  for (int r = 0; r < kRounds; ++r) {
    float acc[4][2];
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 2; ++j) acc[i][j] = partial(part, tile, out_index(i, j), r);
    float* mine = a.parts + part * plane + static_cast<long>(tile) * kTileM * kTileN;
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 2; ++j) __stcg(mine + out_index(i, j), acc[i][j]);
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(a.counters + tile, 1u) == static_cast<unsigned>(a.C - 1);
    __syncthreads();
    if (last) {
      __threadfence();
      constexpr int kInFlight = 4;
      for (int p0 = 0; p0 < a.C; p0 += kInFlight) {
        float v[kInFlight][4][2];
#pragma unroll
        for (int q = 0; q < kInFlight; ++q)
#pragma unroll
          for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 2; ++j)
              v[q][i][j] = p0 + q < a.C
                               ? __ldcg(a.parts + (p0 + q) * plane + static_cast<long>(tile) * kTileM * kTileN +
                                        out_index(i, j))
                               : 0.0f;
#pragma unroll
        for (int q = 0; q < kInFlight; ++q)
#pragma unroll
          for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 2; ++j)
              if (p0 + q < a.C) acc[i][j] = p0 + q == 0 ? v[q][i][j] : acc[i][j] + v[q][i][j];
      }
      for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 2; ++j) tile_out[out_index(i, j)] = acc[i][j];
      if (threadIdx.x == 0) a.counters[tile] = 0;
    }
    grid_barrier(a);
  }
}

__global__ void dsmem_kernel(Args a) {
  extern __shared__ __align__(16) float smem[];
  cg::cluster_group cluster = cg::this_cluster();
  const int C = static_cast<int>(cluster.num_blocks());
  const int rank = static_cast<int>(cluster.block_rank());
  const int tile = blockIdx.x / C;
  float* tile_out = a.out + static_cast<long>(tile) * kTileM * kTileN;
  const int rows = kTileM / C;  // this rank's rows of the sum
  for (int r = 0; r < kRounds; ++r) {
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 2; ++j) {
        const int o = out_index(i, j);
        smem[o] = partial(rank, tile, o, r);
      }
    cluster.sync();  // every rank's part is in its shared memory
    for (int o = threadIdx.x; o < rows * kTileN; o += kThreads) {
      const int at = rank * rows * kTileN + o;
      float v[8];
#pragma unroll
      for (int q = 0; q < 8; ++q) v[q] = q < C ? *cluster.map_shared_rank(smem + at, q) : 0.0f;
      float acc = v[0];
#pragma unroll
      for (int q = 1; q < 8; ++q)
        if (q < C) acc += v[q];
      tile_out[at] = acc;
    }
    grid_barrier(a);  // every rank has read the parts: they may be overwritten
  }
}

cudaError_t launch(void (*k)(Args), int grid, int cluster, bool coop, const Args& a) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = kSmem;
  cudaLaunchAttribute attr[2];
  int n = 0;
  if (coop) {
    attr[n].id = cudaLaunchAttributeCooperative;
    attr[n++].val.cooperative = 1;
  }
  if (cluster > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = cluster;
    attr[n].val.clusterDim.y = 1;
    attr[n++].val.clusterDim.z = 1;
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  return cudaLaunchKernelEx(&cfg, k, a);
}

float time_it(void (*k)(Args), int grid, int cluster, bool coop, const Args& a, cudaError_t& err) {
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  err = launch(k, grid, cluster, coop, a);  // warm-up
  if (err == cudaSuccess) err = cudaDeviceSynchronize();
  if (err != cudaSuccess) {
    cudaGetLastError();
    return -1.0f;
  }
  cudaEventRecord(e0);
  launch(k, grid, cluster, coop, a);
  cudaEventRecord(e1);
  err = cudaEventSynchronize(e1);
  float ms = 0;
  cudaEventElapsedTime(&ms, e0, e1);
  return ms * 1000.0f / kRounds;
}

}  // namespace

int main() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  for (auto k : {barrier_kernel, global_kernel, dsmem_kernel}) {
    cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
    cudaFuncSetAttribute(k, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  }
  int per_sm = 0;
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, global_kernel, kThreads, kSmem);
  std::printf("%d SMs, %d blocks of %d threads an SM at %d B dynamic shared memory\n", sms, per_sm, kThreads, kSmem);
  const int max_grid = sms * per_sm;
  float *parts, *out;
  unsigned *counters, *barrier;
  cudaMalloc(&parts, sizeof(float) * 16 * max_grid * kTileM * kTileN);
  cudaMalloc(&out, sizeof(float) * max_grid * kTileM * kTileN);
  cudaMalloc(&counters, sizeof(unsigned) * max_grid);
  cudaMalloc(&barrier, 8);
  cudaMemset(counters, 0, sizeof(unsigned) * max_grid);
  cudaMemset(barrier, 0, 8);
  std::vector<float> ref(static_cast<size_t>(max_grid) * kTileM * kTileN), got(ref.size());
  for (int C : {2, 4, 8, 16}) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(C);
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = kSmem;
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = C;
    attr.val.clusterDim.y = attr.val.clusterDim.z = 1;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    // The fewest clusters any of the three kernels keeps resident (their shared memory differs).
    int clusters = 1 << 30;
    cudaError_t oe = cudaSuccess;
    for (auto k : {barrier_kernel, global_kernel, dsmem_kernel}) {
      int c = 0;
      const cudaError_t e = cudaOccupancyMaxActiveClusters(&c, k, &cfg);
      if (e != cudaSuccess) oe = e;
      clusters = std::min(clusters, c);
    }
    if (oe != cudaSuccess) {
      std::printf("cluster %2d: occupancy query: %s\n", C, cudaGetErrorString(oe));
      cudaGetLastError();
      continue;
    }
    const int grid = std::min(clusters * C, max_grid) / C * C;
    Args a{parts, out, counters, barrier, C, 1};
    cudaError_t e_coop = cudaSuccess, e = cudaSuccess;
    const float t_dsmem_coop = time_it(dsmem_kernel, grid, C, true, a, e_coop);
    std::printf("cluster %2d: %d clusters fit (grid %d); cooperative + cluster launch: %s\n", C, clusters, grid,
                e_coop == cudaSuccess ? "accepted" : cudaGetErrorString(e_coop));
    const bool coop = e_coop == cudaSuccess;
    a.coop = coop ? 1 : 0;
    cudaMemcpy(got.data(), out, sizeof(float) * grid / C * kTileM * kTileN, cudaMemcpyDeviceToHost);
    const float t_barrier_plain = time_it(barrier_kernel, grid, 1, coop, a, e);
    const float t_barrier = time_it(barrier_kernel, grid, C, coop, a, e);
    const float t_global = time_it(global_kernel, grid, C, coop, a, e);
    cudaMemcpy(ref.data(), out, sizeof(float) * grid / C * kTileM * kTileN, cudaMemcpyDeviceToHost);
    const float t_dsmem = coop ? t_dsmem_coop : time_it(dsmem_kernel, grid, C, false, a, e);
    if (!coop) cudaMemcpy(got.data(), out, sizeof(float) * grid / C * kTileM * kTileN, cudaMemcpyDeviceToHost);
    const bool same = t_global > 0 && t_dsmem > 0 &&
                      std::memcmp(ref.data(), got.data(), sizeof(float) * grid / C * kTileM * kTileN) == 0;
    std::printf("  %s barrier, us a round: barrier alone %.3f (no cluster dim %.3f); global %.3f; dsmem %.3f;"
                " same bits: %s; last error: %s\n",
                coop ? "grid.sync" : "counter", t_barrier, t_barrier_plain, t_global, t_dsmem, same ? "yes" : "NO",
                cudaGetErrorString(e));
  }
  return 0;
}
