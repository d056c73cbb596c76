// CUDA matmul through cuBLAS (row-major operands passed as their
// column-major transposes: C^T = op(B)^T · op(A)^T, no copies).
#include <climits>
#include <type_traits>

#include "qgrad/kernels/cuda/blas.cuh"
#include "qgrad/kernels/cuda/launch.cuh"
#include "qgrad/kernels/cuda/entries.h"
#include "qgrad/kernels/cuda/lt_gemm.cuh"
#include "qgrad/kernels/formulas/cast.h"

namespace qgrad::kernels::cuda {

namespace {

template <class T>
constexpr cudaDataType_t cuda_type() {
  if constexpr (std::is_same_v<T, half>) return CUDA_R_16F;
  else if constexpr (std::is_same_v<T, bfloat16>) return CUDA_R_16BF;
  else return CUDA_R_32F;
}

// Column-major cuBLAS arguments of a row-major GemmShape: C^T (n x m) =
// op(B)^T (n x k) · op(A)^T (k x m), so B is cuBLAS's first operand.
struct CublasGemm {
  int m, n, k, ld_first, ld_second, batch;
  cublasOperation_t op_first, op_second;
  long long stride_a, stride_b, stride_c;
  explicit CublasGemm(const GemmShape& s)
      : m(static_cast<int>(s.n)),
        n(static_cast<int>(s.m)),
        k(static_cast<int>(s.k)),
        ld_first(s.trans_b ? k : m),
        ld_second(s.trans_a ? n : k),
        batch(static_cast<int>(s.batch)),
        op_first(s.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N),
        op_second(s.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N),
        stride_a(s.broadcast_a ? 0 : s.m * s.k),
        stride_b(s.broadcast_b ? 0 : s.k * s.n),
        stride_c(s.m * s.n) {}
  // c (+)= a · b in the given compute type (f32, f16 or bf16 storage).
  void run(cublasHandle_t h, cudaDataType_t type, cublasComputeType_t compute, const void* a, const void* b, void* c,
           bool accumulate) const {
    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    QGRAD_CUBLAS_CHECK(cublasGemmStridedBatchedEx(h, op_first, op_second, m, n, k, &alpha, b, type, ld_first, stride_b,
                                                  a, type, ld_second, stride_a, &beta, c, type, m, stride_c, batch,
                                                  compute, CUBLAS_GEMM_DEFAULT));
  }
};

// Float32Matmul::tf32x3 (core/dtype.h): each operand split into its TF32
// value and remainder (formulas::tf32_split, both operands in one launch),
// then three TF32 products into c, the remainders' terms first.
void gemm_tf32x3(int dev, cublasHandle_t h, const GemmShape& s, const CublasGemm& g, const Tensor& a, const Tensor& b,
                 const Tensor& c, bool accumulate) {
  const std::int64_t na = (s.broadcast_a ? 1 : s.batch) * s.m * s.k, nb = (s.broadcast_b ? 1 : s.batch) * s.k * s.n;
  Tensor parts = Tensor::empty({2 * (na + nb)}, TensorOptions{}.with_device(c.device()));
  float* big_a = static_cast<float*>(parts.data_ptr());
  float* small_a = big_a + na;
  float* big_b = small_a + na;
  float* small_b = big_b + nb;
  const float* pa = static_cast<const float*>(a.data_ptr());
  const float* pb = static_cast<const float*>(b.data_ptr());
  launch_elementwise(dev, na + nb, [=] __device__(std::int64_t i) {
    if (i < na) formulas::tf32_split(pa[i], big_a[i], small_a[i]);
    else formulas::tf32_split(pb[i - na], big_b[i - na], small_b[i - na]);
  });
  constexpr cublasComputeType_t tf32 = CUBLAS_COMPUTE_32F_FAST_TF32;
  g.run(h, CUDA_R_32F, tf32, small_a, big_b, c.data_ptr(), accumulate);
  g.run(h, CUDA_R_32F, tf32, big_a, small_b, c.data_ptr(), true);
  g.run(h, CUDA_R_32F, tf32, big_a, big_b, c.data_ptr(), true);
}

template <class T>
void gemm_impl(const GemmShape& s, const Tensor& a, const Tensor& b, const Tensor& c, bool accumulate) {
  const int dev = c.device().index;
  T* pc = static_cast<T*>(c.data_ptr());
  if (s.batch == 0 || s.m == 0 || s.n == 0) return;
  if (s.k == 0) {
    if (!accumulate) {
      launch_elementwise(dev, c.numel(), [=] __device__(std::int64_t i) { pc[i] = T(op_math_t<T>(0)); });
    }
    return;
  }
  ::qgrad::cuda::DeviceGuard guard(dev);
  cublasHandle_t h = ::qgrad::cuda::blas_handle(dev);
  const CublasGemm g(s);
  if constexpr (std::is_same_v<T, double>) {
    const double alpha = 1.0, beta = accumulate ? 1.0 : 0.0;
    QGRAD_CUBLAS_CHECK(cublasDgemmStridedBatched(h, g.op_first, g.op_second, g.m, g.n, g.k, &alpha,
                                                 static_cast<const double*>(b.data_ptr()), g.ld_first, g.stride_b,
                                                 static_cast<const double*>(a.data_ptr()), g.ld_second, g.stride_a,
                                                 &beta, pc, g.m, g.stride_c, g.batch));
  } else if constexpr (std::is_same_v<T, float>) {
    if (tf32x3_applies(s)) return gemm_tf32x3(dev, h, s, g, a, b, c, accumulate);
    g.run(h, CUDA_R_32F, s.f32_math == Float32Matmul::tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F,
          a.data_ptr(), b.data_ptr(), pc, accumulate);
  } else {
    g.run(h, cuda_type<T>(), CUBLAS_COMPUTE_32F, a.data_ptr(), b.data_ptr(), pc, accumulate);  // f32 accumulation
  }
}

}  // namespace

void gemm(const GemmShape& s, const Tensor& a, const Tensor& b, const Tensor& c, bool accumulate) {
  dispatch_floating(c.dtype(), "gemm",
                    [&](auto tag) { gemm_impl<typename decltype(tag)::type>(s, a, b, c, accumulate); });
}

// The smallest GEMM (multiply-adds) that takes the epilogue path.
constexpr double kLtLinearMinMacs = 134217728.0;  // 2^27

bool linear_bias_lt(const GemmShape& s, const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out,
                    const Tensor& residual) {
  if (s.batch != 1 || s.trans_a || !s.trans_b || s.m == 0 || s.n == 0 || s.k == 0) return false;
  // Small GEMMs keep fill + cublasGemmEx: measured on an H100 (bench_train_step,
  // same run), the epilogue path cost ~5 us more per layer of the b256 MLP
  // (M = 256, m*n*k <= 51M) and saved 22 us per b4096/h1024 step and 0.29 ms
  // per ViT step (m*n*k >= 205M). Measured again on an H200 (2026-11-28, the
  // threshold at 0 against 2^27, two alternating rounds): b256 MLP step
  // 0.1586 / 0.1588 -> 0.1754 / 0.1791 ms, CNN 0.714 -> 0.725-0.730, although
  // the bias epilogue alone beat fill + GEMM at those shapes in
  // dev/cuda/linear_bias_broadcast.cu (10.75 vs 12.51 us at 256 x 256 x 784).
  // Why (2026-11-28, same program): offered the library's 4 MiB workspace the
  // heuristic's first algorithm there is a split-K one with in-place reduction
  // (3 graph nodes, 20-23 us; dev/cuda/mlp_gemm_nodes.cu), not the 11 us one it
  // picks with 32 MiB; the library's tuner keeps only algorithms with the first
  // one's bits, so it cannot leave it. 256 x 10 x 256 likewise (15.9 vs 7.3 us).
  if (static_cast<double>(s.m) * static_cast<double>(s.n) * static_cast<double>(s.k) < kLtLinearMinMacs) return false;
  // tf32x3 (f32): fill + its three products (kernels/linalg.h gemm).
  if (out.dtype() == DType::f32 && tf32x3_applies(s)) return false;
  cudaDataType_t type;
  switch (out.dtype()) {
    case DType::f32: type = CUDA_R_32F; break;
    case DType::bf16: type = CUDA_R_16BF; break;
    case DType::f16: type = CUDA_R_16F; break;
    default: return false;
  }
  const int dev = out.device().index;
  ::qgrad::cuda::DeviceGuard guard(dev);
  Tensor ws = Tensor::empty({static_cast<std::int64_t>(kLtLinearWorkspaceBytes)},
                            TensorOptions{}.with_device(out.device()).with_dtype(DType::u8));
  return lt_linear_bias(dev, type, x.data_ptr(), w.data_ptr(), bias.data_ptr(), out.data_ptr(), s.m, s.n, s.k,
                        ws.data_ptr(), kLtLinearWorkspaceBytes, residual.defined() ? residual.data_ptr() : nullptr,
                        type == CUDA_R_32F && s.f32_math == Float32Matmul::tf32);
}

}  // namespace qgrad::kernels::cuda
