// CUDA kernels of the int4 linear layers (kernels/lowbit_linear.h).
//
// W4A16, decode sizes (M <= kW4A16GemvMaxM, bf16/f16 x): the tensor-core
// GEMVs of kernels/cuda/w4a16_gemv.cuh (the bulk-copy GEMV, the split-K
// GEMV and the route between them).
// W4A16, larger M: W dequantized to T into a scratch [N, K] (one pass, 8
// values per thread) and cuBLAS (CUBLAS_COMPUTE_32F; 16-bit x: an f32
// product, then bias and one rounding in one pass; f32 x: bias filled first
// and accumulated onto). Other shapes (f32 x, K or G not a
// multiple of 32, unaligned rows) at M <= kW4A16GemvMaxM: a warp per output.
//
// W4A8 with groups (K % 128 == 0, G % 8 == 0, G dividing 128 or a multiple
// of it): a block per 16 rows x 16 channels, one output per thread, the s8
// activation tile and the widened weight tile in shared memory per 128
// columns, dp4a spans, the f32 group terms added in increasing g (see
// w4a8_tile_kernel). Other shapes: a warp per output; lane l owns groups l,
// l + 32, ...; each group sum is exact (dp4a over 8 values per step when
// G % 8 == 0), and the f32 group terms are added in increasing g by every
// lane from shuffles, as the CPU adds them. Both bit-identical to the CPU.
// int4_widen: 16 packed bytes in, 32 s8 out per thread.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "qgrad/kernels/basic.h"
#include "qgrad/kernels/cuda/blas.cuh"
#include "qgrad/kernels/cuda/entries.h"
#include "qgrad/kernels/cuda/launch.cuh"
#include "qgrad/kernels/cuda/mbarrier.cuh"
#include "qgrad/kernels/cuda/mma.cuh"
#include "qgrad/kernels/cuda/w4a16_gemv.cuh"
#include "qgrad/kernels/formulas/lowbit_linear.h"
#include "qgrad/kernels/linalg.h"
#include "qgrad/kernels/lowbit_linear.h"

namespace qgrad::kernels::cuda {

namespace {

using I64 = std::int64_t;

bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }

// The 4 s4 values of a 16-bit pair of bytes (low nibble first) as 4 s8
// bytes of a word (formulas::int4_value per nibble): the nibbles spread to
// the bytes, then (u ^ 8) - 8 per byte (modulo 256: __vsub4 does not saturate).
__device__ __forceinline__ std::uint32_t s4x4_to_s8x4_fast(std::uint32_t x) {
  const std::uint32_t b = (x & 0xfu) | ((x & 0xf0u) << 4) | ((x & 0xf00u) << 8) | ((x & 0xf000u) << 12);
  return __vsub4(b ^ 0x08080808u, 0x08080808u);
}

template <class F>
void dispatch_linear_dtype(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::f32: f(TypeTag<float>{}); return;
    case DType::f16: f(TypeTag<half>{}); return;
    case DType::bf16: f(TypeTag<bfloat16>{}); return;
    default: break;
  }
  throw Error(op, "dtype", std::string("expected f32, f16 or bf16, got ") + dtype_name(t));
}


// The decode GEMVs where they apply (returns whether it launched): w plain
// ([N, K] packed, M <= kW4A16GemvMaxM) or (fragments) in pack_w4a16's
// fragment order, which only the split-K GEMV reads (M <= kW4A16FragMaxM;
// it loads that weight and the scales and zero points PackedW4A16 owns
// alongside before it waits for the kernel before). zp defined: u4 (the op
// has checked that s4 comes without one).
template <class T>
bool w4a16_gemv(const Tensor& x, const Tensor& w, const Tensor& scale, const Tensor& zp, I64 G, const Tensor& bias,
                const Tensor& out, bool fragments) {
  if constexpr (std::is_same_v<T, float>) {
    return false;
  } else {
    const I64 M = out.shape()[0], N = out.shape()[1], K = x.shape()[1];
    if (M > (fragments ? kW4A16FragMaxM : kW4A16GemvMaxM) || K % 32 != 0 || G % 32 != 0 ||
        !aligned16(x.data_ptr()) || !aligned16(w.data_ptr()) || K > (I64(1) << 30) || N > (I64(1) << 30))
      return false;
    W4a16GemvArgs<T> a{static_cast<const T*>(x.data_ptr()), static_cast<const std::uint8_t*>(w.data_ptr()),
                       scale.data_ptr(), zp.defined() ? static_cast<const std::int32_t*>(zp.data_ptr()) : nullptr,
                       bias.defined() ? static_cast<const T*>(bias.data_ptr()) : nullptr,
                       static_cast<T*>(out.data_ptr()), static_cast<int>(M), static_cast<int>(N),
                       static_cast<int>(K), static_cast<int>(G), /*w_signed=*/!zp.defined(),
                       /*scale_in_t=*/scale.dtype() != DType::f32, out.device().index};
    a.w_fragments = fragments;
    launch_w4a16_decode(a);
    return true;
  }
}

// An empty grid: the kernel after it in the stream can overlap only this one.
__global__ void settle_kernel() { ::qgrad::cuda::wait_for_prior_kernels(); }

// ------------------------------------------------------- W4A16 other shapes

// A warp per output (m, n): lanes stride over k, a shuffle reduction.
template <class T>
__global__ void w4a16_warp_kernel(const T* __restrict__ x, const std::uint8_t* __restrict__ w,
                                  const float* __restrict__ scale, const std::int32_t* __restrict__ zp,
                                  const T* __restrict__ bias, T* __restrict__ out, I64 M, I64 N, I64 K, I64 G,
                                  bool is_signed) {
  ::qgrad::cuda::wait_for_prior_kernels();
  const int lane = threadIdx.x & 31;
  const I64 warps = static_cast<I64>(gridDim.x) * (blockDim.x / 32);
  const I64 groups = K / G;
  for (I64 o = (static_cast<I64>(blockIdx.x) * blockDim.x + threadIdx.x) / 32; o < M * N; o += warps) {
    const I64 m = o / N, n = o % N;
    float acc = 0;
    for (I64 k = lane; k < K; k += 32) {
      const I64 gi = n * groups + k / G;
      const int q = nibble_get(w, n * K + k, is_signed) - (zp ? zp[gi] : 0);
      acc += static_cast<float>(x[m * K + k]) * static_cast<float>(formulas::w4a16_weight<T>(q, scale[gi]));
    }
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, d);
    if (lane == 0) out[o] = T(bias ? acc + static_cast<float>(bias[n]) : acc);
  }
}

// W (T [N, K]) = T((q - zp) * s): 8 values (one 32-bit word of nibbles) per
// index when K and G are multiples of 8, else one.
template <class T>
void dequantize_weight(const Tensor& w, const Tensor& scale, const Tensor& zp, I64 G, const Tensor& wd) {
  const I64 N = w.shape()[0], K = w.shape()[1], groups = K / G;
  const auto* wp = static_cast<const std::uint8_t*>(w.data_ptr());
  const float* sp = static_cast<const float*>(scale.data_ptr());
  const std::int32_t* zpp = zp.defined() ? static_cast<const std::int32_t*>(zp.data_ptr()) : nullptr;
  const bool is_signed = w.dtype() == DType::s4;
  T* o = static_cast<T*>(wd.data_ptr());
  const int d = wd.device().index;
  if (K % 8 == 0 && G % 8 == 0 && (reinterpret_cast<std::uintptr_t>(wp) & 3u) == 0 &&
      (reinterpret_cast<std::uintptr_t>(o) % (8 * sizeof(T))) == 0) {
    launch_elementwise(d, N * K / 8, [=] __device__(I64 i) {
      const std::uint32_t word = reinterpret_cast<const std::uint32_t*>(wp)[i];
      const I64 k8 = i * 8, n = k8 / K, gi = n * groups + (k8 % K) / G;
      const float s = sp[gi];
      const int z = zpp ? zpp[gi] : 0;
      T v[8];
#pragma unroll
      for (int e = 0; e < 8; ++e)
        v[e] = formulas::w4a16_weight<T>(formulas::int4_value((word >> (4 * e)) & 0xfu, is_signed) - z, s);
#pragma unroll
      for (int e = 0; e < 8; ++e) o[k8 + e] = v[e];
    });
  } else {
    launch_elementwise(d, N * K, [=] __device__(I64 i) {
      const I64 gi = (i / K) * groups + (i % K) / G;
      o[i] = formulas::w4a16_weight<T>(nibble_get(wp, i, is_signed) - (zpp ? zpp[gi] : 0), sp[gi]);
    });
  }
}

template <class T>
void w4a16_impl(const Tensor& x, const Tensor& w, const Tensor& scale16, const Tensor& zp, I64 G, const Tensor& bias,
                const Tensor& out) {
  const I64 M = out.shape()[0], N = out.shape()[1], K = w.shape()[1];
  if (w4a16_gemv<T>(x, w, scale16, zp, G, bias, out, /*fragments=*/false)) return;
  // The other paths read f32 scales: a T scale widened exactly (same formula).
  Tensor scale = scale16;
  if (scale16.dtype() != DType::f32) {
    scale = Tensor::empty(scale16.shape(), TensorOptions{}.with_dtype(DType::f32).with_device(out.device()));
    ::qgrad::kernels::cast(scale16, scale);
  }
  const Device dev = out.device();
  if (M <= kW4A16GemvMaxM) {
    constexpr unsigned threads = 256;
    const unsigned blocks = ::qgrad::cuda::blocks_for(M * N * 32, threads);
    ::qgrad::cuda::launch_kernel(dev.index, w4a16_warp_kernel<T>, blocks, threads, 0,
                                 static_cast<const T*>(x.data_ptr()), static_cast<const std::uint8_t*>(w.data_ptr()),
                                 static_cast<const float*>(scale.data_ptr()),
                                 zp.defined() ? static_cast<const std::int32_t*>(zp.data_ptr()) : nullptr,
                                 bias.defined() ? static_cast<const T*>(bias.data_ptr()) : nullptr,
                                 static_cast<T*>(out.data_ptr()), M, N, K, G, w.dtype() == DType::s4);
    return;
  }
  Tensor wd = Tensor::empty({N, K}, TensorOptions{}.with_dtype(out.dtype()).with_device(dev));
  dequantize_weight<T>(w, scale, zp, G, wd);
  if constexpr (std::is_same_v<T, float>) {
    if (bias.defined()) fill_rows(bias, out);
    GemmShape s;
    s.m = M;
    s.n = N;
    s.k = K;
    s.trans_b = true;
    kernels::cuda::gemm(s, x, wd, out, bias.defined());
  } else {
    // A 16-bit C lets cuBLAS round split-K partial sums to the output type
    // (several ulps, measured on H100 even with
    // CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION). The promise is f32
    // accumulation and one rounding: cuBLAS writes the f32 product to a
    // scratch [M, N], and one pass adds the bias and rounds to T.
    Tensor acc = Tensor::empty({M, N}, TensorOptions{}.with_dtype(DType::f32).with_device(dev));
    constexpr cudaDataType_t type = std::is_same_v<T, half> ? CUDA_R_16F : CUDA_R_16BF;
    const float alpha = 1.0f, beta = 0.0f;
    ::qgrad::cuda::DeviceGuard guard(dev.index);
    // Column-major: acc^T (N x M) = wd (K x N as stored, transposed) . x^T (K x M).
    QGRAD_CUBLAS_CHECK(cublasGemmEx(::qgrad::cuda::blas_handle(dev.index), CUBLAS_OP_T, CUBLAS_OP_N,
                                    static_cast<int>(N), static_cast<int>(M), static_cast<int>(K), &alpha,
                                    wd.data_ptr(), type, static_cast<int>(K), x.data_ptr(), type, static_cast<int>(K),
                                    &beta, acc.data_ptr(), CUDA_R_32F, static_cast<int>(N), CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT));
    const float* a = static_cast<const float*>(acc.data_ptr());
    const T* b = bias.defined() ? static_cast<const T*>(bias.data_ptr()) : nullptr;
    T* o = static_cast<T*>(out.data_ptr());
    launch_elementwise(dev.index, M * N, [=] __device__(I64 i) {
      o[i] = T(b ? a[i] + static_cast<float>(b[i % N]) : a[i]);
    });
  }
}

// ------------------------------------------------------------------- W4A8

// A warp per output; lane l owns groups l, l + 32, ... Each round of 32
// groups is added to y in increasing g by every lane (shuffles), so y is
// term(0) + term(1) + ... exactly as on the CPU.
template <class T, bool kVec>
__global__ void w4a8_group_kernel(const std::int8_t* __restrict__ a, I64 lda, const float* __restrict__ sa,
                                  const std::int32_t* __restrict__ za, const std::uint8_t* __restrict__ w,
                                  const float* __restrict__ sw, const float* __restrict__ bias, T* __restrict__ out,
                                  I64 M, I64 N, I64 K, I64 G) {
  ::qgrad::cuda::wait_for_prior_kernels();
  const int lane = threadIdx.x & 31;
  const I64 warps = static_cast<I64>(gridDim.x) * (blockDim.x / 32);
  const I64 groups = K / G;
  for (I64 o = (static_cast<I64>(blockIdx.x) * blockDim.x + threadIdx.x) / 32; o < M * N; o += warps) {
    const I64 m = o / N, n = o % N;
    const float s_a = sa[m];
    const std::int32_t z = za ? za[m] : 0;
    const std::int8_t* ar = a + m * lda;
    float y = 0;
    for (I64 g0 = 0; g0 < groups; g0 += 32) {
      const I64 gl = g0 + lane;
      float term = 0;
      if (gl < groups) {
        std::int32_t acc = 0;
        if constexpr (kVec) {
          // 8 values per step: one word of nibbles, two words of activations.
          const std::uint32_t* wr = reinterpret_cast<const std::uint32_t*>(w + (n * K + gl * G) / 2);
          const std::uint32_t* arr = reinterpret_cast<const std::uint32_t*>(ar + gl * G);
          int dot = 0, wsum = 0;
          for (I64 j = 0; j < G / 8; ++j) {
            const std::uint32_t word = wr[j];
            const int w_lo = static_cast<int>(s4x4_to_s8x4_fast(word & 0xffffu));
            const int w_hi = static_cast<int>(s4x4_to_s8x4_fast(word >> 16));
            dot = __dp4a(static_cast<int>(arr[2 * j]), w_lo, dot);
            dot = __dp4a(static_cast<int>(arr[2 * j + 1]), w_hi, dot);
            wsum = __dp4a(0x01010101, w_lo, wsum);
            wsum = __dp4a(0x01010101, w_hi, wsum);
          }
          acc = static_cast<std::int32_t>(static_cast<std::uint32_t>(dot) -
                                          static_cast<std::uint32_t>(z) * static_cast<std::uint32_t>(wsum));
        } else {
          std::uint32_t u = 0;
          for (I64 k = gl * G; k < (gl + 1) * G; ++k)
            u += static_cast<std::uint32_t>((static_cast<std::int32_t>(ar[k]) - z) * nibble_get(w, n * K + k, true));
          acc = static_cast<std::int32_t>(u);
        }
        term = formulas::w4a8_group_term(acc, s_a, sw[n * groups + gl]);
      }
      const I64 valid = groups - g0 < 32 ? groups - g0 : 32;
      for (int j = 0; j < valid; ++j) {
        const float v = __shfl_sync(0xffffffffu, term, j);
        y = (g0 == 0 && j == 0) ? v : y + v;
      }
    }
    if (lane == 0) out[o] = T(bias ? y + bias[n] : y);
  }
}

// Tiled: a block of 256 threads owns 16 rows x 16 channels, one output per
// thread. Per 128 columns of K the block stages the 16 activation rows (s8)
// and the 16 weight rows widened to s8 in shared memory (coalesced 8- and
// 4-byte loads, 132-byte rows: conflict-free reads), then each thread sums
// its spans of L = min(G, 128) columns with dp4a (Σ(a − za)·w = dp4a(a, w) −
// za·Σw, modulo 2^32, so exact wherever the group sum fits int32, as the CPU
// kernel's) and, at each group's end, adds the f32 term to its y in
// increasing g (the first term not added to a zero): the CPU's bits. Needs
// K % 128 == 0, G % 8 == 0 and G dividing 128 or a multiple of it.
constexpr int kW4A8Kt = 128, kW4A8Tile = 16;

template <class T>
__global__ void __launch_bounds__(kW4A8Tile * kW4A8Tile)
    w4a8_tile_kernel(const std::int8_t* __restrict__ a, I64 lda, const float* __restrict__ sa,
                     const std::int32_t* __restrict__ za, const std::uint8_t* __restrict__ w,
                     const float* __restrict__ sw, const float* __restrict__ bias, T* __restrict__ out, int M, int N,
                     int K, int G) {
  ::qgrad::cuda::wait_for_prior_kernels();
  constexpr int kWords = kW4A8Kt / 4;  // s8 words per staged row
  __shared__ std::uint32_t as[kW4A8Tile][kWords + 1];
  __shared__ std::uint32_t ws[kW4A8Tile][kWords + 1];
  const int tid = threadIdx.x;
  const int tm = tid >> 4, tn = tid & 15;
  const int m0 = blockIdx.y * kW4A8Tile, n0 = blockIdx.x * kW4A8Tile;
  const int m = m0 + tm, n = n0 + tn;
  const bool out_in = m < M && n < N;
  const int groups = K / G;
  const int L = G < kW4A8Kt ? G : kW4A8Kt;
  const float s_a = m < M ? sa[m] : 0.0f;
  const std::uint32_t z = (za && m < M) ? static_cast<std::uint32_t>(za[m]) : 0u;
  // Staging: thread tid loads activation words 2 (tid & 15), + 1 of row tid >> 4
  // and packed weight word tid & 15 (8 values) of channel row tid >> 4.
  const int lr = tid >> 4, lw = tid & 15;
  const bool a_row = m0 + lr < M, w_row = n0 + lr < N;
  const std::int8_t* arow = a + static_cast<I64>(a_row ? m0 + lr : 0) * lda;
  const std::uint8_t* wrow = w + static_cast<I64>(w_row ? n0 + lr : 0) * (K / 2);
  float y = 0.0f;
  std::uint32_t acc = 0;
  // The next chunk's loads are issued before this chunk's math (registers).
  uint2 av = a_row ? __ldg(reinterpret_cast<const uint2*>(arow + 8 * lw)) : make_uint2(0, 0);
  std::uint32_t wp = w_row ? __ldg(reinterpret_cast<const std::uint32_t*>(wrow + 4 * lw)) : 0u;
  for (int k0 = 0; k0 < K; k0 += kW4A8Kt) {
    as[lr][2 * lw] = av.x;
    as[lr][2 * lw + 1] = av.y;
    ws[lr][2 * lw] = s4x4_to_s8x4_fast(wp & 0xffffu);
    ws[lr][2 * lw + 1] = s4x4_to_s8x4_fast(wp >> 16);
    __syncthreads();
    const int k1 = k0 + kW4A8Kt;
    if (k1 < K) {
      av = a_row ? __ldg(reinterpret_cast<const uint2*>(arow + k1 + 8 * lw)) : make_uint2(0, 0);
      wp = w_row ? __ldg(reinterpret_cast<const std::uint32_t*>(wrow + k1 / 2 + 4 * lw)) : 0u;
    }
    for (int c = 0; c < kW4A8Kt; c += L) {
      int dot = 0, wsum = 0;
      for (int j = c / 4; j < (c + L) / 4; ++j) {
        const int wv = static_cast<int>(ws[tn][j]);
        dot = __dp4a(static_cast<int>(as[tm][j]), wv, dot);
        wsum = __dp4a(0x01010101, wv, wsum);
      }
      acc += static_cast<std::uint32_t>(dot) - z * static_cast<std::uint32_t>(wsum);
      const int kend = k0 + c + L;
      if (kend % G == 0) {
        const int gi = kend / G - 1;
        const float term = out_in ? formulas::w4a8_group_term(static_cast<std::int32_t>(acc), s_a,
                                                              sw[static_cast<I64>(n) * groups + gi])
                                  : 0.0f;
        y = gi == 0 ? term : y + term;
        acc = 0;
      }
    }
    __syncthreads();
  }
  if (out_in) out[static_cast<I64>(m) * N + n] = T(bias ? y + bias[n] : y);
}

template <class T>
void w4a8_impl(const Tensor& a, I64 lda, I64 K, const Tensor& sa, const Tensor& za, const Tensor& w, const Tensor& sw,
               I64 G, const Tensor& bias, const Tensor& out) {
  const I64 M = out.shape()[0], N = out.shape()[1];
  if (K % kW4A8Kt == 0 && G % 8 == 0 && (G % kW4A8Kt == 0 || kW4A8Kt % G == 0) && lda % 8 == 0 &&
      (reinterpret_cast<std::uintptr_t>(a.data_ptr()) & 7u) == 0 &&
      (reinterpret_cast<std::uintptr_t>(w.data_ptr()) & 3u) == 0 && K < (I64(1) << 30) && N < (I64(1) << 30) &&
      (M + kW4A8Tile - 1) / kW4A8Tile <= 65535) {
    const dim3 grid(static_cast<unsigned>((N + kW4A8Tile - 1) / kW4A8Tile),
                    static_cast<unsigned>((M + kW4A8Tile - 1) / kW4A8Tile));
    ::qgrad::cuda::launch_kernel(
        out.device().index, w4a8_tile_kernel<T>, grid, kW4A8Tile * kW4A8Tile, 0,
        static_cast<const std::int8_t*>(a.data_ptr()), lda, static_cast<const float*>(sa.data_ptr()),
        za.defined() ? static_cast<const std::int32_t*>(za.data_ptr()) : nullptr,
        static_cast<const std::uint8_t*>(w.data_ptr()), static_cast<const float*>(sw.data_ptr()),
        bias.defined() ? static_cast<const float*>(bias.data_ptr()) : nullptr, static_cast<T*>(out.data_ptr()),
        static_cast<int>(M), static_cast<int>(N), static_cast<int>(K), static_cast<int>(G));
    return;
  }
  constexpr unsigned threads = 256;
  const unsigned blocks = ::qgrad::cuda::blocks_for(M * N * 32, threads);
  const bool vec = G % 8 == 0 && lda % 4 == 0 && (reinterpret_cast<std::uintptr_t>(a.data_ptr()) & 3u) == 0 &&
                   (reinterpret_cast<std::uintptr_t>(w.data_ptr()) & 3u) == 0;
  auto launch = [&](auto kernel) {
    ::qgrad::cuda::launch_kernel(
        out.device().index, kernel, blocks, threads, 0, static_cast<const std::int8_t*>(a.data_ptr()), lda,
        static_cast<const float*>(sa.data_ptr()),
        za.defined() ? static_cast<const std::int32_t*>(za.data_ptr()) : nullptr,
        static_cast<const std::uint8_t*>(w.data_ptr()), static_cast<const float*>(sw.data_ptr()),
        bias.defined() ? static_cast<const float*>(bias.data_ptr()) : nullptr, static_cast<T*>(out.data_ptr()), M, N, K,
        G);
  };
  if (vec) launch(w4a8_group_kernel<T, true>);
  else
    launch(w4a8_group_kernel<T, false>);
}

}  // namespace

void w4a16_linear(const Tensor& x, const Tensor& w, const Tensor& scale, const Tensor& zp, std::int64_t group,
                  const Tensor& bias, const Tensor& out) {
  dispatch_linear_dtype(x.dtype(), "linear_w4a16", [&](auto tag) {
    w4a16_impl<typename decltype(tag)::type>(x, w, scale, zp, group, bias, out);
  });
}

bool w4a16_linear_frag(const Tensor& x, const Tensor& frag, const Tensor& scale, const Tensor& zp, std::int64_t group,
                       const Tensor& bias, const Tensor& out) {
  bool done = false;
  dispatch_linear_dtype(x.dtype(), "linear_w4a16", [&](auto tag) {
    done = w4a16_gemv<typename decltype(tag)::type>(x, frag, scale, zp, group, bias, out, /*fragments=*/true);
  });
  return done;
}

// One thread per 16-byte chunk of the fragment order (formulas::
// w4a16_frag_gather / _scatter: byte accesses, a one-time conversion).
void w4a16_frag_pack(const Tensor& w, const Tensor& frag) {
  const I64 N = w.shape()[0], K = w.shape()[1];
  const auto* src = static_cast<const std::uint8_t*>(w.data_ptr());
  uint4* dst = static_cast<uint4*>(frag.data_ptr());
  const int d = frag.device().index;
  launch_elementwise(d, formulas::w4a16_frag_bytes(N, K) / 16, [=] __device__(I64 c) {
    std::uint32_t word[4];
    formulas::w4a16_frag_gather(src, N, K, c, word);
    dst[c] = make_uint4(word[0], word[1], word[2], word[3]);
  });
  // The GEMVs load a fragment-order weight before they wait for the kernel
  // before them: never let that kernel be the one that wrote it.
  ::qgrad::cuda::launch_kernel(d, settle_kernel, 1, 32, 0);
}

void w4a16_frag_unpack(const Tensor& frag, const Tensor& w) {
  const I64 N = w.shape()[0], K = w.shape()[1];
  const uint4* src = static_cast<const uint4*>(frag.data_ptr());
  auto* dst = static_cast<std::uint8_t*>(w.data_ptr());
  launch_elementwise(w.device().index, formulas::w4a16_frag_bytes(N, K) / 16, [=] __device__(I64 c) {
    const uint4 v = src[c];
    const std::uint32_t word[4] = {v.x, v.y, v.z, v.w};
    formulas::w4a16_frag_scatter(word, N, K, c, dst);
  });
}

void w4a8_linear(const Tensor& a, std::int64_t lda, std::int64_t K, const Tensor& sa, const Tensor& za,
                 const Tensor& w, const Tensor& sw, std::int64_t group, const Tensor& bias, const Tensor& out) {
  dispatch_linear_dtype(out.dtype(), "linear_w4a8", [&](auto tag) {
    w4a8_impl<typename decltype(tag)::type>(a, lda, K, sa, za, w, sw, group, bias, out);
  });
}

void int4_widen(const Tensor& w, const Tensor& w8) {
  const auto* src = static_cast<const std::uint8_t*>(w.data_ptr());
  auto* dst = static_cast<std::int8_t*>(w8.data_ptr());
  const I64 bytes = w.numel() / 2;  // K is even: whole bytes
  const int d = w8.device().index;
  if (bytes % 16 == 0 && aligned16(src) && aligned16(dst)) {
    const uint4* s4 = reinterpret_cast<const uint4*>(src);
    uint4* d4 = reinterpret_cast<uint4*>(dst);
    launch_elementwise(d, bytes / 16, [=] __device__(I64 i) {
      const uint4 v = s4[i];
      const std::uint32_t in[4] = {v.x, v.y, v.z, v.w};
      std::uint32_t o[8];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        o[2 * j] = s4x4_to_s8x4_fast(in[j] & 0xffffu);
        o[2 * j + 1] = s4x4_to_s8x4_fast(in[j] >> 16);
      }
      d4[2 * i] = make_uint4(o[0], o[1], o[2], o[3]);
      d4[2 * i + 1] = make_uint4(o[4], o[5], o[6], o[7]);
    });
  } else {
    launch_elementwise(d, w.numel(), [=] __device__(I64 i) { dst[i] = static_cast<std::int8_t>(nibble_get(src, i, true)); });
  }
}

}  // namespace qgrad::kernels::cuda
