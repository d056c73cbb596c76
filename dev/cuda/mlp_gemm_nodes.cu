// The MLP QAT step's f32 GEMMs as graph nodes (issue #16 item 2: the b256
// step is bound by its node count, and cuBLAS's split-K pairs are 7 of its
// 41 kernel nodes). For each GEMM of the 784-H-H-10 step (M rows):
//   fw  y  = x · wᵀ     [M, N] over K
//   dx  dx = dy · w     [M, K] over N (the layers after the first)
//   dw  dw = dyᵀ · x    [N, K] over M
// it captures one call of the library's cublasGemmStridedBatchedEx (default
// algorithm, beta 0: kernels/cuda/linalg.cu) and of each cuBLASLt algorithm
// the heuristic offers (4 MiB of workspace, every reduction scheme), and
// prints, for each, the nodes one call adds to a graph (kernels and memsets),
// its split-K count and reduction scheme, the µs a call (50 calls captured,
// median of 21 replays), whether two runs give the same bytes
// (deterministic), and the result against the library's (same bits, or the
// max relative difference). The question: a one-node algorithm as fast as the
// library's pair, at the same bits or inside the linear's tolerance.
// Run by hand on the GPU machine:  build-gpu/dev/dev_mlp_gemm_nodes [M H]
//
// H200, 2026-11-28 (docs/benchmarks.md, thirty-sixth session): at M = 256 the
// library's call is 4 graph nodes for 7 of the 8 GEMMs (the split-K pair and
// its memsets), 53.3 us for all 8; a one-node split-K-free algorithm is
// within ~0.5 us of it at fw2, dx2, fw3, faster at dx3 (2.36 against 5.24),
// slower at fw1 (15.5 against 10.6) and dw3 (6.4 against 4.9). With 4 MiB of
// workspace the heuristic's first algorithm is often a split-K one with
// in-place reduction (3 nodes): 20.3 us at fw1. At M = 4096 the library's
// choices are the fastest offered.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "graph_timing.cuh"
#include "lt_dev.cuh"

namespace {

constexpr std::size_t kWorkspace = std::size_t(4) << 20;
constexpr int kMaxAlgos = 24;

// "same" or the max |a - b| / (|b| + 1e-3).
void compare(const char* what, const std::vector<float>& a, const std::vector<float>& b) {
  if (std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0) {
    std::printf(",\"%s\":\"same bits\"", what);
    return;
  }
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    worst = std::fmax(worst, std::fabs(double(a[i]) - b[i]) / (std::fabs(double(b[i])) + 1e-3));
  std::printf(",\"%s\":%.3g", what, worst);
}

// Column-major D (rows x cols) = op(A) · op(B) over k: what cublasGemmEx is
// given for a row-major GEMM (kernels/cuda/linalg.cu).
struct Gemm {
  const char* name;
  cublasOperation_t ta, tb;
  int rows, cols, k, lda, ldb, ldd;
  const float *A, *B;
  float* D;
};

void run_gemm(cublasHandle_t hb, cublasLtHandle_t h, void* ws, const Gemm& g, int M, int H) {
  const std::size_t count = std::size_t(g.rows) * g.cols;
  const float alpha = 1.f, beta = 0.f;
  auto library = [&](cudaStream_t s) {
    DEV_CHECK_BLAS(cublasSetStream(hb, s));
    DEV_CHECK_BLAS(cublasGemmEx(hb, g.ta, g.tb, g.rows, g.cols, g.k, &alpha, g.A, CUDA_R_32F, g.lda, g.B, CUDA_R_32F,
                                g.ldb, &beta, g.D, CUDA_R_32F, g.ldd, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  };
  DEV_CHECK_CUDA(cudaMemset(g.D, 0xff, count * sizeof(float)));
  library(nullptr);
  DEV_CHECK_CUDA(cudaDeviceSynchronize());
  const std::vector<float> ref = to_host(g.D, count);
  std::printf("{\"M\":%d,\"H\":%d,\"gemm\":\"%s\",\"rows\":%d,\"cols\":%d,\"k\":%d,\"impl\":\"library\",\"nodes\":%zu,"
              "\"us\":%.2f}\n",
              M, H, g.name, g.rows, g.cols, g.k, nodes_of(library), graph_us(library));

  cublasLtMatmulDesc_t desc;
  DEV_CHECK_BLAS(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  DEV_CHECK_BLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &g.ta, sizeof g.ta));
  DEV_CHECK_BLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &g.tb, sizeof g.tb));
  cublasLtMatrixLayout_t la, lb, ld;
  const int ar = g.ta == CUBLAS_OP_N ? g.rows : g.k, ac = g.ta == CUBLAS_OP_N ? g.k : g.rows;
  const int br = g.tb == CUBLAS_OP_N ? g.k : g.cols, bc = g.tb == CUBLAS_OP_N ? g.cols : g.k;
  DEV_CHECK_BLAS(cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, ar, ac, g.lda));
  DEV_CHECK_BLAS(cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, br, bc, g.ldb));
  DEV_CHECK_BLAS(cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, g.rows, g.cols, g.ldd));
  cublasLtMatmulPreference_t pref;
  DEV_CHECK_BLAS(cublasLtMatmulPreferenceCreate(&pref));
  DEV_CHECK_BLAS(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &kWorkspace, sizeof kWorkspace));
  cublasLtMatmulHeuristicResult_t res[kMaxAlgos];
  int n = 0;
  if (cublasLtMatmulAlgoGetHeuristic(h, desc, la, lb, ld, ld, pref, kMaxAlgos, res, &n) != CUBLAS_STATUS_SUCCESS) n = 0;
  for (int i = 0; i < n; ++i) {
    const cublasLtMatmulAlgo_t* algo = &res[i].algo;
    auto call = [&](cudaStream_t s) {
      DEV_CHECK_BLAS(cublasLtMatmul(h, desc, &alpha, g.A, la, g.B, lb, &beta, g.D, ld, g.D, ld, algo, ws, kWorkspace, s));
    };
    DEV_CHECK_CUDA(cudaMemset(g.D, 0xff, count * sizeof(float)));
    call(nullptr);
    DEV_CHECK_CUDA(cudaDeviceSynchronize());
    const std::vector<float> first = to_host(g.D, count);
    DEV_CHECK_CUDA(cudaMemset(g.D, 0xff, count * sizeof(float)));
    call(nullptr);
    DEV_CHECK_CUDA(cudaDeviceSynchronize());
    const std::vector<float> second = to_host(g.D, count);
    std::printf("{\"M\":%d,\"H\":%d,\"gemm\":\"%s\",\"impl\":\"lt\",\"algo\":%d,\"id\":%d,\"tile\":%d,\"splitk\":%d,"
                "\"red\":%d,\"ws\":%zu,\"nodes\":%zu,\"us\":%.2f,\"deterministic\":%s",
                M, H, g.name, i, config(*algo, CUBLASLT_ALGO_CONFIG_ID), config(*algo, CUBLASLT_ALGO_CONFIG_TILE_ID),
                config(*algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM), config(*algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME),
                res[i].workspaceSize, nodes_of(call), graph_us(call),
                std::memcmp(first.data(), second.data(), count * sizeof(float)) == 0 ? "true" : "false");
    compare("vs_library", first, ref);
    std::printf("}\n");
  }
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(ld);
  cublasLtMatmulDescDestroy(desc);
}

// The step's GEMMs at M rows and hidden width H (784-H-H-10).
void run_step(cublasHandle_t hb, cublasLtHandle_t h, void* ws, int M, int H) {
  const int widths[] = {784, H, H, 10};
  for (int layer = 0; layer < 3; ++layer) {
    const int K = widths[layer], N = widths[layer + 1];
    float* x = dev_random(std::size_t(M) * K, 1 + layer);
    float* w = dev_random(std::size_t(N) * K, 11 + layer, 0.1f);
    float* dy = dev_random(std::size_t(M) * N, 21 + layer);
    float *y, *dx, *dw;
    DEV_CHECK_CUDA(cudaMalloc(&y, sizeof(float) * M * N));
    DEV_CHECK_CUDA(cudaMalloc(&dx, sizeof(float) * M * K));
    DEV_CHECK_CUDA(cudaMalloc(&dw, sizeof(float) * N * K));
    char fw[32], bx[32], bw[32];
    std::snprintf(fw, sizeof fw, "fw%d", layer + 1);
    std::snprintf(bx, sizeof bx, "dx%d", layer + 1);
    std::snprintf(bw, sizeof bw, "dw%d", layer + 1);
    // y^T (N x M) = op_T(w: K x N) · x^T (K x M)
    run_gemm(hb, h, ws, {fw, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, K, K, N, w, x, y}, M, H);
    // dx^T (K x M) = w^T (K x N) · dy^T (N x M)
    if (layer > 0) run_gemm(hb, h, ws, {bx, CUBLAS_OP_N, CUBLAS_OP_N, K, M, N, K, N, K, w, dy, dx}, M, H);
    // dw^T (K x N) = x^T (K x M) · op_T(dy^T: N x M)
    run_gemm(hb, h, ws, {bw, CUBLAS_OP_N, CUBLAS_OP_T, K, N, M, K, N, K, x, dy, dw}, M, H);
    for (float* p : {x, w, dy, y, dx, dw}) cudaFree(p);
  }
}

}  // namespace

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("{\"bench\":\"mlp_gemm_nodes\",\"skipped\":\"no CUDA device\"}\n");
    return 0;
  }
  cublasHandle_t hb;
  DEV_CHECK_BLAS(cublasCreate(&hb));
  cublasLtHandle_t h;
  DEV_CHECK_BLAS(cublasLtCreate(&h));
  void* ws = nullptr;
  DEV_CHECK_CUDA(cudaMalloc(&ws, kWorkspace));
  if (argc > 2) {
    run_step(hb, h, ws, std::atoi(argv[1]), std::atoi(argv[2]));
  } else {
    run_step(hb, h, ws, 256, 256);
    run_step(hb, h, ws, 4096, 1024);
  }
  cudaFree(ws);
  cublasLtDestroy(h);
  cublasDestroy(hb);
  return 0;
}
