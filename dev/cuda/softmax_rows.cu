// dev/cuda/softmax_rows.cu: softmax's forward over contiguous rows of 1024
// f32 (bench_train_ops' softmax_8192x1024), the library's kernel against
// rows held in registers (llm.c style: every variant, its check and its
// timing in one file; not part of the library). The library walks each row
// in memory three times (max, sum of exps, output; kernels/cuda/norm_rows.cu)
// and ran at 0.62x of PyTorch's (H200, twenty-sixth session), whose warp
// softmax holds the row and its exps in registers; the library's own held
// build ran 0.0675 ms in two calls and 0.0328 in a third.
//
// Every variant keeps the library's order: lane l takes elements l, l + 32,
// ... in order, the lanes combine by warp_lane_sum's tree, the max starts
// from the row's first element; so the same bits, checked byte for byte
// against the library's op on seeded rows and on rows with -inf, NaN and
// ties before it is timed.
//
// Variants ("impl"): lib (the op), walk (the library's formula, this file's
// launch), held<T>_k<keep>_r<R>_<grid>: T threads a block, keep the exps in
// the row's registers (1) or recompute them (0), R rows a warp at once,
// one pass over the rows or grid-stride over 4 waves of resident blocks.
// Output: one check line per variant, then JSON lines
// {"bench":"dev_softmax_rows","impl":...,"ms":...,"gbs":...,"frac_copy":...}.
#include <cstdio>
#include <limits>

#include "../../bench/bench_common.h"
#include "qgrad/kernels/cuda/warp_rows.cuh"
#include "qgrad/kernels/formulas/softmax.h"

using namespace qgrad;
using namespace qgrad::bench;
using qgrad::kernels::cuda::warp_lane_sum;
using qgrad::kernels::cuda::warp_max;

namespace {

constexpr int kD = 1024;
constexpr int kPer = kD / 32;

// R rows a warp, each held as kPer registers a lane (lane l: l + 32 t).
template <int kThreads, bool kKeep, int R, bool kGridStride>
__global__ void __launch_bounds__(kThreads) held_kernel(const float* __restrict__ x, float* __restrict__ y,
                                                        std::int64_t rows) {
  const int lane = static_cast<int>(threadIdx.x & 31u);
  const std::int64_t warp = (static_cast<std::int64_t>(blockIdx.x) * kThreads + threadIdx.x) >> 5;
  const std::int64_t warps = (static_cast<std::int64_t>(gridDim.x) * kThreads) >> 5;
  for (std::int64_t r0 = warp * R; r0 < rows; r0 += kGridStride ? warps * R : rows) {
    float v[R][kPer];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float* xr = x + (r0 + r) * kD + lane;
#pragma unroll
      for (int t = 0; t < kPer; ++t) v[r][t] = r0 + r < rows ? xr[32 * t] : 0.0f;
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (r0 + r >= rows) break;  // warp-uniform
      float m = __shfl_sync(0xffffffffu, v[r][0], 0);
#pragma unroll
      for (int t = 0; t < kPer; ++t) m = formulas::max_nan(m, v[r][t]);
      const float mx = warp_max(m);
      float s = 0.0f;
#pragma unroll
      for (int t = 0; t < kPer; ++t) {
        const float e = formulas::exp_m(v[r][t] - mx);
        s += e;
        if constexpr (kKeep) v[r][t] = e;
      }
      const float sum = warp_lane_sum(s);
      float* yr = y + (r0 + r) * kD + lane;
#pragma unroll
      for (int t = 0; t < kPer; ++t) yr[32 * t] = (kKeep ? v[r][t] : formulas::exp_m(v[r][t] - mx)) / sum;
    }
  }
}

// The library's formula (norm_rows.cu softmax_launch) on a one-pass grid.
__global__ void __launch_bounds__(256) walk_kernel(const float* __restrict__ x, float* __restrict__ y,
                                                   std::int64_t rows) {
  const int lane = static_cast<int>(threadIdx.x & 31u);
  const std::int64_t r = (static_cast<std::int64_t>(blockIdx.x) * 256 + threadIdx.x) >> 5;
  if (r >= rows) return;
  const float* xr = x + r * kD;
  float m = xr[0];
  for (int c = lane; c < kD; c += 32) m = formulas::max_nan(m, xr[c]);
  const float mx = warp_max(m);
  float s = 0.0f;
  for (int c = lane; c < kD; c += 32) s += formulas::exp_m(xr[c] - mx);
  const float sum = warp_lane_sum(s);
  for (int c = lane; c < kD; c += 32) y[r * kD + c] = formulas::exp_m(xr[c] - mx) / sum;
}

void row(const char* impl, const Timing& t, double bytes, double copy_gbs) {
  memory_row("dev_softmax_rows", nullptr, impl, t, bytes, copy_gbs);
}

struct Inputs {
  Tensor x, y_lib, y;  // seeded rows with special values planted
  std::int64_t rows;
};

template <class K>
unsigned grid(K kernel, int threads, std::int64_t rows, int R, bool grid_stride) {
  if (!grid_stride) return static_cast<unsigned>((rows + (threads / 32) * R - 1) / ((threads / 32) * R));
  int per_sm = 0, sms = 0;
  QGRAD_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0));
  QGRAD_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  return static_cast<unsigned>(per_sm * sms * 4);
}

template <class K>
void variant(const char* impl, K kernel, int threads, int R, bool grid_stride, Inputs& in, double copy_gbs,
             bool& all_ok) {
  const unsigned g = grid(kernel, threads, in.rows, R, grid_stride);
  cudaStream_t s = qgrad::cuda::stream(0);
  auto run = [&](int) {
    kernel<<<g, threads, 0, s>>>(static_cast<const float*>(in.x.data_ptr()), static_cast<float*>(in.y.data_ptr()),
                                 in.rows);
  };
  QGRAD_CUDA_CHECK(cudaMemsetAsync(in.y.data_ptr(), 0xff, in.y.nbytes(), s));  // poison
  run(0);
  const bool ok = same_bytes(in.y, in.y_lib);
  all_ok = all_ok && ok;
  int regs = 0;
  cudaFuncAttributes attr{};
  if (cudaFuncGetAttributes(&attr, kernel) == cudaSuccess) regs = attr.numRegs;
  std::printf("check %s (%d registers, %u blocks): %s\n", impl, regs, g, ok ? "same bytes as the library" : "DIFFERS");
  row(impl, time_cuda(run), 2.0 * static_cast<double>(in.x.nbytes()), copy_gbs);
}

}  // namespace

int main() {
  if (!cuda_available()) {
    std::printf("dev_softmax_rows: no CUDA device present; nothing measured\n");
    return 0;
  }
  NoGradGuard ng;
  Generator gen(0x50f7);
  constexpr std::int64_t kRows = 8192;
  Inputs in;
  in.rows = kRows;
  {
    Tensor h = randn({kRows, kD}, gen, TensorOptions{}, 0.0, 3.0);
    float* p = static_cast<float*>(h.data_ptr());
    const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
    p[5 * kD + 7] = nan;                               // a NaN inside a row
    p[9 * kD] = nan;                                   // a NaN first (the max starts there)
    for (int c = 0; c < kD; ++c) p[11 * kD + c] = -inf;  // a row of -inf
    p[13 * kD + 100] = inf;                            // +inf
    for (int c = 0; c < kD; ++c) p[17 * kD + c] = 1.5f;  // ties
    in.x = h.to(Device::cuda());
  }
  in.y_lib = softmax(in.x, -1);
  in.y = empty_like(in.y_lib);
  const double copy_gbs = copy_bandwidth_gbs(static_cast<std::size_t>(in.x.nbytes()));
  row("lib", time_cuda([&](int) { softmax(in.x, -1); }), 2.0 * static_cast<double>(in.x.nbytes()), copy_gbs);
  bool ok = true;
  variant("walk", walk_kernel, 256, 1, false, in, copy_gbs, ok);
  variant("held256_k1_r1_pass", held_kernel<256, true, 1, false>, 256, 1, false, in, copy_gbs, ok);
  variant("held256_k0_r1_pass", held_kernel<256, false, 1, false>, 256, 1, false, in, copy_gbs, ok);
  variant("held128_k1_r1_pass", held_kernel<128, true, 1, false>, 128, 1, false, in, copy_gbs, ok);
  variant("held512_k1_r1_pass", held_kernel<512, true, 1, false>, 512, 1, false, in, copy_gbs, ok);
  variant("held256_k1_r1_stride", held_kernel<256, true, 1, true>, 256, 1, true, in, copy_gbs, ok);
  variant("held256_k0_r1_stride", held_kernel<256, false, 1, true>, 256, 1, true, in, copy_gbs, ok);
  variant("held256_k1_r2_pass", held_kernel<256, true, 2, false>, 256, 2, false, in, copy_gbs, ok);
  variant("held128_k1_r2_pass", held_kernel<128, true, 2, false>, 128, 2, false, in, copy_gbs, ok);
  std::printf("copy bandwidth %.1f GB/s; every variant %s\n", copy_gbs, ok ? "matched" : "did NOT match");
  return ok ? 0 : 1;
}
