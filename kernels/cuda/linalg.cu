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

// The tf32x3 split of `batches` row-major [rows, cols] matrices written
// transposed ([cols, rows] each, rows `ld` apart) into big and small: the
// K-major copy of an operand whose reduction runs over its rows (the weight
// gradient's dy and x), which Hopper's TF32 wgmma needs (it reads TF32
// operands K-major only: cuBLAS otherwise takes sm80 kernels at about twice
// the time, dev/cuda/tf32_layouts.cu). 32 x 32 tiles through shared memory,
// coalesced both ways; blockIdx.z is the batch.
__global__ void tf32_split_transposed_kernel(const float* __restrict__ in, float* __restrict__ big,
                                             float* __restrict__ small, int rows, int cols, long long ld) {
  ::qgrad::cuda::wait_for_prior_kernels();
  __shared__ float tile[32][33];
  const long long in_base = static_cast<long long>(blockIdx.z) * rows * cols;
  const long long out_base = static_cast<long long>(blockIdx.z) * cols * ld;
  const int r0 = static_cast<int>(blockIdx.y) * 32, c0 = static_cast<int>(blockIdx.x) * 32;
  for (int dy = static_cast<int>(threadIdx.y); dy < 32; dy += 8) {
    const int r = r0 + dy, c = c0 + static_cast<int>(threadIdx.x);
    if (r < rows && c < cols) tile[dy][threadIdx.x] = in[in_base + static_cast<long long>(r) * cols + c];
  }
  __syncthreads();
  for (int dy = static_cast<int>(threadIdx.y); dy < 32; dy += 8) {
    const int c = c0 + dy, r = r0 + static_cast<int>(threadIdx.x);  // out[c][r] = in[r][c]
    if (r < rows && c < cols) {
      const long long o = out_base + static_cast<long long>(c) * ld + r;
      formulas::tf32_split(tile[threadIdx.x][dy], big[o], small[o]);
    }
  }
}

// Splits `batches` row-major [rows, cols] matrices of `in` into big and
// small, each written [rows, cols] with rows `ld` apart (16-byte loads and
// stores where every pointer and stride allows), or, with `transpose`,
// [cols, rows] (above).
void split_operand(int dev, const float* in, float* big, float* small, std::int64_t batches, std::int64_t rows,
                   std::int64_t cols, bool transpose, std::int64_t ld) {
  if (transpose) {
    const dim3 grid(static_cast<unsigned>((cols + 31) / 32), static_cast<unsigned>((rows + 31) / 32),
                    static_cast<unsigned>(batches));
    ::qgrad::cuda::launch_kernel(dev, tf32_split_transposed_kernel, grid, dim3(32, 8), 0, in, big, small,
                                 static_cast<int>(rows), static_cast<int>(cols), static_cast<long long>(ld));
    return;
  }
  const std::int64_t all_rows = batches * rows;  // the batches' rows follow each other at the same stride
  if (cols % 4 == 0 && ld % 4 == 0 && vec4_aligned<float>(in) && vec4_aligned<float>(big) &&
      vec4_aligned<float>(small)) {
    const auto* in4 = reinterpret_cast<const float4*>(in);
    auto* big4 = reinterpret_cast<float4*>(big);
    auto* small4 = reinterpret_cast<float4*>(small);
    const std::int64_t cols4 = cols / 4, ld4 = ld / 4;
    launch_elementwise(dev, all_rows * cols4, [=] __device__(std::int64_t i) {
      const std::int64_t r = i / cols4, o = r * ld4 + (i - r * cols4);
      const float4 v = in4[i];
      float4 b, s;
      formulas::tf32_split(v.x, b.x, s.x);
      formulas::tf32_split(v.y, b.y, s.y);
      formulas::tf32_split(v.z, b.z, s.z);
      formulas::tf32_split(v.w, b.w, s.w);
      big4[o] = b;
      small4[o] = s;
    });
  } else {
    launch_elementwise(dev, all_rows * cols, [=] __device__(std::int64_t i) {
      const std::int64_t r = i / cols, o = r * ld + (i - r * cols);
      formulas::tf32_split(in[i], big[o], small[o]);
    });
  }
}

// c (+)= a · b^T in TF32 for K-major row-major a [m, k] and b [n, k] whose
// rows lie `ld` apart (batches m * ld and n * ld apart, or 0 where
// broadcast): cuBLAS's column-major c^T = b · a^T.
void gemm_k_major_tf32(cublasHandle_t h, const GemmShape& s, std::int64_t k, const float* a, const float* b,
                       std::int64_t ld, float* c, bool accumulate) {
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  const long long stride_a = s.broadcast_a ? 0 : s.m * ld, stride_b = s.broadcast_b ? 0 : s.n * ld;
  QGRAD_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(s.n), static_cast<int>(s.m), static_cast<int>(k), &alpha, b,
      CUDA_R_32F, static_cast<int>(ld), stride_b, a, CUDA_R_32F, static_cast<int>(ld), stride_a, &beta, c, CUDA_R_32F,
      static_cast<int>(s.n), s.m * s.n, static_cast<int>(s.batch), CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT));
}

// Float32Matmul::tf32x3 (core/dtype.h): each operand split into its TF32
// value and remainder (formulas::tf32_split), an operand whose reduction runs
// over its rows (A stored [k, m], B stored [k, n]) written transposed so that
// both reach cuBLAS K-major, each row of A as [small | big] and of B as
// [big | small]. Then two TF32 products into c: the remainders' two terms as
// one product over 2k (a_small · b_big + a_big · b_small: one pass over c
// fewer than a product each), then big · big on top (rows 2k apart).
// Operands too large for the transposing split's grid keep three products
// over plain copies.
void gemm_tf32x3(int dev, cublasHandle_t h, const GemmShape& s, const Tensor& a, const Tensor& b, const Tensor& c,
                 bool accumulate) {
  const std::int64_t batches_a = s.broadcast_a ? 1 : s.batch, batches_b = s.broadcast_b ? 1 : s.batch;
  const std::int64_t na = batches_a * s.m * s.k, nb = batches_b * s.k * s.n;
  // The transposing split's grid: a tile row per 32 rows (the reduction dim k), a batch per z.
  constexpr std::int64_t kMaxGridYZ = 65535;
  const bool tiles_fit = (s.k + 31) / 32 <= kMaxGridYZ;
  const bool k_major = tiles_fit && batches_a <= kMaxGridYZ && batches_b <= kMaxGridYZ;
  Tensor parts = Tensor::empty({2 * (na + nb)}, TensorOptions{}.with_device(c.device()));
  const auto* pa = static_cast<const float*>(a.data_ptr());
  const auto* pb = static_cast<const float*>(b.data_ptr());
  auto* pc = static_cast<float*>(c.data_ptr());
  float* a_parts = static_cast<float*>(parts.data_ptr());
  float* b_parts = a_parts + 2 * na;
  if (k_major) {
    // A stored [m, k] (or [k, m] when trans_a), B stored [n, k] (or [k, n] unless trans_b).
    const std::int64_t ld = 2 * s.k;
    split_operand(dev, pa, a_parts + s.k, a_parts, batches_a, s.trans_a ? s.k : s.m, s.trans_a ? s.m : s.k,
                  s.trans_a, ld);
    split_operand(dev, pb, b_parts, b_parts + s.k, batches_b, s.trans_b ? s.n : s.k, s.trans_b ? s.k : s.n,
                  !s.trans_b, ld);
    gemm_k_major_tf32(h, s, 2 * s.k, a_parts, b_parts, ld, pc, accumulate);
    gemm_k_major_tf32(h, s, s.k, a_parts + s.k, b_parts, ld, pc, true);
    return;
  }
  float *big_a = a_parts, *small_a = a_parts + na, *big_b = b_parts, *small_b = b_parts + nb;
  split_operand(dev, pa, big_a, small_a, 1, 1, na, false, na);  // as one row: no strides
  split_operand(dev, pb, big_b, small_b, 1, 1, nb, false, nb);
  const CublasGemm g(s);
  constexpr cublasComputeType_t tf32 = CUBLAS_COMPUTE_32F_FAST_TF32;
  g.run(h, CUDA_R_32F, tf32, small_a, big_b, pc, accumulate);
  g.run(h, CUDA_R_32F, tf32, big_a, small_b, pc, true);
  g.run(h, CUDA_R_32F, tf32, big_a, big_b, pc, true);
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
    if (tf32x3_applies(s)) return gemm_tf32x3(dev, h, s, a, b, c, accumulate);
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
