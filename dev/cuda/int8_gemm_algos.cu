// cuBLASLt's int8 GEMM algorithms at small M (issue #16 item 3: W8A8 at
// M = 16 ... 256, N = K = 4096 ran no faster than a bf16 GEMM reading twice
// the weight bytes). For each shape: every algorithm cuBLASLt's heuristic
// offers (up to 32, any reduction scheme, 32 MiB workspace), its tile,
// split-K and stages, its time with the weights rotated past L2, and whether
// its int32 result equals the first algorithm's (int32 sums are exact, so
// every algorithm must agree). Run by hand on the GPU machine:
//   build-gpu/dev/dev_int8_gemm_algos
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "qgrad/core/cuda/common.cuh"
#include "qgrad/kernels/cuda/blas.cuh"

#include "lt_dev.cuh"

namespace {

constexpr int kCopies = 4;  // 4 x 16 MiB of weights: past the 50 MB L2
constexpr std::size_t kWorkspace = std::size_t(32) << 20;

void run_shape(cublasLtHandle_t h, int M, int N, int K) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> d(-127, 127);
  std::vector<std::int8_t> ha(static_cast<std::size_t>(M) * K), hw(static_cast<std::size_t>(N) * K);
  for (auto& v : ha) v = static_cast<std::int8_t>(d(rng));
  for (auto& v : hw) v = static_cast<std::int8_t>(d(rng));
  std::int8_t* a = nullptr;
  std::int8_t* w[kCopies];
  std::int32_t* c = nullptr;
  void* ws = nullptr;
  QGRAD_CUDA_CHECK(cudaMalloc(&a, ha.size()));
  for (auto& p : w) {
    QGRAD_CUDA_CHECK(cudaMalloc(&p, hw.size()));
    QGRAD_CUDA_CHECK(cudaMemcpy(p, hw.data(), hw.size(), cudaMemcpyHostToDevice));
  }
  QGRAD_CUDA_CHECK(cudaMalloc(&c, sizeof(std::int32_t) * M * N));
  QGRAD_CUDA_CHECK(cudaMalloc(&ws, kWorkspace));
  QGRAD_CUDA_CHECK(cudaMemcpy(a, ha.data(), ha.size(), cudaMemcpyHostToDevice));

  cublasLtMatmulDesc_t desc;
  QGRAD_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32I, CUDA_R_32I));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  QGRAD_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  QGRAD_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  cublasLtMatrixLayout_t la, lb, lc;
  QGRAD_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, CUDA_R_8I, K, N, K));
  QGRAD_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_8I, K, M, K));
  QGRAD_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32I, N, M, N));
  cublasLtMatmulPreference_t pref;
  QGRAD_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const std::uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_MASK;
  QGRAD_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &kWorkspace,
                                                sizeof kWorkspace));
  QGRAD_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes, sizeof schemes));
  constexpr int kMax = 32;
  cublasLtMatmulHeuristicResult_t res[kMax];
  int count = 0;
  QGRAD_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(h, desc, la, lb, lc, lc, pref, kMax, res, &count));
  std::printf("M=%d N=%d K=%d: %d algorithms\n", M, N, K, count);
  const std::int32_t alpha = 1, beta = 0;
  cudaEvent_t e0, e1;
  QGRAD_CUDA_CHECK(cudaEventCreate(&e0));
  QGRAD_CUDA_CHECK(cudaEventCreate(&e1));
  std::vector<std::int32_t> out(static_cast<std::size_t>(M) * N), first(out.size());
  for (int i = 0; i < count; ++i) {
    const cublasLtMatmulAlgo_t& algo = res[i].algo;
    auto call = [&](int rep) {
      return cublasLtMatmul(h, desc, &alpha, w[rep % kCopies], la, a, lb, &beta, c, lc, c, lc, &algo, ws, kWorkspace,
                            nullptr);
    };
    QGRAD_CUDA_CHECK(cudaMemset(c, 0x7f, sizeof(std::int32_t) * M * N));
    if (call(0) != CUBLAS_STATUS_SUCCESS) {
      std::printf("  #%d: launch failed\n", i);
      continue;
    }
    QGRAD_CUDA_CHECK(cudaMemcpy(out.data(), c, sizeof(std::int32_t) * out.size(), cudaMemcpyDeviceToHost));
    if (i == 0) first = out;
    for (int r = 0; r < 10; ++r) call(r);
    constexpr int kReps = 200;
    std::vector<float> ms;
    for (int r = 0; r < kReps; ++r) {
      QGRAD_CUDA_CHECK(cudaEventRecord(e0));
      call(r);
      QGRAD_CUDA_CHECK(cudaEventRecord(e1));
      QGRAD_CUDA_CHECK(cudaEventSynchronize(e1));
      float t = 0;
      QGRAD_CUDA_CHECK(cudaEventElapsedTime(&t, e0, e1));
      ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    std::printf("  #%d id %d tile %d splitk %d reduction %d stages %d cluster %d ws %zu: %.4f ms (min %.4f)%s\n", i,
                config(algo, CUBLASLT_ALGO_CONFIG_ID), config(algo, CUBLASLT_ALGO_CONFIG_TILE_ID),
                config(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM), config(algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME),
                config(algo, CUBLASLT_ALGO_CONFIG_STAGES_ID), config(algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID),
                res[i].workspaceSize, ms[kReps / 2], ms[0], out == first ? "" : "  RESULT DIFFERS");
  }
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(lc);
  cublasLtMatmulDescDestroy(desc);
  cudaFree(a);
  for (auto* p : w) cudaFree(p);
  cudaFree(c);
  cudaFree(ws);
}

}  // namespace

int main() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("no CUDA device\n");
    return 0;
  }
  cublasLtHandle_t h;
  QGRAD_CUBLAS_CHECK(cublasLtCreate(&h));
  for (int M : {16, 32, 64, 128, 256}) run_shape(h, M, 4096, 4096);
  cublasLtDestroy(h);
  return 0;
}
