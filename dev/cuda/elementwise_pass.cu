// dev/cuda/elementwise_pass.cu: the launch shape of the 16-byte elementwise
// kernels, on the two rows of bench_train_ops still slower than PyTorch
// (issue #16 item 4): gelu's (erf) backward over [8192, 1024] f32 (0.88x on
// some machines, 0.89-1.13x on others with the same SASS) and cat of two
// [8192, 1024] f32 along dim 1 (0.94x). The library ran both as grid-stride
// loops over four waves of resident blocks (kernels/cuda/launch.cuh); PyTorch's
// vectorized kernels cover the range once, 128 threads a block, one 16-byte
// access per operand a thread. Found here (H200, thirty-third session): one
// pass beats four waves (gelu 0.0271 against 0.0278, cat 0.0360 against
// 0.0372), and the library's gelu row (0.0312) lost mostly to the order of
// its loads (docs/benchmarks.md); with both fixed it runs 0.0275, cat 0.0369.
//
// Variants ("impl"): <shape><threads>_v<k>: a grid-stride loop over four waves
// ("stride") or a grid covering the range once ("pass"), k 16-byte units per
// operand a thread (k = 2: both loads issued before either store). gelu: the
// library's formula (formulas::gelu_erf_backward) per element, so the same
// bits as the op, checked byte for byte before timing. cat: each operand's
// rows copied into their columns by one launch each ("two"), or one launch
// over the output's 16-byte units (the op's form since this file's commit).
// Output: one check line per variant, then JSON lines
// {"bench":"dev_elementwise_pass","impl":...,"ms":...,"gbs":...,"frac_copy":...}.
#include <cstdio>
#include <limits>

#include "../../bench/bench_common.h"
#include "qgrad/kernels/formulas/transformer.h"
#include "qgrad/kernels/transformer.h"

using namespace qgrad;
using namespace qgrad::bench;

namespace {

constexpr std::int64_t kRows = 8192, kCols = 1024;

__device__ __forceinline__ float4 gelu_bw4(float4 g, float4 x) {
  return make_float4(formulas::gelu_erf_backward(g.x, x.x), formulas::gelu_erf_backward(g.y, x.y),
                     formulas::gelu_erf_backward(g.z, x.z), formulas::gelu_erf_backward(g.w, x.w));
}

// n4 float4 units; K units a thread per step (unit t and t + total / K ...).
template <int K, bool kStride>
__global__ void gelu_bw_kernel(const float4* __restrict__ dy, const float4* __restrict__ x, float4* __restrict__ dx,
                               std::int64_t n4) {
  const std::int64_t threads = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  const std::int64_t span = kStride ? threads * K : n4;  // units a sweep of the grid covers
  for (std::int64_t base = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; base < n4;
       base += kStride ? span : n4) {
    float4 g[K], v[K];
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const std::int64_t i = base + k * threads;
      if (i < n4) {
        g[k] = dy[i];
        v[k] = x[i];
      }
    }
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const std::int64_t i = base + k * threads;
      if (i < n4) dx[i] = gelu_bw4(g[k], v[k]);
    }
  }
}

// cat of two [rows, cols] into [rows, 2 cols], in float4 units: index i of
// the output, its operand by column.
template <bool kStride>
__global__ void cat_kernel(const float4* __restrict__ a, const float4* __restrict__ b, float4* __restrict__ y,
                           std::int64_t rows, int half) {
  const std::int64_t n = rows * 2 * half;
  const std::int64_t threads = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += kStride ? threads : n) {
    const auto u = static_cast<std::uint32_t>(i);
    const std::uint32_t o = u / (2 * half), c = u % (2 * half);
    y[i] = c < static_cast<std::uint32_t>(half) ? a[o * half + c] : b[o * half + c - half];
  }
}

// One operand's rows into its columns of y (the library's form before).
__global__ void put_kernel(const float4* __restrict__ part, float4* __restrict__ y, std::int64_t rows, int half,
                           int first) {
  const std::int64_t n = rows * half;
  const std::int64_t threads = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += threads) {
    const auto u = static_cast<std::uint32_t>(i);
    const std::uint32_t o = u / half, c = u % half;
    y[o * 2 * half + first + c] = part[i];
  }
}

void row(const char* impl, const Timing& t, double bytes, double copy_gbs) {
  memory_row("dev_elementwise_pass", nullptr, impl, t, bytes, copy_gbs);
}

template <class Kernel>
unsigned grid_of(Kernel kernel, int threads, std::int64_t units_per_pass, bool stride) {
  if (!stride) return static_cast<unsigned>((units_per_pass + threads - 1) / threads);
  int per_sm = 0, sms = 0;
  QGRAD_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0));
  QGRAD_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  return static_cast<unsigned>(per_sm * sms * 4);
}

// Runs `launch` once on a poisoned output, compares with `want`, then times it.
template <class Launch>
bool variant(const char* impl, Launch launch, const Tensor& out, const Tensor& want, double bytes, double copy_gbs) {
  QGRAD_CUDA_CHECK(cudaMemsetAsync(out.data_ptr(), 0xff, out.nbytes(), qgrad::cuda::stream(0)));
  launch(0);
  const bool ok = same_bytes(out, want);
  std::printf("check %s: %s\n", impl, ok ? "same bytes as the library" : "DIFFERS");
  row(impl, time_cuda(launch), bytes, copy_gbs);
  return ok;
}

template <int K, bool kStride>
bool gelu_variant(const char* impl, int threads, const Tensor& dy, const Tensor& x, const Tensor& dx,
                  const Tensor& want, double copy_gbs) {
  const std::int64_t n4 = x.numel() / 4;
  const unsigned g = grid_of(gelu_bw_kernel<K, kStride>, threads, (n4 + K - 1) / K, kStride);
  cudaStream_t s = qgrad::cuda::stream(0);
  auto launch = [&](int) {
    gelu_bw_kernel<K, kStride><<<g, threads, 0, s>>>(static_cast<const float4*>(dy.data_ptr()),
                                                     static_cast<const float4*>(x.data_ptr()),
                                                     static_cast<float4*>(dx.data_ptr()), n4);
  };
  return variant(impl, launch, dx, want, 3.0 * static_cast<double>(x.nbytes()), copy_gbs);
}

}  // namespace

int main() {
  if (!cuda_available()) {
    std::printf("dev_elementwise_pass: no CUDA device present; nothing measured\n");
    return 0;
  }
  NoGradGuard ng;
  Generator gen(0x9e1);
  const TensorOptions on = TensorOptions{}.with_device(Device::cuda());
  Tensor xh = randn({kRows, kCols}, gen, TensorOptions{}, 0.0, 3.0);
  {
    float* p = static_cast<float*>(xh.data_ptr());
    p[3] = std::numeric_limits<float>::quiet_NaN();
    p[4] = std::numeric_limits<float>::infinity();
    p[5] = -std::numeric_limits<float>::infinity();
    p[6] = -0.0f;
    p[7] = 40.0f;
  }
  const Tensor x = xh.to(Device::cuda()), dy = randn({kRows, kCols}, gen, on);
  const double copy_gbs = copy_bandwidth_gbs(static_cast<std::size_t>(x.nbytes()));
  bool ok = true;

  const Tensor want = empty_like(x), dx = empty_like(x);
  kernels::gelu_backward(dy, x, want, false);
  row("gelu_bw_lib", time_cuda([&](int) { kernels::gelu_backward(dy, x, want, false); }),
      3.0 * static_cast<double>(x.nbytes()), copy_gbs);
  ok &= gelu_variant<1, true>("gelu_bw_stride256_v1", 256, dy, x, dx, want, copy_gbs);
  ok &= gelu_variant<1, false>("gelu_bw_pass256_v1", 256, dy, x, dx, want, copy_gbs);
  ok &= gelu_variant<1, false>("gelu_bw_pass128_v1", 128, dy, x, dx, want, copy_gbs);
  ok &= gelu_variant<2, false>("gelu_bw_pass256_v2", 256, dy, x, dx, want, copy_gbs);
  ok &= gelu_variant<2, false>("gelu_bw_pass128_v2", 128, dy, x, dx, want, copy_gbs);
  ok &= gelu_variant<2, true>("gelu_bw_stride256_v2", 256, dy, x, dx, want, copy_gbs);

  const Tensor b = randn({kRows, kCols}, gen, on);
  const Tensor y_lib = cat({x, b}, 1), y = empty_like(y_lib);
  const double cat_bytes = 2.0 * static_cast<double>(y_lib.nbytes());
  row("cat_lib", time_cuda([&](int) { cat({x, b}, 1); }), cat_bytes, copy_gbs);
  const int half = static_cast<int>(kCols / 4);
  const auto* ap = static_cast<const float4*>(x.data_ptr());
  const auto* bp = static_cast<const float4*>(b.data_ptr());
  auto* yp = static_cast<float4*>(y.data_ptr());
  cudaStream_t s = qgrad::cuda::stream(0);
  {
    const unsigned g = grid_of(put_kernel, 256, 0, true);
    ok &= variant(
        "cat_two_stride256",
        [&](int) {
          put_kernel<<<g, 256, 0, s>>>(ap, yp, kRows, half, 0);
          put_kernel<<<g, 256, 0, s>>>(bp, yp, kRows, half, half);
        },
        y, y_lib, cat_bytes, copy_gbs);
  }
  for (const int threads : {256, 128}) {
    const unsigned gp = grid_of(cat_kernel<false>, threads, kRows * 2 * half, false);
    const unsigned gs = grid_of(cat_kernel<true>, threads, 0, true);
    char name[64];
    std::snprintf(name, sizeof name, "cat_one_pass%d", threads);
    ok &= variant(name, [&](int) { cat_kernel<false><<<gp, threads, 0, s>>>(ap, bp, yp, kRows, half); }, y, y_lib,
                  cat_bytes, copy_gbs);
    std::snprintf(name, sizeof name, "cat_one_stride%d", threads);
    ok &= variant(name, [&](int) { cat_kernel<true><<<gs, threads, 0, s>>>(ap, bp, yp, kRows, half); }, y, y_lib,
                  cat_bytes, copy_gbs);
  }
  std::printf("copy bandwidth %.1f GB/s; every variant %s\n", copy_gbs, ok ? "matched" : "did NOT match");
  return ok ? 0 : 1;
}
