// CUDA matmul through cuBLAS (row-major operands passed as their
// column-major transposes: C^T = op(B)^T · op(A)^T, no copies).
#include <climits>
#include <type_traits>

#include "qgrad/kernels/cuda/blas.cuh"
#include "qgrad/kernels/cuda/launch.cuh"
#include "qgrad/kernels/cuda/entries.h"

namespace qgrad::kernels::cuda {

namespace {

template <class T>
constexpr cudaDataType_t cuda_type() {
  if constexpr (std::is_same_v<T, half>) return CUDA_R_16F;
  else if constexpr (std::is_same_v<T, bfloat16>) return CUDA_R_16BF;
  else return CUDA_R_32F;
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
  // Column-major view: C^T (n x m) = op(B)^T (n x k) · op(A)^T (k x m).
  const int m = static_cast<int>(s.n), n = static_cast<int>(s.m), k = static_cast<int>(s.k);
  const cublasOperation_t op_first = s.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // b
  const cublasOperation_t op_second = s.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;  // a
  const int ld_first = s.trans_b ? k : m;
  const int ld_second = s.trans_a ? n : k;
  const long long stride_a = s.broadcast_a ? 0 : s.m * s.k, stride_b = s.broadcast_b ? 0 : s.k * s.n;
  const long long stride_c = s.m * s.n;
  const int batch = static_cast<int>(s.batch);
  const void* pa = a.data_ptr();
  const void* pb = b.data_ptr();
  if constexpr (std::is_same_v<T, double>) {
    const double alpha = 1.0, beta = accumulate ? 1.0 : 0.0;
    QGRAD_CUBLAS_CHECK(cublasDgemmStridedBatched(h, op_first, op_second, m, n, k, &alpha,
                                                 static_cast<const double*>(pb), ld_first, stride_b,
                                                 static_cast<const double*>(pa), ld_second, stride_a, &beta, pc, m,
                                                 stride_c, batch));
  } else {
    // f32 with CUBLAS_COMPUTE_32F (not TF32); f16 / bf16 accumulate in f32.
    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    constexpr cudaDataType_t type = cuda_type<T>();
    QGRAD_CUBLAS_CHECK(cublasGemmStridedBatchedEx(h, op_first, op_second, m, n, k, &alpha, pb, type, ld_first,
                                                  stride_b, pa, type, ld_second, stride_a, &beta, pc, type, m,
                                                  stride_c, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
}

}  // namespace

void gemm(const GemmShape& s, const Tensor& a, const Tensor& b, const Tensor& c, bool accumulate) {
  dispatch_floating(c.dtype(), "gemm",
                    [&](auto tag) { gemm_impl<typename decltype(tag)::type>(s, a, b, c, accumulate); });
}

}  // namespace qgrad::kernels::cuda
