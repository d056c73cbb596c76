// CUDA FP8 linear (ops/fp8_linear.h): two bandwidth passes over x, then
// the FP8 tensor-core GEMM through cuBLASLt.
//
//   1. amax_scale_kernel (dynamic scale only): max |x| as ordered bits
//      (formulas::fp8_abs_bits), block maxima combined with atomicMax; the
//      last block to finish (core/cuda/common.cuh's block counters) writes
//      sx = max(amax, 1e-12) / 448 to device memory and resets its words.
//      Nothing comes back to the host.
//   2. quantize_kernel: q = e4m3(clamp(x / sx, +-448)) per element
//      (formulas::fp8_quant, the CPU's formula: bit-identical bytes), 16
//      elements per thread with 16-byte stores when the rows need no pad.
//   3. cublasLtMatmul: D (N x M, column-major = out [M, N] row-major) =
//      scale_A * scale_B * op(W)(N x K, transposed) x Q^T (K x M), "TN" as
//      FP8 requires, A/B scale pointers = sw / sx (device memory),
//      CUBLAS_COMPUTE_32F, fast accumulation off (partial sums promoted to
//      f32 periodically), CUBLASLT_EPILOGUE_BIAS with a bf16 bias (the bias
//      type cuBLASLt's FP8 kernels take for bf16 and f32 outputs). The
//      algorithm is chosen once per (device, shape, output, bias, operand
//      alignments) and cached with its descriptors for the process.
//
// cuBLASLt's FP8 requirements (cuBLAS docs, "cublasLtMatmul", FP8): K, the
// leading dimensions and N multiples of 16, 16-byte aligned pointers. K is
// padded to 16 by the quantize pass (zero columns) and, for the weight, by
// a copy; N is padded to 16 by a padded weight/bias and an output copy.
// The shapes of the benchmark (multiples of 16) take no copy.
#include <algorithm>
#include <map>
#include <tuple>

#include "qgrad/kernels/cuda/launch.cuh"
#include "qgrad/kernels/cuda/lt_gemm.cuh"
#include "qgrad/kernels/formulas/fp8_linear.h"
#include "qgrad/kernels/fp8_linear.h"

namespace qgrad::kernels::cuda {

namespace {

constexpr const char* kOp = "fp8_linear";
constexpr unsigned kThreads = 256;

template <class T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }

// ---- 1. amax -> scale ----

__device__ std::uint32_t warp_max_u32(std::uint32_t m) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
  return m;
}

template <class T>
__global__ void amax_scale_kernel(const T* __restrict__ x, std::int64_t n, bool vec, std::uint32_t* counters,
                                  float* __restrict__ scale) {
  ::qgrad::cuda::wait_for_prior_kernels();
  constexpr int V = 16 / sizeof(T);
  using P = Pack<T, V>;
  std::uint32_t m = 0;
  const std::int64_t tid = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  const std::int64_t nvec = vec ? n / V : 0;
  const P* xv = reinterpret_cast<const P*>(x);
  for (std::int64_t i = tid; i < nvec; i += stride) {
    const P p = xv[i];
#pragma unroll
    for (int e = 0; e < V; ++e) m = max(m, formulas::fp8_abs_bits(static_cast<float>(p.v[e])));
  }
  for (std::int64_t i = nvec * V + tid; i < n; i += stride) m = max(m, formulas::fp8_abs_bits(static_cast<float>(x[i])));
  m = warp_max_u32(m);
  __shared__ std::uint32_t warp_max[32];
  const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_max[warp] = m;
  __syncthreads();
  if (warp != 0) return;
  m = lane < (blockDim.x + 31) / 32 ? warp_max[lane] : 0u;
  m = warp_max_u32(m);
  if (lane != 0) return;
  // counters[0]: blocks done; counters[1]: the running max. The last block
  // reads the total, writes the scale and leaves both words at 0.
  atomicMax(&counters[1], m);
  __threadfence();
  if (atomicAdd(&counters[0], 1u) == gridDim.x - 1) {
    const std::uint32_t total = atomicExch(&counters[1], 0u);
    scale[0] = formulas::fp8_linear_scale(total);
    atomicExch(&counters[0], 0u);
  }
}

// ---- 2. quantize ----

// Rows without pad (ld == K): 16 consecutive elements per thread, one
// 16-byte store of their e4m3 bytes (n a multiple of 16, pointers aligned).
template <class T>
__global__ void quantize16_kernel(const T* __restrict__ x, std::int64_t chunks, const float* __restrict__ scale,
                                  uint4* __restrict__ q) {
  ::qgrad::cuda::wait_for_prior_kernels();
  constexpr int V = 16 / sizeof(T);  // elements per 16-byte load
  using P = Pack<T, V>;
  const float s = scale[0];
  for (std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < chunks;
       c += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const P* src = reinterpret_cast<const P*>(x + c * 16);
    Pack<std::uint8_t, 16> out;
#pragma unroll
    for (int l = 0; l < 16 / V; ++l) {
      const P p = src[l];
#pragma unroll
      for (int e = 0; e < V; ++e) out.v[l * V + e] = formulas::fp8_quant<float8_e4m3>(static_cast<float>(p.v[e]), s).bits;
    }
    q[c] = *reinterpret_cast<const uint4*>(&out);
  }
}

// Any rows: one output byte per index, the pad columns K.. zero.
template <class T>
__global__ void quantize_rows_kernel(const T* __restrict__ x, std::int64_t M, std::int64_t K, std::int64_t ld,
                                     const float* __restrict__ scale, std::uint8_t* __restrict__ q) {
  ::qgrad::cuda::wait_for_prior_kernels();
  const float s = scale[0];
  const std::int64_t total = M * ld;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t m = i / ld, k = i % ld;
    q[i] = k < K ? formulas::fp8_quant<float8_e4m3>(static_cast<float>(x[m * K + k]), s).bits : std::uint8_t(0);
  }
}

template <class T>
void quantize_impl(const Tensor& x, std::int64_t K, const Tensor& scale, bool dynamic, const Tensor& q,
                   std::int64_t ld) {
  const int d = x.device().index;
  const T* xp = static_cast<const T*>(x.data_ptr());
  const std::int64_t n = x.numel(), M = n / K;
  float* sp = static_cast<float*>(scale.data_ptr());
  const unsigned fill = ::qgrad::cuda::fill_blocks(d, kThreads);
  if (dynamic) {
    constexpr std::int64_t V = 16 / sizeof(T);
    const unsigned blocks = ::qgrad::cuda::blocks_for((n + V - 1) / V, kThreads, fill);
    ::qgrad::cuda::launch_kernel(d, amax_scale_kernel<T>, blocks, kThreads, 0, xp, n, aligned16(xp),
                                 ::qgrad::cuda::block_counters(d), sp);
  }
  if (ld == K && n % 16 == 0 && aligned16(xp) && aligned16(q.data_ptr())) {
    const std::int64_t chunks = n / 16;
    ::qgrad::cuda::launch_kernel(d, quantize16_kernel<T>, ::qgrad::cuda::blocks_for(chunks, kThreads, fill * 4LL),
                                 kThreads, 0, xp, chunks, sp, static_cast<uint4*>(q.data_ptr()));
  } else {
    ::qgrad::cuda::launch_kernel(d, quantize_rows_kernel<T>, ::qgrad::cuda::blocks_for(M * ld, kThreads, fill * 4LL),
                                 kThreads, 0, xp, M, K, ld, sp, static_cast<std::uint8_t*>(q.data_ptr()));
  }
}

// ---- 3. the cuBLASLt FP8 GEMM ----

struct Fp8Plan {
  bool ok = false;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

// device, M, Np, Kp, output type, bias, alignments of W, Q, D, bias.
using Fp8Key = std::tuple<int, std::int64_t, std::int64_t, std::int64_t, int, bool, unsigned, unsigned, unsigned, unsigned>;
std::map<Fp8Key, Fp8Plan> g_fp8_plans;

bool ok(cublasStatus_t s) { return s == CUBLAS_STATUS_SUCCESS; }

// Pointers (set again on every call) are set before the heuristic too.
struct Fp8Pointers {
  const void *sw, *sx, *bias;
};

bool set_pointers(cublasLtMatmulDesc_t desc, const Fp8Pointers& ptr) {
  bool good = ok(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &ptr.sw, sizeof ptr.sw));
  good = good && ok(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &ptr.sx, sizeof ptr.sx));
  if (ptr.bias)
    good = good && ok(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &ptr.bias, sizeof ptr.bias));
  return good;
}

Fp8Plan make_plan(cublasLtHandle_t h, std::int64_t M, std::int64_t Np, std::int64_t Kp, cudaDataType_t out_type,
                  const Fp8Pointers& ptr, unsigned al_w, unsigned al_q, unsigned al_d) {
  const bool has_bias = ptr.bias != nullptr;
  Fp8Plan p;
  bool good = ok(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  const std::int8_t fast_accum = 0;
  good = good && ok(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  good = good && ok(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  good = good && ok(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast_accum,
                                                   sizeof fast_accum));
  good = good && set_pointers(p.desc, ptr);
  if (has_bias) {
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    const std::int32_t bias_type = CUDA_R_16BF;
    good = good && ok(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    good = good && ok(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                                     sizeof bias_type));
  }
  const auto u64 = [](std::int64_t v) { return static_cast<std::uint64_t>(v); };
  good = good && ok(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_8F_E4M3, u64(Kp), u64(Np), Kp));
  good = good && ok(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_8F_E4M3, u64(Kp), u64(M), Kp));
  good = good && ok(cublasLtMatrixLayoutCreate(&p.d, out_type, u64(Np), u64(M), Np));
  p.ok = good && lt_heuristic_algo(h, p.desc, p.a, p.b, p.d, kLtWorkspaceBytes, al_w, al_q, al_d,
                                   CUBLASLT_REDUCTION_SCHEME_MASK, p.algo);
  return p;
}

// dst [rows, ld_dst] (zero-padded) from src [rows_src, cols] (row-major).
template <class T>
Tensor padded(const Tensor& src, std::int64_t rows, std::int64_t ld, DType dt) {
  const std::int64_t rs = src.dim() == 2 ? src.shape()[0] : 1, cols = src.shape().back();
  Tensor dst = Tensor::empty(src.dim() == 2 ? Shape{rows, ld} : Shape{ld}, TensorOptions{}.with_device(src.device()).with_dtype(dt));
  const T* s = static_cast<const T*>(src.data_ptr());
  T* o = static_cast<T*>(dst.data_ptr());
  launch_elementwise(src.device().index, rows * ld, [=] __device__(std::int64_t i) {
    const std::int64_t r = i / ld, c = i % ld;
    o[i] = (r < rs && c < cols) ? s[r * cols + c] : T::from_bits(0);
  });
  return dst;
}

}  // namespace

void fp8_quantize_rows(const Tensor& x, std::int64_t K, const Tensor& scale, bool dynamic, const Tensor& q,
                       std::int64_t ld) {
  switch (x.dtype()) {
    case DType::f32: quantize_impl<float>(x, K, scale, dynamic, q, ld); break;
    case DType::bf16: quantize_impl<bfloat16>(x, K, scale, dynamic, q, ld); break;
    case DType::f16: quantize_impl<half>(x, K, scale, dynamic, q, ld); break;
    default: throw Error(kOp, "x", std::string("unsupported dtype ") + dtype_name(x.dtype()));
  }
}

void fp8_gemm(const Tensor& q, std::int64_t ld, std::int64_t K, const Tensor& w, const Tensor& sx, const Tensor& sw,
              const Tensor& bias, const Tensor& out) {
  const Device dev = out.device();
  const int d = dev.index;
  const std::int64_t M = out.shape()[0], N = out.shape()[1];
  const std::int64_t Kp = ld, Np = (N + 15) / 16 * 16;
  const TensorOptions on = TensorOptions{}.with_device(dev);
  // Weight [Np, Kp] and bias [Np]: the caller's when aligned, else padded copies.
  Tensor wp = (K != Kp || N != Np || !aligned16(w.data_ptr())) ? padded<float8_e4m3>(w, Np, Kp, DType::f8e4m3) : w;
  Tensor bp = bias;
  if (bias.defined() && (N != Np || !aligned16(bias.data_ptr()))) bp = padded<bfloat16>(bias, 1, Np, DType::bf16);
  Tensor dout = N == Np ? out : Tensor::empty({M, Np}, TensorOptions(on).with_dtype(out.dtype()));
  Tensor ws = Tensor::empty({static_cast<std::int64_t>(kLtWorkspaceBytes)}, TensorOptions(on).with_dtype(DType::u8));
  const cudaDataType_t out_type = out.dtype() == DType::f32 ? CUDA_R_32F : CUDA_R_16BF;
  const void* bias_ptr = bp.defined() ? bp.data_ptr() : nullptr;
  const Fp8Pointers ptr{sw.data_ptr(), sx.data_ptr(), bias_ptr};
  cudaStream_t st = ::qgrad::cuda::stream(d);
  cublasStatus_t status = CUBLAS_STATUS_NOT_SUPPORTED;
  bool planned = false;
  {
    std::lock_guard<std::mutex> lock(lt_mutex());
    cublasLtHandle_t h = lt_handle(d, kOp);
    const Fp8Key key{d,
                     M,
                     Np,
                     Kp,
                     static_cast<int>(out_type),
                     bias_ptr != nullptr,
                     lt_alignment(wp.data_ptr()),
                     lt_alignment(q.data_ptr()),
                     lt_alignment(dout.data_ptr()),
                     bias_ptr ? lt_alignment(bias_ptr) : 256u};
    auto it = g_fp8_plans.find(key);
    if (it == g_fp8_plans.end())
      it = g_fp8_plans
               .emplace(key, make_plan(h, M, Np, Kp, out_type, ptr, std::get<6>(key), std::get<7>(key),
                                       std::get<8>(key)))
               .first;
    const Fp8Plan& p = it->second;
    planned = p.ok;
    if (p.ok) {
      // The per-call pointers on the cached descriptor (the lock is held
      // until the launch is queued).
      const bool good = set_pointers(p.desc, ptr);
      const float alpha = 1.0f, beta = 0.0f;
      status = good ? cublasLtMatmul(h, p.desc, &alpha, wp.data_ptr(), p.a, q.data_ptr(), p.b, &beta, dout.data_ptr(),
                                     p.d, dout.data_ptr(), p.d, &p.algo, ws.data_ptr(), kLtWorkspaceBytes, st)
                    : CUBLAS_STATUS_INVALID_VALUE;
    }
  }
  QGRAD_CHECK(planned, kOp, "", "cuBLASLt has no FP8 algorithm for M = ", M, ", N = ", N, ", K = ", K, " (",
              out.dtype() == DType::f32 ? "f32" : "bf16", " output", bias_ptr ? ", bias" : "", ")");
  QGRAD_CHECK(status == CUBLAS_STATUS_SUCCESS, kOp, "", "cublasLtMatmul failed with status ", static_cast<int>(status),
              " for M = ", M, ", N = ", N, ", K = ", K);
  if (N != Np) {
    const std::int64_t total = M * N;
    if (out.dtype() == DType::f32) {
      const float* s = static_cast<const float*>(dout.data_ptr());
      float* o = static_cast<float*>(out.data_ptr());
      launch_elementwise(d, total, [=] __device__(std::int64_t i) { o[i] = s[(i / N) * Np + i % N]; });
    } else {
      const bfloat16* s = static_cast<const bfloat16*>(dout.data_ptr());
      bfloat16* o = static_cast<bfloat16*>(out.data_ptr());
      launch_elementwise(d, total, [=] __device__(std::int64_t i) { o[i] = s[(i / N) * Np + i % N]; });
    }
  }
}

}  // namespace qgrad::kernels::cuda
