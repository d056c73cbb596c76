// The f32 GEMMs of a linear layer at the ViT step's shapes (issue #13 item 5:
// the step's f32 GEMMs are 48% of its kernel time and the in_proj forward runs
// at half the rate of fc1's). For each (N, K) linear over M rows:
//   fw  y = x · wᵀ + b      cuBLASLt, BIAS epilogue (the library's forward);
//   dx  dx = dy · w         cublasGemmEx default (the library's) and every
//                           cuBLASLt algorithm;
//   dw  dw = dyᵀ · x        cublasGemmEx default (the library's; its bias
//                           gradient is a separate column sum), every cuBLASLt
//                           algorithm without and with the BGRADB epilogue (the
//                           bias gradient, db = Σ_rows dy, inside the GEMM), and
//                           a split over S row slices as one strided-batched
//                           GEMM plus an own in-order sum of the S partials.
// Every variant's result is compared with the library path's (max relative
// difference; "same bits" where equal) and the bias gradient with an f64 host
// sum. Times: median of 7 rounds of 20 back-to-back calls (CUDA events).
// Run by hand on the GPU machine:  build-gpu/dev/dev_f32_linear_gemms [M]
//
// H200, M = 12544 (session 17, call 1; docs/benchmarks.md): no variant beats
// the library's paths by enough to take. Every split-K-free algorithm gives
// the library's bits (each output one FMA chain over K); the in_proj forward
// (N = 384, K = 128) runs at 0.0463 ms on the heuristic's first algorithm and
// 0.0388 on its third (a different tile), the other forwards' first is the
// fastest. dx: the library's cublasGemmEx equals cuBLASLt's best. dw: the
// library's split-K GEMM is the fastest; BGRADB costs 10-12 us more a GEMM
// (the separate column sum it would replace: 9-15 us in the step); the own
// split over S slices is at best level with it (S = 32).
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "qgrad/core/cuda/common.cuh"
#include "qgrad/kernels/cuda/blas.cuh"

#include "graph_timing.cuh"
#include "lt_dev.cuh"

namespace {

constexpr std::size_t kWorkspace = std::size_t(32) << 20;

// Median per-call ms of 7 rounds of 20 back-to-back calls.
template <class F>
double time_ms(F&& call) {
  for (int i = 0; i < 5; ++i) call();
  cudaEvent_t e0, e1;
  QGRAD_CUDA_CHECK(cudaEventCreate(&e0));
  QGRAD_CUDA_CHECK(cudaEventCreate(&e1));
  std::vector<float> ms;
  for (int r = 0; r < 7; ++r) {
    QGRAD_CUDA_CHECK(cudaEventRecord(e0));
    for (int i = 0; i < 20; ++i) call();
    QGRAD_CUDA_CHECK(cudaEventRecord(e1));
    QGRAD_CUDA_CHECK(cudaEventSynchronize(e1));
    float t = 0;
    QGRAD_CUDA_CHECK(cudaEventElapsedTime(&t, e0, e1));
    ms.push_back(t / 20);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  std::sort(ms.begin(), ms.end());
  return ms[3];
}

// "same bits" or the largest |a - b| / (|b| + 1e-3).
void compare(const char* tag, const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  bool same = true;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) same = false;
    worst = std::max(worst, std::fabs(double(a[i]) - b[i]) / (std::fabs(double(b[i])) + 1e-3));
  }
  if (same) std::printf("%s same bits", tag);
  else std::printf("%s max rel diff %.2e%s", tag, worst, worst > 1e-4 ? " WRONG" : "");
}

// out[j] = Σ_s parts[s][j], s in order (float4 lanes).
__global__ void sum_slices_kernel(const float4* parts, float4* out, int slices, long n4) {
  const long i = blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x;
  if (i >= n4) return;
  float4 acc = parts[i];
  for (int s = 1; s < slices; ++s) {
    const float4 v = parts[s * n4 + i];
    acc.x += v.x;
    acc.y += v.y;
    acc.z += v.z;
    acc.w += v.w;
  }
  out[i] = acc;
}

struct Lt {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
};

// Column-major D (rows x cols) = op(A) · op(B) over k, f32 compute.
void lt_setup(Lt& lt, cublasOperation_t ta, cublasOperation_t tb, int rows, int cols, int k, int lda, int ldb,
              int ldd, cublasLtEpilogue_t epi, const float* bias_ptr) {
  QGRAD_CUBLAS_CHECK(cublasLtMatmulDescCreate(&lt.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  QGRAD_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(lt.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  QGRAD_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(lt.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  QGRAD_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(lt.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
  if (bias_ptr) {
    const std::int32_t bt = CUDA_R_32F;
    QGRAD_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(lt.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt));
    QGRAD_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(lt.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_ptr, sizeof bias_ptr));
  }
  const int ar = ta == CUBLAS_OP_N ? rows : k, ac = ta == CUBLAS_OP_N ? k : rows;
  const int br = tb == CUBLAS_OP_N ? k : cols, bc = tb == CUBLAS_OP_N ? cols : k;
  QGRAD_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lt.a, CUDA_R_32F, ar, ac, lda));
  QGRAD_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lt.b, CUDA_R_32F, br, bc, ldb));
  QGRAD_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lt.d, CUDA_R_32F, rows, cols, ldd));
}

struct Algos {
  cublasLtMatmulHeuristicResult_t r[32];
  int count = 0;
  bool empty() const { return count == 0; }
  std::size_t size() const { return static_cast<std::size_t>(count); }
  const cublasLtMatmulHeuristicResult_t& operator[](std::size_t i) const { return r[i]; }
};

Algos lt_algos(cublasLtHandle_t h, const Lt& lt, std::uint32_t schemes) {
  cublasLtMatmulPreference_t pref;
  QGRAD_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  QGRAD_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &kWorkspace,
                                                          sizeof kWorkspace));
  QGRAD_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes, sizeof schemes));
  Algos res;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(h, lt.desc, lt.a, lt.b, lt.d, lt.d, pref, 32, res.r,
                                                           &res.count);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS) res.count = 0;
  return res;
}

void print_algo(int i, const cublasLtMatmulHeuristicResult_t& r) {
  std::printf("    #%-2d id %3d tile %3d stages %3d splitk %3d red %d ws %8zu", i,
              config(r.algo, CUBLASLT_ALGO_CONFIG_ID), config(r.algo, CUBLASLT_ALGO_CONFIG_TILE_ID),
              config(r.algo, CUBLASLT_ALGO_CONFIG_STAGES_ID), config(r.algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
              config(r.algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME), r.workspaceSize);
}

// Every algorithm of `lt`: its time and its result against `ref` (and the
// bias gradient against `db_ref` when db is given).
void sweep(cublasLtHandle_t h, const Lt& lt, std::uint32_t schemes, const float* A, const float* B, float* D,
           std::size_t d_count, void* ws, const std::vector<float>& ref, float* db, const std::vector<double>& db_ref) {
  const Algos algos = lt_algos(h, lt, schemes);
  std::printf("    %zu algorithms\n", algos.size());
  const float alpha = 1.f, beta = 0.f;
  for (std::size_t i = 0; i < algos.size(); ++i) {
    const cublasLtMatmulAlgo_t* algo = &algos[i].algo;
    auto call = [&] {
      return cublasLtMatmul(h, lt.desc, &alpha, A, lt.a, B, lt.b, &beta, D, lt.d, D, lt.d, algo, ws, kWorkspace,
                            nullptr);
    };
    print_algo(static_cast<int>(i), algos[i]);
    QGRAD_CUDA_CHECK(cudaMemset(D, 0xff, d_count * sizeof(float)));
    if (db) QGRAD_CUDA_CHECK(cudaMemset(db, 0xff, db_ref.size() * sizeof(float)));
    if (call() != CUBLAS_STATUS_SUCCESS) {
      std::printf(": launch failed\n");
      continue;
    }
    QGRAD_CUDA_CHECK(cudaDeviceSynchronize());
    const double ms = time_ms([&] { call(); });
    std::printf(": %.4f ms ", ms);
    compare("D", to_host(D, d_count), ref);
    if (db) {
      const auto g = to_host(db, db_ref.size());
      double worst = 0;
      for (std::size_t j = 0; j < g.size(); ++j)
        worst = std::max(worst, std::fabs(g[j] - db_ref[j]) / (std::fabs(db_ref[j]) + 1e-3));
      std::printf(", db max rel diff %.2e%s", worst, worst > 1e-4 ? " WRONG" : "");
    }
    std::printf("\n");
  }
}

void run_linear(cublasHandle_t hb, cublasLtHandle_t h, int M, int N, int K, void* ws) {
  std::printf("== linear M=%d N=%d K=%d (%.2f GFLOP a GEMM)\n", M, N, K, 2.0 * M * N * K / 1e9);
  float* x = dev_random(std::size_t(M) * K, 1, 1.f);
  float* w = dev_random(std::size_t(N) * K, 2, 0.1f);
  float* bias = dev_random(std::size_t(N), 3, 0.1f);
  float* dy = dev_random(std::size_t(M) * N, 4, 1.f);
  float *y, *dx, *dw, *db, *parts;
  QGRAD_CUDA_CHECK(cudaMalloc(&y, sizeof(float) * M * N));
  QGRAD_CUDA_CHECK(cudaMalloc(&dx, sizeof(float) * M * K));
  QGRAD_CUDA_CHECK(cudaMalloc(&dw, sizeof(float) * N * K));
  QGRAD_CUDA_CHECK(cudaMalloc(&db, sizeof(float) * N));
  QGRAD_CUDA_CHECK(cudaMalloc(&parts, sizeof(float) * N * K * 128));
  const float alpha = 1.f, beta = 0.f;
  const std::vector<double> no_db;

  // fw: D (N x M) = op_T(w: K x N) · x (K x M) + bias.
  {
    Lt lt;
    lt_setup(lt, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, K, K, N, CUBLASLT_EPILOGUE_BIAS, bias);
    const Algos first = lt_algos(h, lt, CUBLASLT_REDUCTION_SCHEME_MASK);
    if (first.empty()) {
      std::printf("  fw: no algorithm\n");
    } else {
      cublasLtMatmul(h, lt.desc, &alpha, w, lt.a, x, lt.b, &beta, y, lt.d, y, lt.d, &first[0].algo, ws, kWorkspace,
                     nullptr);
      const auto ref = to_host(y, std::size_t(M) * N);
      std::printf("  fw (library: #0)\n");
      sweep(h, lt, CUBLASLT_REDUCTION_SCHEME_MASK, w, x, y, std::size_t(M) * N, ws, ref, nullptr, no_db);
    }
  }
  // dx: D (K x M) = w (K x N) · dy (N x M).
  {
    auto lib = [&] {
      QGRAD_CUBLAS_CHECK(cublasGemmEx(hb, CUBLAS_OP_N, CUBLAS_OP_N, K, M, N, &alpha, w, CUDA_R_32F, K, dy, CUDA_R_32F,
                                      N, &beta, dx, CUDA_R_32F, K, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    };
    lib();
    const auto ref = to_host(dx, std::size_t(M) * K);
    std::printf("  dx library (cublasGemmEx default): %.4f ms\n", time_ms(lib));
    Lt lt;
    lt_setup(lt, CUBLAS_OP_N, CUBLAS_OP_N, K, M, N, K, N, K, CUBLASLT_EPILOGUE_DEFAULT, nullptr);
    sweep(h, lt, CUBLASLT_REDUCTION_SCHEME_MASK, w, dy, dx, std::size_t(M) * K, ws, ref, nullptr, no_db);
  }
  // dw: D (K x N) = x (K x M) · op_T(dy: N x M), reduction over the M rows.
  {
    std::vector<double> db_ref(static_cast<std::size_t>(N));
    {
      const auto hdy = to_host(dy, std::size_t(M) * N);
      for (int r = 0; r < M; ++r)
        for (int j = 0; j < N; ++j) db_ref[static_cast<std::size_t>(j)] += hdy[std::size_t(r) * N + j];
    }
    auto lib = [&] {
      QGRAD_CUBLAS_CHECK(cublasGemmEx(hb, CUBLAS_OP_N, CUBLAS_OP_T, K, N, M, &alpha, x, CUDA_R_32F, K, dy, CUDA_R_32F,
                                      N, &beta, dw, CUDA_R_32F, K, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    };
    lib();
    const auto ref = to_host(dw, std::size_t(N) * K);
    std::printf("  dw library (cublasGemmEx default; the bias gradient a separate pass): %.4f ms\n", time_ms(lib));
    {
      Lt lt;
      lt_setup(lt, CUBLAS_OP_N, CUBLAS_OP_T, K, N, M, K, N, K, CUBLASLT_EPILOGUE_DEFAULT, nullptr);
      std::printf("  dw cuBLASLt, no epilogue\n");
      sweep(h, lt, CUBLASLT_REDUCTION_SCHEME_MASK, x, dy, dw, std::size_t(N) * K, ws, ref, nullptr, no_db);
    }
    {
      Lt lt;
      lt_setup(lt, CUBLAS_OP_N, CUBLAS_OP_T, K, N, M, K, N, K, CUBLASLT_EPILOGUE_BGRADB, db);
      std::printf("  dw cuBLASLt, BGRADB epilogue (db in the GEMM)\n");
      sweep(h, lt, CUBLASLT_REDUCTION_SCHEME_MASK, x, dy, dw, std::size_t(N) * K, ws, ref, db, db_ref);
    }
    // Own split over S row slices: one strided-batched GEMM into S partials,
    // then their in-order sum.
    for (int S : {4, 8, 16, 28, 32, 49, 64, 98}) {
      if (M % S != 0 || S > 128) continue;
      const int rows = M / S;
      const long n4 = static_cast<long>(N) * K / 4;
      auto gemm_only = [&] {
        QGRAD_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
            hb, CUBLAS_OP_N, CUBLAS_OP_T, K, N, rows, &alpha, x, CUDA_R_32F, K, static_cast<long long>(rows) * K, dy,
            CUDA_R_32F, N, static_cast<long long>(rows) * N, &beta, parts, CUDA_R_32F, K,
            static_cast<long long>(N) * K, S, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      };
      auto call = [&] {
        gemm_only();
        sum_slices_kernel<<<static_cast<unsigned>((n4 + 255) / 256), 256>>>(reinterpret_cast<const float4*>(parts),
                                                                         reinterpret_cast<float4*>(dw), S, n4);
      };
      QGRAD_CUDA_CHECK(cudaMemset(dw, 0xff, sizeof(float) * N * K));
      call();
      QGRAD_CUDA_CHECK(cudaDeviceSynchronize());
      const double ms = time_ms(call);
      const double gms = time_ms(gemm_only);
      std::printf("  dw split into %d slices of %d rows: %.4f ms (GEMM %.4f, sum %.4f) ", S, rows, ms, gms, ms - gms);
      compare("D", to_host(dw, std::size_t(N) * K), ref);
      std::printf("\n");
    }
  }
  float* all[] = {x, w, bias, dy, y, dx, dw, db, parts};
  for (float* p : all) cudaFree(p);
}

}  // namespace

int main(int argc, char** argv) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("no CUDA device\n");
    return 0;
  }
  const int M = argc > 1 ? std::atoi(argv[1]) : 256 * 49;
  cublasHandle_t hb;
  QGRAD_CUBLAS_CHECK(cublasCreate(&hb));
  cublasLtHandle_t h;
  QGRAD_CUBLAS_CHECK(cublasLtCreate(&h));
  void* ws = nullptr;
  QGRAD_CUDA_CHECK(cudaMalloc(&ws, kWorkspace));
  // The ViT's linears (width 128, MLP 512): in_proj, out_proj, fc1, fc2.
  const int shapes[][2] = {{384, 128}, {128, 128}, {512, 128}, {128, 512}};
  for (const auto& s : shapes) run_linear(hb, h, M, s[0], s[1], ws);
  cudaFree(ws);
  cublasLtDestroy(h);
  cublasDestroy(hb);
  return 0;
}
