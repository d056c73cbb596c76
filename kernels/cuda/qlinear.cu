// CUDA W8A8 linear: the int8 GEMM on the tensor cores through cuBLASLt
// (lt_gemm.cuh) into an int32 [M, ldc] buffer, then one epilogue kernel that
// reads it once and writes the output (formulas/qlinear.h). On compute
// capability 9.0, the shapes where it measured faster take the Hopper GEMM
// with the epilogue fused instead (qlinear_sm90a.cu).
//
// Why not cuBLASLt's own epilogue: its per-row alpha vector
// (CUBLASLT_POINTER_MODE_ALPHA_DEVICE_VECTOR_BETA_ZERO) covers only the
// output-channel scale sw[n]; the per-token scale sa[m] would still need a
// pass over the output, and cuBLASLt's float rounding of acc * alpha is not
// specified, so the CPU could not reproduce it bit for bit. Bytes moved by
// the epilogue: 4 M N (int32 read) + sizeof(out) M N (write) + 4 N + 4 M.
// Shapes cuBLASLt does not take (it has no algorithm, or the status is not
// success) run a SIMT dp4a fallback GEMM with the same int32 result.
//
// Decode sizes (M <= kGemvMaxM) skip the int32 buffer: one GEMV kernel
// (gemv_kernel) reads each weight byte once from HBM, accumulates on the int8
// tensor cores (mma.sync m16n8k32, the weight as A: 16 channels; the
// activation rows as B: 8 rows per n-tile) and applies the same epilogue
// formula to its exact int32 sums. cuBLASLt's int8 GEMM at M = 1 ... 128,
// N = K = 4096 ran at the speed of a bf16 GEMM reading twice the bytes (H100,
// docs/benchmarks.md): its tiles leave most SMs idle at small M.
#include <algorithm>
#include <limits>

#include "qgrad/kernels/cuda/entries.h"
#include "qgrad/kernels/cuda/launch.cuh"
#include "qgrad/kernels/cuda/lt_gemm.cuh"
#include "qgrad/kernels/cuda/qlinear_out.cuh"
#include "qgrad/kernels/qlinear.h"

namespace qgrad::kernels::cuda {

namespace {

bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }

template <class T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

// Exact int32 fallback: one thread per output, 4 int8 lanes per dp4a (K is a
// multiple of 16 and rows are 16-byte aligned).
__global__ void fallback_gemm_kernel(const std::int8_t* __restrict__ a, std::int64_t lda,
                                     const std::int8_t* __restrict__ w, std::int64_t ldw, std::int32_t* __restrict__ c,
                                     std::int64_t ldc, std::int64_t M, std::int64_t N, std::int64_t K) {
  ::qgrad::cuda::wait_for_prior_kernels();
  const std::int64_t total = M * N;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t m = i / N, n = i % N;
    const int* ar = reinterpret_cast<const int*>(a + m * lda);
    const int* wr = reinterpret_cast<const int*>(w + n * ldw);
    int acc = 0;
    for (std::int64_t k = 0; k < K / 4; ++k) acc = __dp4a(ar[k], wr[k], acc);
    c[m * ldc + n] = acc;
  }
}

// One row per blockIdx.y (grid-stride), V consecutive outputs per thread:
// a 16-byte int32 load and a V-element store when V = 4.
template <class T, int V>
__global__ void epilogue_kernel(const std::int32_t* __restrict__ c, std::int64_t ldc, std::int64_t M, std::int64_t N,
                                QLinearOut<T> ep) {
  ::qgrad::cuda::wait_for_prior_kernels();
  using CP = Pack<std::int32_t, V>;
  using OP = Pack<T, V>;
  const std::int64_t nvec = N / V;
  for (std::int64_t m = blockIdx.y; m < M; m += gridDim.y) {
    const auto row = ep.row(m);
    const CP* cr = reinterpret_cast<const CP*>(c + m * ldc);
    OP* orow = reinterpret_cast<OP*>(ep.out + m * N);
    for (std::int64_t v = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; v < nvec;
         v += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
      const CP acc = cr[v];
      OP out;
#pragma unroll
      for (int e = 0; e < V; ++e) out.v[e] = ep.at(row, acc.v[e], v * V + e);
      orow[v] = out;
    }
  }
}

// ------------------------------------------------- decode-sized GEMV

constexpr std::int64_t kGemvMaxM = 16;
constexpr int kGemvWarps = 8;   // split K; two blocks per SM
constexpr int kGemvUnroll = 4;  // iterations whose loads a warp issues at once

// d += a (16 x 32, row) * b (32 x 8, col), s8 in, s32 accumulate (exact).
__device__ __forceinline__ void mma_s8(int (&d)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0,
                                       unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// A block owns 16 output channels (one m16 tile) and all M <= 8 NT rows (NT
// n-tiles); its warps split K by 64-column iterations (warp w takes w, w +
// kGemvWarps, ...). Lane (g = lane / 4, t = lane % 4) loads 16 bytes at
// k = 64 it + 16 t of channels g and g + 8 and of rows g (+ 8 j) of a: words
// 0-1 feed one mma, words 2-3 the next. The mma's k slots map to the same
// columns in A and B (a dot product allows any order). int32 sums are exact,
// so the warps' partial tiles may be added in any order: the result is the
// cuBLASLt path's bit for bit. Rows and channels past the end are clamped in
// range and their outputs not written. K (the row stride of a and w) is a
// multiple of 16 and rows are 16-byte aligned.
template <class T, int NT>
__global__ void __launch_bounds__(kGemvWarps * 32, 2)
    gemv_kernel(const std::int8_t* __restrict__ a, const std::int8_t* __restrict__ w, int M, int N, int K,
                QLinearOut<T> ep) {
  ::qgrad::cuda::wait_for_prior_kernels();
  __shared__ int part[kGemvWarps][NT][4][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int n0 = blockIdx.x * 16;
  const std::int8_t* w_lo = w + static_cast<std::int64_t>(min(n0 + g, N - 1)) * K + t * 16;
  const std::int8_t* w_hi = w + static_cast<std::int64_t>(min(n0 + 8 + g, N - 1)) * K + t * 16;
  const std::int8_t* ar[NT];
#pragma unroll
  for (int j = 0; j < NT; ++j) ar[j] = a + static_cast<std::int64_t>(min(g + 8 * j, M - 1)) * K + t * 16;
  int acc[NT][4] = {};
  const int iters = (K + 63) / 64;
  const uint4 zero4 = make_uint4(0, 0, 0, 0);
  for (int base = warp; base < iters; base += kGemvUnroll * kGemvWarps) {
    uint4 wv[kGemvUnroll][2], av[kGemvUnroll][NT];
#pragma unroll
    for (int u = 0; u < kGemvUnroll; ++u) {
      const std::int64_t k = static_cast<std::int64_t>(base + u * kGemvWarps) * 64;
      const bool kin = k + t * 16 < K;  // K % 16 == 0: a lane's 16 columns are all in or all out
      wv[u][0] = kin ? ld_stream16(w_lo + k) : zero4;
      wv[u][1] = kin ? ld_stream16(w_hi + k) : zero4;
#pragma unroll
      for (int j = 0; j < NT; ++j) av[u][j] = kin ? __ldg(reinterpret_cast<const uint4*>(ar[j] + k)) : zero4;
    }
#pragma unroll
    for (int u = 0; u < kGemvUnroll; ++u) {
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        mma_s8(acc[j], wv[u][0].x, wv[u][1].x, wv[u][0].y, wv[u][1].y, av[u][j].x, av[u][j].y);
        mma_s8(acc[j], wv[u][0].z, wv[u][1].z, wv[u][0].w, wv[u][1].w, av[u][j].z, av[u][j].w);
      }
    }
  }
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int r = 0; r < 4; ++r) part[warp][j][r][lane] = acc[j][r];
  __syncthreads();
  // C's element r of lane (g, t) in n-tile j: channel g + 8 (r >> 1), row 8 j + 2 t + (r & 1).
  for (int o = threadIdx.x; o < NT * 4 * 32; o += kGemvWarps * 32) {
    const int j = o >> 7, r = (o >> 5) & 3, ln = o & 31;
    const int m = 8 * j + 2 * (ln & 3) + (r & 1), n = n0 + (ln >> 2) + (r >> 1) * 8;
    if (m >= M || n >= N) continue;
    int sum = 0;
#pragma unroll
    for (int wq = 0; wq < kGemvWarps; ++wq) sum += part[wq][j][r][ln];
    ep.out[static_cast<std::int64_t>(m) * N + n] = ep.at(ep.row(m), sum, n);
  }
}

template <class T>
void gemv_impl(const Tensor& a, std::int64_t ld, const Tensor& w, const QLinearEpilogue& ep, const Tensor& out) {
  const std::int64_t M = out.shape()[0], N = out.shape()[1];
  const auto* ap = static_cast<const std::int8_t*>(a.data_ptr());
  const auto* wp = static_cast<const std::int8_t*>(w.data_ptr());
  const auto blocks = static_cast<unsigned>((N + 15) / 16);
  const int d = out.device().index;
  const auto m = static_cast<int>(M), n = static_cast<int>(N), k = static_cast<int>(ld);
  if (M <= 8)
    ::qgrad::cuda::launch_kernel(d, gemv_kernel<T, 1>, blocks, kGemvWarps * 32, 0, ap, wp, m, n, k,
                                 qlinear_out<T>(ep, out));
  else
    ::qgrad::cuda::launch_kernel(d, gemv_kernel<T, 2>, blocks, kGemvWarps * 32, 0, ap, wp, m, n, k,
                                 qlinear_out<T>(ep, out));
}

template <class T>
void epilogue_impl(const Tensor& c, std::int64_t ldc, const QLinearEpilogue& ep, const Tensor& out) {
  const std::int64_t M = out.shape()[0], N = out.shape()[1];
  const QLinearOut<T> o = qlinear_out<T>(ep, out);
  const std::int32_t* cp = static_cast<const std::int32_t*>(c.data_ptr());
  const bool vec = N % 4 == 0 && (reinterpret_cast<std::uintptr_t>(o.out) % (4 * sizeof(T))) == 0;
  const std::int64_t nvec = vec ? N / 4 : N;
  constexpr unsigned threads = 256;
  const unsigned gx = static_cast<unsigned>(std::min<std::int64_t>((nvec + threads - 1) / threads, 1024));
  const unsigned gy = static_cast<unsigned>(std::min<std::int64_t>(M, 65535));
  if (vec)
    ::qgrad::cuda::launch_kernel(out.device().index, epilogue_kernel<T, 4>, dim3(gx, gy), threads, 0, cp, ldc, M, N,
                                 o);
  else
    ::qgrad::cuda::launch_kernel(out.device().index, epilogue_kernel<T, 1>, dim3(gx, gy), threads, 0, cp, ldc, M, N,
                                 o);
}

}  // namespace

void int8_gemm(int device, const std::int8_t* a, std::int64_t lda, const std::int8_t* w, std::int64_t ldw,
               std::int32_t* c, std::int64_t ldc, std::int64_t M, std::int64_t N, std::int64_t K) {
  if (M <= 0 || N <= 0) return;
  Tensor ws = Tensor::empty({static_cast<std::int64_t>(kLtWorkspaceBytes)},
                            TensorOptions{}.with_device(Device::cuda(device)).with_dtype(DType::u8));
  if (!lt_int8_gemm(device, a, lda, w, ldw, c, ldc, M, N, K, ws.data_ptr(), kLtWorkspaceBytes)) {
    constexpr unsigned threads = 256;
    ::qgrad::cuda::launch_kernel(device, fallback_gemm_kernel, ::qgrad::cuda::blocks_for(M * N, threads), threads, 0, a,
                                 lda, w, ldw, c, ldc, M, N, K);
  }
}

void qlinear(const Tensor& a, std::int64_t lda, std::int64_t K, const Tensor& w, const QLinearEpilogue& ep,
             const Tensor& out) {
  const Device dev = out.device();
  const int d = dev.index;
  const std::int64_t M = out.shape()[0], N = out.shape()[1];
  const TensorOptions on = TensorOptions{}.with_device(dev);
  // Weight rows padded to lda (a multiple of 16) and 16-byte aligned.
  Tensor wpad = w;
  std::int64_t ldw = K;
  const bool padded = K != lda || !aligned16(w.data_ptr());  // then the copy kernel writes wpad just before
  if (padded) {
    wpad = Tensor::empty({N, lda}, TensorOptions(on).with_dtype(DType::s8));
    const std::int8_t* src = static_cast<const std::int8_t*>(w.data_ptr());
    std::int8_t* dst = static_cast<std::int8_t*>(wpad.data_ptr());
    launch_elementwise(d, N * lda, [=] __device__(std::int64_t i) {
      const std::int64_t n = i / lda, k = i % lda;
      dst[i] = k < K ? src[n * K + k] : std::int8_t(0);
    });
    ldw = lda;
  }
  if (M <= kGemvMaxM && N <= std::numeric_limits<int>::max() / 2 && lda <= std::numeric_limits<int>::max() &&
      aligned16(a.data_ptr())) {
    dispatch_floating(out.dtype(), "quantized_linear",
                      [&](auto tag) { gemv_impl<typename decltype(tag)::type>(a, lda, wpad, ep, out); });
    return;
  }
#ifdef QGRAD_HAVE_SM90A
  bool fused = false;
  dispatch_floating(out.dtype(), "quantized_linear", [&](auto tag) {
    using T = typename decltype(tag)::type;
    fused = qlinear_sm90a<T>(d, static_cast<const std::int8_t*>(a.data_ptr()), lda,
                             static_cast<const std::int8_t*>(wpad.data_ptr()), ldw, M, N, K, qlinear_out<T>(ep, out),
                             ep.w_untouched_by_prior_kernel && !padded);
  });
  if (fused) return;
#endif
  const std::int64_t ldc = (N + 3) / 4 * 4;  // 16-byte rows: the epilogue's int4 loads
  Tensor c = Tensor::empty({M, ldc}, TensorOptions(on).with_dtype(DType::s32));
  int8_gemm(d, static_cast<const std::int8_t*>(a.data_ptr()), lda, static_cast<const std::int8_t*>(wpad.data_ptr()),
            ldw, static_cast<std::int32_t*>(c.data_ptr()), ldc, M, N, lda);
  dispatch_floating(out.dtype(), "quantized_linear",
                    [&](auto tag) { epilogue_impl<typename decltype(tag)::type>(c, ldc, ep, out); });
}

}  // namespace qgrad::kernels::cuda
