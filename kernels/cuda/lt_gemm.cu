#include "qgrad/kernels/cuda/lt_gemm.cuh"

#include <cublasLt.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>
#include <vector>

#include "qgrad/core/cuda/common.cuh"
#include "qgrad/kernels/formulas/binary.h"

namespace qgrad::kernels::cuda {

namespace {

struct LtPlan {
  bool ok = false;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  // The float linear's other split-K-free algorithms (lt_linear_bias times
  // them once against `algo`); none when `algo` splits K.
  LtAlgos alternatives;
  bool tuned = false;
  // A plan with a residual (beta 1, C = the residual) is used only once its
  // tuning found the fused bytes equal to linear_add's formula computed step
  // by step, on made-up operands (lt_linear_bias).
  bool residual_verified = false;
};

using PlanKey = std::tuple<int, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t>;

std::map<int, cublasLtHandle_t> g_handles;  // per device, for the life of the process
std::map<PlanKey, LtPlan> g_plans;

bool ok(cublasStatus_t s) { return s == CUBLAS_STATUS_SUCCESS; }

bool split_k_free(const cublasLtMatmulAlgo_t& algo) {
  std::uint32_t splits = 1;
  std::size_t written = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits, sizeof splits, &written);
  return splits <= 1;
}

LtPlan make_plan(cublasLtHandle_t h, std::int64_t lda, std::int64_t ldw, std::int64_t ldc, std::int64_t M,
                 std::int64_t N, std::int64_t K, std::size_t ws) {
  LtPlan p;
  bool good = cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32I, CUDA_R_32I) == CUBLAS_STATUS_SUCCESS;
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  good = good && cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta) == CUBLAS_STATUS_SUCCESS;
  good = good && cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb) == CUBLAS_STATUS_SUCCESS;
  good = good && cublasLtMatrixLayoutCreate(&p.a, CUDA_R_8I, static_cast<std::uint64_t>(K), static_cast<std::uint64_t>(N),
                                        ldw) == CUBLAS_STATUS_SUCCESS;
  good = good && cublasLtMatrixLayoutCreate(&p.b, CUDA_R_8I, static_cast<std::uint64_t>(K), static_cast<std::uint64_t>(M),
                                        lda) == CUBLAS_STATUS_SUCCESS;
  good = good && cublasLtMatrixLayoutCreate(&p.c, CUDA_R_32I, static_cast<std::uint64_t>(N), static_cast<std::uint64_t>(M),
                                        ldc) == CUBLAS_STATUS_SUCCESS;
  // Alignment preferences left at the default (256 bytes) as before the shared helper.
  p.ok = good && lt_heuristic_algo(h, p.desc, p.a, p.b, p.c, ws, 256, 256, 256, CUBLASLT_REDUCTION_SCHEME_MASK, p.algo);
  return p;
}

// device, type, M, N, K, alignments of x, w, bias, out, residual (0: none), TF32 (f32 only).
using LinearKey = std::tuple<int, int, std::int64_t, std::int64_t, std::int64_t, unsigned, unsigned, unsigned, unsigned,
                             unsigned, bool>;
std::map<LinearKey, LtPlan> g_linear_plans;

// Layouts in cuBLASLt's column-major terms: D (N x M, ld N) = op(W) (W is
// K x N, ld K, transposed) x X^T (K x M, ld K); the bias runs along D's N rows.
LtPlan make_linear_plan(cublasLtHandle_t h, const LinearKey& key, const void* bias) {
  const auto [device, type_int, M, N, K, al_x, al_w, al_b, al_out, al_r, tf32] = key;
  // C (the residual, where there is one) and D share a layout and an alignment preference.
  const unsigned al_d = al_r == 0 ? al_out : std::min(al_out, al_r);
  (void)device;
  const auto type = static_cast<cudaDataType_t>(type_int);
  const auto u64 = [](std::int64_t v) { return static_cast<std::uint64_t>(v); };
  LtPlan p;
  bool good = ok(cublasLtMatmulDescCreate(&p.desc, tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
  const auto bias_type = static_cast<std::int32_t>(type);
  good = good && ok(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  good = good && ok(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  good = good && ok(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
  good = good && ok(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                                   sizeof bias_type));
  good = good && ok(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
  good = good && ok(cublasLtMatrixLayoutCreate(&p.a, type, u64(K), u64(N), K));
  good = good && ok(cublasLtMatrixLayoutCreate(&p.b, type, u64(K), u64(M), K));
  good = good && ok(cublasLtMatrixLayoutCreate(&p.c, type, u64(N), u64(M), N));
  // 16-bit outputs: partial sums of split-K meet in f32, never in the output type.
  const std::uint32_t schemes =
      type == CUDA_R_32F ? CUBLASLT_REDUCTION_SCHEME_MASK
                         : (CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE);
  // The bias alignment has no preference attribute; it keys the plan all the same.
  (void)al_b;
  p.ok = good && lt_heuristic_algo(h, p.desc, p.a, p.b, p.c, kLtLinearWorkspaceBytes, al_w, al_x, al_d, schemes,
                                   p.algo);
  if (p.ok && split_k_free(p.algo)) {
    const LtAlgos all = lt_heuristic_algos(h, p.desc, p.a, p.b, p.c, kLtLinearWorkspaceBytes, al_w, al_x, al_d,
                                           schemes, kLtMaxAlgos);
    for (int i = 0; i < all.count; ++i)
      if (split_k_free(all.algo[i]) && std::memcmp(&all.algo[i], &p.algo, sizeof p.algo) != 0)
        p.alternatives.algo[p.alternatives.count++] = all.algo[i];
  }
  return p;
}

// Times `run` (one GEMM on stream s): the median of 5 after 2 warm-ups, ms.
template <class Run>
float time_gemm(cudaStream_t s, Run run) {
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  QGRAD_CUDA_CHECK(cudaEventCreate(&e0));
  QGRAD_CUDA_CHECK(cudaEventCreate(&e1));
  float t[5] = {};
  bool good = run() && run();
  for (float& v : t) {
    QGRAD_CUDA_CHECK(cudaEventRecord(e0, s));
    good = good && run();
    QGRAD_CUDA_CHECK(cudaEventRecord(e1, s));
    QGRAD_CUDA_CHECK(cudaEventSynchronize(e1));
    QGRAD_CUDA_CHECK(cudaEventElapsedTime(&v, e0, e1));
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  std::sort(t, t + 5);
  return good ? t[2] : 1e30f;
}

// Device scratch freed at the end of a scope (a plan is tuned and checked once).
struct Scratch {
  void* p = nullptr;
  explicit Scratch(std::size_t bytes) {
    if (cudaMalloc(&p, bytes) != cudaSuccess) {
      cudaGetLastError();
      p = nullptr;
    }
  }
  ~Scratch() {
    if (p != nullptr) cudaFree(p);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
};

// Once per plan, outside graph capture: the heuristic's first algorithm
// against its other split-K-free ones on this call's operands, keeping the
// fastest of those whose output has the first one's bytes (each output one
// fused multiply-add chain over K in order: measured equal on the ViT's
// linears, dev/cuda/f32_linear_gemms.cu; checked here, never assumed). Why:
// the heuristic's first pick for the ViT's in_proj forward (12544 x 384 x
// 128) ran at 0.0463 ms where another tile ran 0.0388 (H200). A one-time
// synchronization per shape, as cuDNN's benchmark mode.
// With `reference` (a plan with a residual), the first algorithm's output
// must also have the reference's bytes, linear_add's formula step by step
// (written by `reference` into the scratch buffer it is given); otherwise
// the plan is left unverified and unused.
template <class Run, class Reference>
void tune_linear_plan(LtPlan& plan, cudaStream_t s, void* out, std::size_t out_bytes, Run run, Reference reference) {
  plan.tuned = true;
  constexpr bool kResidual = !std::is_same_v<Reference, std::nullptr_t>;
  if (!kResidual && plan.alternatives.count == 0) return;
  const Scratch buffer(out_bytes);
  void* scratch = buffer.p;
  if (scratch == nullptr) return;  // no room to tune: keep the heuristic's choice (unverified with a residual)
  std::vector<unsigned char> first(out_bytes), other(out_bytes);
  const cublasLtMatmulAlgo_t chosen = plan.algo;
  bool usable = run(chosen, out);
  if (usable) {
    QGRAD_CUDA_CHECK(cudaMemcpyAsync(first.data(), out, out_bytes, cudaMemcpyDeviceToHost, s));
    QGRAD_CUDA_CHECK(cudaStreamSynchronize(s));
  }
  if constexpr (kResidual) {
    usable = usable && reference(scratch);
    if (usable) {
      QGRAD_CUDA_CHECK(cudaMemcpyAsync(other.data(), scratch, out_bytes, cudaMemcpyDeviceToHost, s));
      QGRAD_CUDA_CHECK(cudaStreamSynchronize(s));
      plan.residual_verified = usable = other == first;
    }
  }
  if (usable) {
    float best = time_gemm(s, [&] { return run(chosen, scratch); });
    for (int i = 0; i < plan.alternatives.count; ++i) {
      const cublasLtMatmulAlgo_t& alt = plan.alternatives.algo[i];
      if (!run(alt, scratch)) continue;
      QGRAD_CUDA_CHECK(cudaMemcpyAsync(other.data(), scratch, out_bytes, cudaMemcpyDeviceToHost, s));
      QGRAD_CUDA_CHECK(cudaStreamSynchronize(s));
      if (other != first) continue;
      const float t = time_gemm(s, [&] { return run(alt, scratch); });
      if (t < best) best = t, plan.algo = alt;
    }
  }
  QGRAD_CUDA_CHECK(cudaStreamSynchronize(s));  // before the scratch is freed
}

// Made-up operands for a residual plan's check: a value in [-1, 1) from a
// hash of the index, never zero (the call's own bias may be all zeros, as a
// fresh layer's is, and hide the order in which the epilogue adds).
template <class T>
__global__ void made_up_kernel(T* p, std::int64_t n, std::uint32_t salt) {
  ::qgrad::cuda::wait_for_prior_kernels();
  const std::int64_t i = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i >= n) return;
  std::uint32_t h = static_cast<std::uint32_t>(i) * 2654435761u ^ salt;
  h ^= h >> 15;
  h *= 2246822519u;
  h ^= h >> 13;
  const float v = static_cast<float>(h >> 8) * (2.0f / 16777216.0f) - 1.0f;
  p[i] = T(v == 0.0f ? 0.5f : v);
}

// d = linear_add's formula (kernels/linalg.h linear_bias_add) from the
// linear's product y (the type's rounding of x wᵀ): t = add(y, r), then
// d = add(t, bias) along rows of n, each rounded to T.
template <class T>
__global__ void linear_add_reference_kernel(T* d, const T* y, const T* r, const T* bias, std::int64_t count,
                                            std::int64_t n) {
  ::qgrad::cuda::wait_for_prior_kernels();
  using M = op_math_t<T>;
  const std::int64_t i = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i >= count) return;
  const T t = T(formulas::binary_apply(formulas::BinaryOp::add, M(y[i]), M(r[i])));
  d[i] = T(formulas::binary_apply(formulas::BinaryOp::add, M(t), M(bias[i % n])));
}

// f(tag) with tag's type the element type of `type` (f32, bf16, f16).
template <class F>
bool with_lt_type(cudaDataType_t type, F f) {
  switch (type) {
    case CUDA_R_32F: f(float{}); return true;
    case CUDA_R_16BF: f(bfloat16{}); return true;
    case CUDA_R_16F: f(half{}); return true;
    default: return false;
  }
}

bool fill_made_up(int device, cudaDataType_t type, void* p, std::int64_t n, std::uint32_t salt) {
  const auto blocks = static_cast<unsigned>((n + 255) / 256);
  return with_lt_type(type, [&](auto tag) {
    using T = decltype(tag);
    ::qgrad::cuda::launch_kernel(device, made_up_kernel<T>, blocks, 256, 0, static_cast<T*>(p), n, salt);
  });
}

bool linear_add_reference(int device, cudaDataType_t type, void* d, const void* y, const void* r, const void* bias,
                          std::int64_t count, std::int64_t n) {
  const auto blocks = static_cast<unsigned>((count + 255) / 256);
  return with_lt_type(type, [&](auto tag) {
    using T = decltype(tag);
    ::qgrad::cuda::launch_kernel(device, linear_add_reference_kernel<T>, blocks, 256, 0, static_cast<T*>(d),
                                 static_cast<const T*>(y), static_cast<const T*>(r), static_cast<const T*>(bias),
                                 count, n);
  });
}


}  // namespace

LtAlgos lt_heuristic_algos(cublasLtHandle_t h, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
                           cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t d, std::size_t workspace, unsigned align_a,
                           unsigned align_b, unsigned align_d, std::uint32_t reduction_schemes, int max_count) {
  LtAlgos algos;
  cublasLtMatmulPreference_t pref = nullptr;
  if (max_count <= 0 || !ok(cublasLtMatmulPreferenceCreate(&pref))) return algos;
  const std::uint32_t aa = align_a, ab = align_b, ad = align_d;
  bool good = ok(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                                      sizeof workspace));
  good = good && ok(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                                         &reduction_schemes, sizeof reduction_schemes));
  good = good && ok(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aa, sizeof aa));
  good = good && ok(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ab, sizeof ab));
  good = good && ok(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ad, sizeof ad));
  good = good && ok(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ad, sizeof ad));
  cublasLtMatmulHeuristicResult_t results[kLtMaxAlgos];
  int count = 0;
  good = good && ok(cublasLtMatmulAlgoGetHeuristic(h, desc, a, b, d, d, pref, std::min(max_count, kLtMaxAlgos), results,
                                                   &count));
  cublasLtMatmulPreferenceDestroy(pref);
  for (int i = 0; good && i < count; ++i) algos.algo[algos.count++] = results[i].algo;
  return algos;
}

bool lt_heuristic_algo(cublasLtHandle_t h, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
                       cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t d, std::size_t workspace, unsigned align_a,
                       unsigned align_b, unsigned align_d, std::uint32_t reduction_schemes, cublasLtMatmulAlgo_t& algo) {
  const LtAlgos algos = lt_heuristic_algos(h, desc, a, b, d, workspace, align_a, align_b, align_d, reduction_schemes, 1);
  if (algos.count == 0) return false;
  algo = algos.algo[0];
  return true;
}

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

bool lt_linear_bias(int device, cudaDataType_t type, const void* x, const void* w, const void* bias, void* out,
                    std::int64_t M, std::int64_t N, std::int64_t K, void* workspace, std::size_t workspace_bytes,
                    const void* residual, bool tf32) {
  const LinearKey key{device,           static_cast<int>(type), M,
                      N,                K,                      lt_alignment(x),
                      lt_alignment(w),  lt_alignment(bias),     lt_alignment(out),
                      residual != nullptr ? lt_alignment(residual) : 0u, tf32 && type == CUDA_R_32F};
  // The plan's descriptor is shared and the bias pointer is the caller's
  // each time: set and launched (asynchronously) under the lock.
  std::lock_guard<std::mutex> lock(lt_mutex());
  cublasLtHandle_t h = lt_handle(device, "linear");
  auto it = g_linear_plans.find(key);
  if (it == g_linear_plans.end()) it = g_linear_plans.emplace(key, make_linear_plan(h, key, bias)).first;
  LtPlan& plan = it->second;
  if (!plan.ok) return false;
  if (!ok(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias)))
    return false;
  const float alpha = 1.0f, zero = 0.0f, one = 1.0f;
  cudaStream_t s = ::qgrad::cuda::stream(device);
  // D = x w^T + bias, plus C = the residual where there is one.
  auto gemm = [&](const cublasLtMatmulAlgo_t& algo, void* d, const void* c) {
    return ok(cublasLtMatmul(h, plan.desc, &alpha, w, plan.a, x, plan.b, c != nullptr ? &one : &zero,
                             c != nullptr ? c : d, plan.c, d, plan.c, &algo, workspace, workspace_bytes, s));
  };
  auto run = [&](const cublasLtMatmulAlgo_t& algo, void* d) { return gemm(algo, d, residual); };
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (!plan.tuned && cudaStreamIsCapturing(s, &capture) == cudaSuccess && capture == cudaStreamCaptureStatusNone) {
    const std::size_t elem = type == CUDA_R_32F ? 4 : 2;
    const std::size_t bytes = static_cast<std::size_t>(M) * static_cast<std::size_t>(N) * elem;
    if (residual == nullptr) {
      tune_linear_plan(plan, s, out, bytes, run, nullptr);
    } else {
      // Checked and tuned on made-up bias and residual (the call's x and w):
      // the fused GEMM must give linear_add's formula, ((x wᵀ) + r) + bias,
      // each add rounded to the type, x wᵀ from the same algorithm (bias 0).
      Scratch made_r(bytes), made_b(static_cast<std::size_t>(N) * elem), zero_b(static_cast<std::size_t>(N) * elem),
          product(bytes);
      const bool have = made_r.p != nullptr && made_b.p != nullptr && zero_b.p != nullptr && product.p != nullptr &&
                        fill_made_up(device, type, made_r.p, M * N, 0x9e3779b9u) &&
                        fill_made_up(device, type, made_b.p, N, 0x85ebca6bu) &&
                        cudaMemsetAsync(zero_b.p, 0, static_cast<std::size_t>(N) * elem, s) == cudaSuccess;
      auto set_bias = [&](const void* b) {
        return ok(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &b, sizeof b));
      };
      if (have && set_bias(made_b.p)) {
        const cublasLtMatmulAlgo_t first = plan.algo;
        auto run_made_up = [&](const cublasLtMatmulAlgo_t& algo, void* d) { return gemm(algo, d, made_r.p); };
        tune_linear_plan(plan, s, out, bytes, run_made_up, [&](void* d) {
          return set_bias(zero_b.p) && gemm(first, product.p, nullptr) && set_bias(made_b.p) &&
                 linear_add_reference(device, type, d, product.p, made_r.p, made_b.p, M * N, N);
        });
      }
      plan.tuned = true;
      QGRAD_CUDA_CHECK(cudaStreamSynchronize(s));  // the scratch is freed next
      if (!set_bias(bias)) return false;
    }
  }
  if (residual != nullptr && !plan.residual_verified) return false;
  return run(plan.algo, out);
}

}  // namespace qgrad::kernels::cuda
