#include "qgrad/kernels/cuda/lt_gemm.cuh"

#include <cublasLt.h>

#include <map>
#include <mutex>
#include <tuple>

#include "qgrad/core/cuda/common.cuh"

namespace qgrad::kernels::cuda {

namespace {

struct LtPlan {
  bool ok = false;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

using PlanKey = std::tuple<int, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t>;

std::map<int, cublasLtHandle_t> g_handles;  // per device, for the life of the process
std::map<PlanKey, LtPlan> g_plans;

LtPlan make_plan(cublasLtHandle_t h, std::int64_t lda, std::int64_t ldw, std::int64_t ldc, std::int64_t M,
                 std::int64_t N, std::int64_t K, std::size_t ws) {
  LtPlan p;
  bool ok = cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32I, CUDA_R_32I) == CUBLAS_STATUS_SUCCESS;
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  ok = ok && cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta) == CUBLAS_STATUS_SUCCESS;
  ok = ok && cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb) == CUBLAS_STATUS_SUCCESS;
  ok = ok && cublasLtMatrixLayoutCreate(&p.a, CUDA_R_8I, static_cast<std::uint64_t>(K), static_cast<std::uint64_t>(N),
                                        ldw) == CUBLAS_STATUS_SUCCESS;
  ok = ok && cublasLtMatrixLayoutCreate(&p.b, CUDA_R_8I, static_cast<std::uint64_t>(K), static_cast<std::uint64_t>(M),
                                        lda) == CUBLAS_STATUS_SUCCESS;
  ok = ok && cublasLtMatrixLayoutCreate(&p.c, CUDA_R_32I, static_cast<std::uint64_t>(N), static_cast<std::uint64_t>(M),
                                        ldc) == CUBLAS_STATUS_SUCCESS;
  cublasLtMatmulPreference_t pref = nullptr;
  ok = ok && cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS;
  ok = ok && cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws) ==
                 CUBLAS_STATUS_SUCCESS;
  cublasLtMatmulHeuristicResult_t result{};
  int count = 0;
  ok = ok && cublasLtMatmulAlgoGetHeuristic(h, p.desc, p.a, p.b, p.c, p.c, pref, 1, &result, &count) ==
                 CUBLAS_STATUS_SUCCESS;
  if (pref) cublasLtMatmulPreferenceDestroy(pref);
  p.ok = ok && count > 0;
  if (p.ok) p.algo = result.algo;
  return p;
}

}  // namespace

std::mutex& lt_mutex() {
  static std::mutex m;
  return m;
}

cublasLtHandle_t lt_handle(int device, const char* op) {
  auto it = g_handles.find(device);
  if (it != g_handles.end()) return it->second;
  cublasLtHandle_t h = nullptr;
  if (cublasLtCreate(&h) != CUBLAS_STATUS_SUCCESS) throw Error(op, "", "cublasLtCreate failed");
  g_handles[device] = h;
  return h;
}

bool lt_int8_gemm(int device, const std::int8_t* a, std::int64_t lda, const std::int8_t* w, std::int64_t ldw,
                  std::int32_t* c, std::int64_t ldc, std::int64_t M, std::int64_t N, std::int64_t K, void* workspace,
                  std::size_t workspace_bytes) {
  cudaStream_t s = ::qgrad::cuda::stream(device);
  LtPlan plan;
  cublasLtHandle_t h = nullptr;
  {
    std::lock_guard<std::mutex> lock(lt_mutex());
    h = lt_handle(device, "quantized_linear");
    const PlanKey key{device, M, N, K, lda, ldw, ldc};
    auto it = g_plans.find(key);
    if (it == g_plans.end()) it = g_plans.emplace(key, make_plan(h, lda, ldw, ldc, M, N, K, workspace_bytes)).first;
    plan = it->second;
  }
  if (!plan.ok) return false;
  const std::int32_t alpha = 1, beta = 0;
  const cublasStatus_t st = cublasLtMatmul(h, plan.desc, &alpha, w, plan.a, a, plan.b, &beta, c, plan.c, c, plan.c,
                                           &plan.algo, workspace, workspace_bytes, s);
  return st == CUBLAS_STATUS_SUCCESS;
}

}  // namespace qgrad::kernels::cuda
