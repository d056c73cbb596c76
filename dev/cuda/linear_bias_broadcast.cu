// The f32 linear's bias at small shapes without its own launch (issue #16
// item 2: the b256 MLP step spends 3 of its 45 nodes filling bias rows).
// Below 2^27 multiply-adds the library fills y with the bias rows (one
// kernel) and accumulates the GEMM onto them (cublasGemmStridedBatchedEx,
// beta = 1): two launches, three with cuBLAS's split-K pair. cuBLASLt's
// out-of-place form D = A·B + C takes C with its own leading dimension; with
// ld(C) = 0 every column of C^T is the bias, so y = x·wᵀ + b is one
// cublasLtMatmul and no fill. For each (M, N, K) of the MLP steps:
//   library  fill kernel + cublasGemmStridedBatchedEx, beta = 1 (kernels/cuda/linalg.cu);
//   ldc0     cublasLtMatmul, C = bias with ld 0, beta = 1, each of the heuristic's
//            first algorithms;
//   epilogue cublasLtMatmul with the BIAS epilogue, beta = 0 (the library's path
//            above 2^27 multiply-adds), heuristic's first algorithm.
// Then the question the thirty-fifth session left (the epilogue path at every
// size slowed the b256 step by ~6 us a layer in the library while it beat fill
// + GEMM here): the same calls captured on the library's stream in a
// qgrad::CudaGraph (captured_timing.cuh), next to
//   epilogue_4mib  the bare heuristic call with the library's 4 MiB workspace and
//                  its operands' alignments as preferences;
//   library_plan   kernels::cuda::lt_linear_bias, the library's own plan (tuned
//                  once, outside the capture), as linear_bias_lt calls it.
// Every variant's y is compared with the library's bytes ("same bits" or the
// max relative difference). Times: 50 calls captured in a CUDA graph, median
// of 21 replays (graph_timing.cuh), µs a call.
// Run by hand on the GPU machine:  build-gpu/dev/dev_linear_bias_broadcast
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include <stdexcept>

#include "captured_timing.cuh"
#include "graph_timing.cuh"
#include "lt_dev.cuh"
#include "qgrad/kernels/cuda/lt_gemm.cuh"

namespace {

constexpr std::size_t kWorkspace = std::size_t(32) << 20;
constexpr int kAlgos = 6;

// The library's fill_rows: y[i] = bias[i % N].
__global__ void fill_rows_kernel(const float* bias, float* y, std::int64_t n, std::int64_t N) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    y[i] = bias[i % N];
}

// "same bits", or the max |a - b| / max(1, |b|).
void compare(const char* what, const std::vector<float>& a, const std::vector<float>& b) {
  if (std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0) {
    std::printf(",\"%s\":\"same bits\"", what);
    return;
  }
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    worst = std::fmax(worst, std::fabs(double(a[i]) - b[i]) / std::fmax(1.0, std::fabs(double(b[i]))));
  std::printf(",\"%s\":%.3g", what, worst);
}

struct Lt {
  cublasLtHandle_t h;
  void* ws;
};

// y [M, N] = x [M, K] · w [N, K]^T (+ bias), column-major: y^T (N x M) = op_T(w) · x^T.
// ldc0: C = bias with ld 0, beta = 1; else the BIAS epilogue, beta = 0.
// algos[0 .. count): the heuristic's first algorithms (none: unsupported).
struct LtCall {
  cublasLtMatmulDesc_t op{};
  cublasLtMatrixLayout_t a{}, b{}, c{}, d{};
  cublasLtMatmulHeuristicResult_t algos[kAlgos]{};
  int count = 0;
  bool ldc0 = true;
  std::size_t ws_bytes = kWorkspace;

  // ws_limit, align: the workspace offered and the operands' alignment preferences (0: none).
  LtCall(Lt& lt, int M, int N, int K, bool ldc0_, const float* bias, std::size_t ws_limit = kWorkspace,
         std::uint32_t align = 0)
      : ldc0(ldc0_), ws_bytes(ws_limit) {
    DEV_CHECK_BLAS(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    DEV_CHECK_BLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    DEV_CHECK_BLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    if (!ldc0) {
      const cublasLtEpilogue_t ep = CUBLASLT_EPILOGUE_BIAS;
      DEV_CHECK_BLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof ep));
      DEV_CHECK_BLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    }
    DEV_CHECK_BLAS(cublasLtMatrixLayoutCreate(&a, CUDA_R_32F, K, N, K));
    DEV_CHECK_BLAS(cublasLtMatrixLayoutCreate(&b, CUDA_R_32F, K, M, K));
    DEV_CHECK_BLAS(cublasLtMatrixLayoutCreate(&d, CUDA_R_32F, N, M, N));
    // A leading dimension of 0 may be refused here or by the heuristic: then no algorithm ("unsupported").
    if (cublasLtMatrixLayoutCreate(&c, CUDA_R_32F, N, M, ldc0 ? 0 : N) != CUBLAS_STATUS_SUCCESS) {
      c = nullptr;
      return;
    }
    cublasLtMatmulPreference_t pref;
    DEV_CHECK_BLAS(cublasLtMatmulPreferenceCreate(&pref));
    const std::size_t ws = ws_bytes;
    DEV_CHECK_BLAS(
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    if (align != 0)
      for (const auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                              CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
        DEV_CHECK_BLAS(cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof align));
    const cublasStatus_t s =
        cublasLtMatmulAlgoGetHeuristic(lt.h, op, a, b, ldc0 ? c : d, d, pref, kAlgos, algos, &count);
    if (s != CUBLAS_STATUS_SUCCESS) count = 0;
    cublasLtMatmulPreferenceDestroy(pref);
  }
  ~LtCall() {
    cublasLtMatrixLayoutDestroy(a);
    cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
    cublasLtMatrixLayoutDestroy(d);
    cublasLtMatmulDescDestroy(op);
  }
  cublasStatus_t run(Lt& lt, int i, const float* x, const float* w, const float* bias, float* y, cudaStream_t s) {
    const float one = 1.0f, beta = ldc0 ? 1.0f : 0.0f;
    return cublasLtMatmul(lt.h, op, &one, w, a, x, b, &beta, ldc0 ? bias : y, ldc0 ? c : d, y, d, &algos[i].algo,
                          lt.ws, ws_bytes, s);
  }
};

void run_shape(cublasHandle_t blas, Lt& lt, int M, int N, int K) {
  float* x = dev_random(std::size_t(M) * K, 1);
  float* w = dev_random(std::size_t(N) * K, 2);
  float* bias = dev_random(std::size_t(N), 3);
  float* y = nullptr;
  DEV_CHECK_CUDA(cudaMalloc(&y, std::size_t(M) * N * sizeof(float)));
  const std::int64_t n = std::int64_t(M) * N;
  auto library = [&](cudaStream_t s) {
    fill_rows_kernel<<<static_cast<unsigned>(std::min<std::int64_t>((n + 255) / 256, 65535)), 256, 0, s>>>(bias, y, n,
                                                                                                           N);
    const float one = 1.0f;
    DEV_CHECK_BLAS(cublasSetStream(blas, s));
    DEV_CHECK_BLAS(cublasGemmStridedBatchedEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, w, CUDA_R_32F, K,
                                              std::int64_t(N) * K, x, CUDA_R_32F, K, std::int64_t(M) * K, &one, y,
                                              CUDA_R_32F, N, std::int64_t(M) * N, 1, CUBLAS_COMPUTE_32F,
                                              CUBLAS_GEMM_DEFAULT));
  };
  cudaStream_t s0;
  DEV_CHECK_CUDA(cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking));
  library(s0);
  DEV_CHECK_CUDA(cudaStreamSynchronize(s0));
  const std::vector<float> ref = to_host(y, std::size_t(n));
  std::printf("{\"bench\":\"linear_bias_broadcast\",\"M\":%d,\"N\":%d,\"K\":%d,\"impl\":\"library\",\"us\":%.2f}\n", M,
              N, K, graph_us(library));
  for (const bool ldc0 : {true, false}) {
    LtCall call(lt, M, N, K, ldc0, bias);
    if (call.count == 0)
      std::printf("{\"bench\":\"linear_bias_broadcast\",\"M\":%d,\"N\":%d,\"K\":%d,\"impl\":\"%s\","
                  "\"unsupported\":true}\n",
                  M, N, K, ldc0 ? "ldc0" : "epilogue");
    for (int i = 0; i < (ldc0 ? call.count : std::min(call.count, 1)); ++i) {
      DEV_CHECK_CUDA(cudaMemset(y, 0xff, std::size_t(n) * sizeof(float)));  // poisoned: NaN
      if (call.run(lt, i, x, w, bias, y, s0) != CUBLAS_STATUS_SUCCESS) continue;
      DEV_CHECK_CUDA(cudaStreamSynchronize(s0));
      const double us = graph_us([&](cudaStream_t s) { DEV_CHECK_BLAS(call.run(lt, i, x, w, bias, y, s)); });
      int splitk = 0, tile = 0;
      std::size_t wr = 0;
      cublasLtMatmulAlgoConfigGetAttribute(&call.algos[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk,
                                           sizeof splitk, &wr);
      cublasLtMatmulAlgoConfigGetAttribute(&call.algos[i].algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &wr);
      std::printf("{\"bench\":\"linear_bias_broadcast\",\"M\":%d,\"N\":%d,\"K\":%d,\"impl\":\"%s\",\"algo\":%d,"
                  "\"tile\":%d,\"splitk\":%d,\"us\":%.2f",
                  M, N, K, ldc0 ? "ldc0" : "epilogue", i, tile, splitk, us);
      compare("vs_library", to_host(y, std::size_t(n)), ref);
      std::printf("}\n");
    }
  }
  // The same on the library's stream, captured in a qgrad::CudaGraph: fill + GEMM, the bare epilogue
  // (32 MiB, no alignment preferences), with the library's 4 MiB and alignments, and the library's plan.
  cudaStream_t ls = ::qgrad::cuda::stream(0);
  namespace kc = qgrad::kernels::cuda;
  LtCall bare(lt, M, N, K, false, bias);
  LtCall lib_like(lt, M, N, K, false, bias, kc::kLtLinearWorkspaceBytes, kc::lt_alignment(y));
  auto plan = [&] {
    if (!kc::lt_linear_bias(0, CUDA_R_32F, x, w, bias, y, M, N, K, lt.ws, kc::kLtLinearWorkspaceBytes, nullptr, false))
      throw std::runtime_error("lt_linear_bias refused the shape");
  };
  DEV_CHECK_CUDA(cudaMemset(y, 0xff, std::size_t(n) * sizeof(float)));
  plan();  // plans and tunes once, outside the capture
  DEV_CHECK_CUDA(cudaStreamSynchronize(ls));
  std::printf("{\"bench\":\"linear_bias_broadcast\",\"M\":%d,\"N\":%d,\"K\":%d,\"method\":\"captured\"", M, N,
              K);
  compare("library_plan_vs_library", to_host(y, std::size_t(n)), ref);
  std::printf(",\"library_us\":%.2f", captured_us([&] { library(ls); }));
  if (bare.count > 0)
    std::printf(",\"epilogue_us\":%.2f", captured_us([&] { DEV_CHECK_BLAS(bare.run(lt, 0, x, w, bias, y, ls)); }));
  if (lib_like.count > 0)
    std::printf(",\"epilogue_4mib_us\":%.2f",
                captured_us([&] { DEV_CHECK_BLAS(lib_like.run(lt, 0, x, w, bias, y, ls)); }));
  std::printf(",\"library_plan_us\":%.2f}\n", captured_us(plan));
  DEV_CHECK_CUDA(cudaStreamDestroy(s0));
  cudaFree(x);
  cudaFree(w);
  cudaFree(bias);
  cudaFree(y);
}

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("{\"bench\":\"linear_bias_broadcast\",\"skipped\":\"no CUDA device\"}\n");
    return 0;
  }
  cublasHandle_t blas;
  DEV_CHECK_BLAS(cublasCreate(&blas));
  Lt lt{};
  DEV_CHECK_BLAS(cublasLtCreate(&lt.h));
  DEV_CHECK_CUDA(cudaMalloc(&lt.ws, kWorkspace));
  // The MLP steps' three forward linears: b256 h256 and b4096 h1024 (784 inputs, 10 classes).
  const int shapes[][3] = {{256, 256, 784}, {256, 256, 256}, {256, 10, 256},
                           {4096, 1024, 784}, {4096, 1024, 1024}, {4096, 10, 1024}};
  for (const auto& s : shapes) run_shape(blas, lt, s[0], s[1], s[2]);
  cudaFree(lt.ws);
  cublasLtDestroy(lt.h);
  cublasDestroy(blas);
  return 0;
}
