#include "kernels/cuda/lt_matmul.cuh"

#include <array>
#include <cstdint>
#include <map>
#include <mutex>

#include "kernels/cuda/blas.cuh"
#include "kernels/cuda/lt_gemm.cuh"

namespace qgrad::kernels::cuda {

namespace {

constexpr int kHeuristicResults = 8;

struct Plan {
  bool ok = false;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;  // cuBLASLt's A (our b), B (our a), C = D
  cublasLtMatmulAlgo_t algo{};
  std::size_t workspace = 0;
};

// device, dtype, batch, m, n, k, trans_a, trans_b, epilogue, alignments of a, b, c, vec.
using Key = std::array<std::int64_t, 13>;

std::mutex g_mutex;
std::map<Key, Plan> g_plans;

// The largest power of two (at most 256, cuBLASLt's default) dividing p.
std::uint32_t alignment(const void* p) {
  const auto v = reinterpret_cast<std::uintptr_t>(p);
  std::uint32_t al = 256;
  while (al > 1 && v % al != 0) al /= 2;
  return al;
}

bool good(cublasStatus_t st) { return st == CUBLAS_STATUS_SUCCESS; }

template <class V>
bool set(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const V& v) {
  return good(cublasLtMatmulDescSetAttribute(d, attr, &v, sizeof v));
}
template <class V>
bool set(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t attr, const V& v) {
  return good(cublasLtMatrixLayoutSetAttribute(l, attr, &v, sizeof v));
}
template <class V>
bool set(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t attr, const V& v) {
  return good(cublasLtMatmulPreferenceSetAttribute(p, attr, &v, sizeof v));
}

// A layout of rows x cols (column-major, leading dimension rows), `batch`
// of them `stride` elements apart.
bool make_layout(cublasLtMatrixLayout_t& l, cudaDataType_t type, std::int64_t rows, std::int64_t cols,
                 std::int64_t batch, std::int64_t stride) {
  bool ok = good(cublasLtMatrixLayoutCreate(&l, type, static_cast<std::uint64_t>(rows),
                                            static_cast<std::uint64_t>(cols), rows));
  if (ok && batch > 1) {
    ok = set(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, static_cast<std::int32_t>(batch)) &&
         set(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, stride);
  }
  return ok;
}

void destroy(Plan& p) {
  if (p.desc) cublasLtMatmulDescDestroy(p.desc);
  if (p.a) cublasLtMatrixLayoutDestroy(p.a);
  if (p.b) cublasLtMatrixLayoutDestroy(p.b);
  if (p.c) cublasLtMatrixLayoutDestroy(p.c);
  p = Plan{};
}

// Descriptors and the first usable heuristic algorithm for one key; vec is
// the epilogue's vector (its address tells the heuristic its alignment).
Plan make_plan(cublasLtHandle_t h, cudaDataType_t type, const GemmShape& s, LtEpilogue ep, void* vec,
               const std::array<std::uint32_t, 4>& align) {
  Plan p;
  bool ok = good(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_a = s.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt's A is our b
  const cublasOperation_t op_b = s.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt's B is our a
  ok = ok && set(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, op_a) && set(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, op_b);
  if (ep != LtEpilogue::none) {
    const cublasLtEpilogue_t e = ep == LtEpilogue::bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_BGRADB;
    ok = ok && set(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, e) && set(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, vec);
  }
  // Stored (pre-op) shapes: b is n x k column-major, or k x n when
  // transposed; a is k x m, or m x k; D is n x m.
  ok = ok && make_layout(p.a, type, s.trans_b ? s.k : s.n, s.trans_b ? s.n : s.k, s.batch, s.k * s.n);
  ok = ok && make_layout(p.b, type, s.trans_a ? s.m : s.k, s.trans_a ? s.k : s.m, s.batch, s.m * s.k);
  ok = ok && make_layout(p.c, type, s.n, s.m, s.batch, s.m * s.n);

  cublasLtMatmulPreference_t pref = nullptr;
  ok = ok && good(cublasLtMatmulPreferenceCreate(&pref));
  ok = ok && set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, static_cast<std::uint64_t>(kLtWorkspaceBytes));
  // Split-K only where the reduction stays inside the GEMM kernel.
  ok = ok && set(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                 static_cast<std::uint32_t>(CUBLASLT_REDUCTION_SCHEME_NONE));
  ok = ok && set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align[1]);  // b
  ok = ok && set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align[0]);  // a
  ok = ok && set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align[2]);
  ok = ok && set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align[2]);
  cublasLtMatmulHeuristicResult_t results[kHeuristicResults] = {};
  int count = 0;
  ok = ok && good(cublasLtMatmulAlgoGetHeuristic(h, p.desc, p.a, p.b, p.c, p.c, pref, kHeuristicResults, results,
                                                 &count));
  if (pref) cublasLtMatmulPreferenceDestroy(pref);
  bool found = false;
  for (int i = 0; ok && !found && i < count; ++i) {
    if (good(results[i].state) && results[i].workspaceSize <= kLtWorkspaceBytes) {
      p.algo = results[i].algo;
      p.workspace = results[i].workspaceSize;
      found = true;
    }
  }
  if (!found) destroy(p);
  p.ok = found;
  return p;
}

}  // namespace

bool lt_matmul(const GemmShape& s, const Tensor& a, const Tensor& b, const Tensor& c, bool accumulate,
               LtEpilogue epilogue, const Tensor& vec) {
  const DType dt = c.dtype();
  cudaDataType_t type;
  switch (dt) {
    case DType::f32: type = CUDA_R_32F; break;
    case DType::f16: type = CUDA_R_16F; break;
    case DType::bf16: type = CUDA_R_16BF; break;
    default: return false;  // f64: cuBLAS
  }
  if (s.batch <= 0 || s.m <= 0 || s.n <= 0 || s.k <= 0) return false;
  if (epilogue != LtEpilogue::none && (s.batch != 1 || !vec.defined())) return false;
  const int dev = c.device().index;
  void* pv = epilogue == LtEpilogue::none ? nullptr : vec.data_ptr();
  const std::array<std::uint32_t, 4> align{alignment(a.data_ptr()), alignment(b.data_ptr()),
                                           alignment(c.data_ptr()), pv ? alignment(pv) : 0u};
  const Key key{dev,      static_cast<std::int64_t>(dt), s.batch,  s.m,      s.n,     s.k,     s.trans_a,
                s.trans_b, static_cast<std::int64_t>(epilogue), align[0], align[1], align[2], align[3]};
  cublasLtHandle_t h = ::qgrad::cuda::lt_handle(dev);
  std::size_t ws_bytes = 0;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = g_plans.find(key);
    if (it == g_plans.end()) it = g_plans.emplace(key, make_plan(h, type, s, epilogue, pv, align)).first;
    if (!it->second.ok) return false;
    ws_bytes = it->second.workspace;
  }
  // Outside the plan lock: the caching allocator (stream-ordered, capture-safe).
  Tensor ws;
  if (ws_bytes > 0) {
    ws = Tensor::empty({static_cast<std::int64_t>(ws_bytes)},
                       TensorOptions{}.with_dtype(DType::u8).with_device(c.device()));
  }
  ::qgrad::cuda::DeviceGuard guard(dev);
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  std::lock_guard<std::mutex> lock(g_mutex);
  Plan& plan = g_plans.at(key);
  if (!plan.ok) return false;  // dropped by a failed call in between
  // The epilogue's pointer lives in the shared descriptor: set it and
  // enqueue the matmul under one lock.
  if (pv && !set(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, pv)) return false;
  const cublasStatus_t st =
      cublasLtMatmul(h, plan.desc, &alpha, b.data_ptr(), plan.a, a.data_ptr(), plan.b, &beta, c.data_ptr(), plan.c,
                     c.data_ptr(), plan.c, &plan.algo, ws_bytes ? ws.data_ptr() : nullptr, ws_bytes,
                     ::qgrad::cuda::stream(dev));
  if (!good(st)) {
    // Not this algorithm, then: every later call of this key takes the fallback.
    destroy(plan);
    return false;
  }
  return true;
}

}  // namespace qgrad::kernels::cuda
