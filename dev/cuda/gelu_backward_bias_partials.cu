// dev/cuda/gelu_backward_bias_partials.cu: fc1's bias-gradient partial sums
// written by the GELU backward that produces fc1's output gradient (issue
// #13 item 5, the ViT step: f32 at 1.29x of the 1.3x asked, 2026-11-27).
//
// In the ViT's MLP the backward of gelu_fake_quantize_dynamic (kernels/
// transformer.cpp GeluBackwardFour: dx = gelu'(h) * dy * bit, four elements
// an index) writes dh [12544, 256]; fc1's bias gradient then reads all of dh
// again for its column partials (kernels/cuda/reduce.cu ColumnChunkPartial
// through column_sum_short_kernel: 64-row chunks, formulas::lane_sum's order)
// before the deferred finish sums the chunks. The norms' backward already
// leaves such partials for the residual stream's linears
// (DeferredPasses::note_column_partials); here the GELU backward does the same
// for fc1: a block takes a 64-row chunk and 64 columns, writes dh and, from
// the rounded values it holds, the chunk's partial of each column in
// lane_sum's order (lane l: +0, then row l, then row l + 32; the lanes'
// tree by shuffles, the short kernel's pairing), so the partials are the
// short kernel's bytes and the 12 launches of a step's fc1 partials go.
//
// The program checks dh and the partials byte for byte against the library's
// two kernels (f32 and bf16; the ViT's 12544 rows and 1003, a partial last
// chunk; a mask with zeros), then times both paths in a CUDA graph (50
// calls, median of 21 replays). Written in a session without device time
// left; not run yet. Standalone (headers only):
//   nvcc -O3 -std=c++20 -arch=sm_90 --expt-relaxed-constexpr --fmad=false
//     -Ibuild/include/kernels -Ibuild/include/core dev/cuda/gelu_backward_bias_partials.cu
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "graph_timing.cuh"
#include "qgrad/core/half.h"
#include "qgrad/kernels/bitmask.h"
#include "qgrad/kernels/cuda/column_sum.cuh"
#include "qgrad/kernels/formulas/transformer.h"
#include "qgrad/kernels/layout.h"
#include "qgrad/kernels/vec4.h"

namespace {

using namespace qgrad;
using qgrad::kernels::AxisLayout;
using qgrad::kernels::Vec4;

constexpr std::int64_t kChunkRows = 64;  // reduce.cu's kColumnChunkRows

// The library's element: GeluBackward::at (kernels/transformer.cpp, erf form, with a mask).
template <class T>
__device__ __forceinline__ T gelu_grad(std::int64_t i, T dyv, T xv, const std::uint32_t* mask) {
  using M = op_math_t<T>;
  M g = M(dyv);
  if (mask != nullptr) g = M(T(g * M(bitmask_get(mask, i) ? 1 : 0)));
  return T(formulas::gelu_erf_backward(g, M(xv)));
}

// The library's path, kernel 1: GeluBackwardFour, an index a thread.
template <class T>
__global__ void gelu_backward_four_kernel(std::int64_t n4, const T* dy, const T* x, T* dx, const std::uint32_t* mask) {
  const std::int64_t q = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (q >= n4) return;
  const Vec4<T> g = reinterpret_cast<const Vec4<T>*>(dy)[q], xv = reinterpret_cast<const Vec4<T>*>(x)[q];
  Vec4<T> r;
  for (int k = 0; k < 4; ++k) r.v[k] = gelu_grad(4 * q + k, g.v[k], xv.v[k], mask);
  reinterpret_cast<Vec4<T>*>(dx)[q] = r;
}

// The library's path, kernel 2: reduce.cu's ColumnChunkPartial over dx [rows, cols].
template <class T>
struct ColumnChunkPartial {
  using Acc = op_math_t<T>;
  static constexpr std::int64_t kMaxCount = kChunkRows;
  const T* x;
  Acc* dst;
  AxisLayout v;
  std::int64_t rows;
  __device__ std::int64_t count(std::int64_t i) const {
    const std::int64_t r0 = i / (v.outer * v.inner) * rows;
    return v.channels - r0 < rows ? v.channels - r0 : rows;
  }
  __device__ Acc term(std::int64_t k, std::int64_t i) const {
    const std::int64_t lines = v.outer * v.inner, j = i % lines, r = i / lines * rows + k;
    return Acc(x[v.base(j) + r * v.inner]);
  }
  __device__ void write(std::int64_t i, Acc s) const { dst[i] = s; }
};

// The fused kernel: block (chunk c, 64 columns from c0); thread (quad q =
// t % 16, row thread u = t / 16) takes columns c0 + 4q .. + 3 of rows
// 64c + u + 16k, k = 0..3. Lane l of a column's lane_sum is rows l and
// l + 32 of the chunk: thread u holds lanes u (k = 0, 2) and u + 16 (k = 1, 3).
template <class T>
__global__ void __launch_bounds__(256)
    gelu_backward_partials_kernel(std::int64_t rows, std::int64_t cols, const T* __restrict__ dy,
                                  const T* __restrict__ x, T* __restrict__ dx, const std::uint32_t* __restrict__ mask,
                                  op_math_t<T>* __restrict__ partial) {
  using M = op_math_t<T>;
  __shared__ M lanes[32][64 + 1];
  const std::int64_t c = blockIdx.x, c0 = std::int64_t{blockIdx.y} * 64;
  const int q = static_cast<int>(threadIdx.x % 16), u = static_cast<int>(threadIdx.x / 16);
  M held[4][4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const std::int64_t r = c * kChunkRows + u + 16 * k;
    if (r < rows) {
      const std::int64_t i0 = r * cols + c0 + 4 * q;
      const Vec4<T> g = *reinterpret_cast<const Vec4<T>*>(dy + i0), xv = *reinterpret_cast<const Vec4<T>*>(x + i0);
      Vec4<T> o;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        o.v[e] = gelu_grad(i0 + e, g.v[e], xv.v[e], mask);
        held[k][e] = M(o.v[e]);
      }
      *reinterpret_cast<Vec4<T>*>(dx + i0) = o;
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e) held[k][e] = M(0);  // a missing term: +0 (a lane's sum is never -0)
    }
  }
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    M a = M(0);
    a += held[0][e];
    a += held[2][e];
    lanes[u][4 * q + e] = a;
    M b = M(0);
    b += held[1][e];
    b += held[3][e];
    lanes[u + 16][4 * q + e] = b;
  }
  __syncthreads();
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int col = 8 * warp + j;
    M s = lanes[lane][col];
#pragma unroll
    for (int h = 16; h > 0; h /= 2) {
      const M other = __shfl_down_sync(0xffffffffu, s, h);
      if (lane < h) s += other;
    }
    if (lane == 0) partial[c * cols + c0 + col] = s;
  }
}

int failures = 0;

template <class T>
void run_case(const char* name, std::int64_t rows, std::int64_t cols) {
  using M = op_math_t<T>;
  const std::int64_t n = rows * cols, chunks = (rows + kChunkRows - 1) / kChunkRows;
  std::mt19937 gen(11);
  std::normal_distribution<float> nd(0.0f, 1.5f);
  std::vector<T> hdy(static_cast<std::size_t>(n)), hx(static_cast<std::size_t>(n));
  for (auto& v : hdy) v = T(nd(gen));
  for (auto& v : hx) v = T(nd(gen));
  hdy[3] = T(-0.0f);
  std::vector<std::uint32_t> hmask(static_cast<std::size_t>(bitmask_words(n)));
  for (auto& w : hmask) w = static_cast<std::uint32_t>(gen()) | static_cast<std::uint32_t>(gen());  // mostly ones
  T *dy, *x, *dx1, *dx2;
  M *p1, *p2;
  std::uint32_t* mask;
  const std::size_t bytes = static_cast<std::size_t>(n) * sizeof(T), pbytes = static_cast<std::size_t>(chunks * cols) * sizeof(M);
  DEV_CHECK_CUDA(cudaMalloc(&dy, bytes));
  DEV_CHECK_CUDA(cudaMalloc(&x, bytes));
  DEV_CHECK_CUDA(cudaMalloc(&dx1, bytes));
  DEV_CHECK_CUDA(cudaMalloc(&dx2, bytes));
  DEV_CHECK_CUDA(cudaMalloc(&p1, pbytes));
  DEV_CHECK_CUDA(cudaMalloc(&p2, pbytes));
  DEV_CHECK_CUDA(cudaMalloc(&mask, hmask.size() * 4));
  DEV_CHECK_CUDA(cudaMemcpy(dy, hdy.data(), bytes, cudaMemcpyHostToDevice));
  DEV_CHECK_CUDA(cudaMemcpy(x, hx.data(), bytes, cudaMemcpyHostToDevice));
  DEV_CHECK_CUDA(cudaMemcpy(mask, hmask.data(), hmask.size() * 4, cudaMemcpyHostToDevice));
  const AxisLayout v{1, rows, cols};
  const auto library = [&](cudaStream_t s) {
    const std::int64_t n4 = n / 4;
    gelu_backward_four_kernel<T><<<static_cast<unsigned>((n4 + 255) / 256), 256, 0, s>>>(n4, dy, x, dx1, mask);
    const std::int64_t sums = chunks * cols;
    qgrad::kernels::cuda::column_sum_short_kernel<ColumnChunkPartial<T>>
        <<<static_cast<unsigned>((4 * sums + 127) / 128), 128, 0, s>>>(sums, ColumnChunkPartial<T>{dx1, p1, v, kChunkRows});
  };
  const auto fused = [&](cudaStream_t s) {
    gelu_backward_partials_kernel<T><<<dim3(static_cast<unsigned>(chunks), static_cast<unsigned>(cols / 64)), 256, 0, s>>>(
        rows, cols, dy, x, dx2, mask, p2);
  };
  DEV_CHECK_CUDA(cudaMemset(dx1, 0x7f, bytes));
  DEV_CHECK_CUDA(cudaMemset(dx2, 0x7e, bytes));
  DEV_CHECK_CUDA(cudaMemset(p1, 0x7f, pbytes));
  DEV_CHECK_CUDA(cudaMemset(p2, 0x7e, pbytes));
  library(nullptr);
  fused(nullptr);
  DEV_CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<unsigned char> a(bytes), b(bytes), pa(pbytes), pb(pbytes);
  DEV_CHECK_CUDA(cudaMemcpy(a.data(), dx1, bytes, cudaMemcpyDeviceToHost));
  DEV_CHECK_CUDA(cudaMemcpy(b.data(), dx2, bytes, cudaMemcpyDeviceToHost));
  DEV_CHECK_CUDA(cudaMemcpy(pa.data(), p1, pbytes, cudaMemcpyDeviceToHost));
  DEV_CHECK_CUDA(cudaMemcpy(pb.data(), p2, pbytes, cudaMemcpyDeviceToHost));
  const bool same = a == b && pa == pb;
  if (!same) ++failures;
  std::printf("%-22s %6lld x %lld: dx %s, partials %s\n", name, static_cast<long long>(rows),
              static_cast<long long>(cols), a == b ? "same bytes" : "DIFFERENT", pa == pb ? "same bytes" : "DIFFERENT");
  for (int round = 0; round < 2; ++round)
    std::printf("%-22s us a call: library (gelu backward + column partials) %.2f, fused %.2f\n", name,
                graph_us(library), graph_us(fused));
  for (void* p : {static_cast<void*>(dy), static_cast<void*>(x), static_cast<void*>(dx1), static_cast<void*>(dx2),
                  static_cast<void*>(p1), static_cast<void*>(p2), static_cast<void*>(mask)})
    DEV_CHECK_CUDA(cudaFree(p));
}

}  // namespace

int main() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("dev_gelu_backward_bias_partials: no CUDA device\n");
    return 0;
  }
  cudaDeviceProp prop{};
  DEV_CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s\n", prop.name);
  run_case<float>("f32 fc1 (ViT b256)", 12544, 256);
  run_case<Float16<BFloat16Format>>("bf16 fc1 (ViT b256)", 12544, 256);
  run_case<float>("f32, partial chunk", 1003, 256);
  run_case<Float16<BFloat16Format>>("bf16, partial chunk", 1003, 128);
  std::printf(failures == 0 ? "the fused kernel gives the library's bytes\n" : "FUSED KERNEL DIFFERS\n");
  return failures == 0 ? 0 : 1;
}
