// dev/cuda/packed_attention_mma.cu: packed_attention in f16 and bf16 on the
// tensor cores (issue #13 item 5, the bf16 ViT step). The library's kernels
// (kernels/cuda/attention.cu) run every dtype's products as f32 fused
// multiply-add chains on the CUDA cores: at the ViT's shape (B = 256, L = 49,
// 4 heads of 32) in bf16 the forward takes 6 x 38.3 us and the backward 6 x
// 69.1 us of the step (twenty-first session's profile), where PyTorch's cuDNN
// flash attention takes ~380 us for all twelve. These kernels do the five
// products with mma.sync m16n8k16 (kernels/cuda/mma.cuh), 4 warps a (batch,
// head) pair, warp w owning query rows 16 w ... (and key rows 16 w ... for
// dV and dK).
//
// Their numerics differ from the library's in two ways, which the library
// would take over with them:
//   - P (for O = P v and dV = Pᵀ dO) and dS (for dQ = dS k and dK = dSᵀ q)
//     enter their products rounded to the dtype, as tensor cores (and flash
//     attention) take them; the CPU would round them the same way (a formula
//     M(T(v)) in kernels/formulas/attention.h, applied in kernels/
//     attention.cpp's four products), so that CPU and CUDA differ only in
//     the order of the sums;
//   - the sums inside a product are the tensor cores' (f32 accumulators),
//     not the CPU's chain from index 0: f16 / bf16 agree with the CPU within
//     their rounding, no longer bit for bit.
// This program checks both kernels against a host reference in double that
// applies the same rounding (tolerances: bf16 2e-2, f16 4e-3, relative to
// max(1, |ref|)), with and without a fake quant's mask on dO, over the
// shapes the fit rule admits (every head-dim tile count, odd and 49-long
// sequences, causal or not), then times them against the library's kernels
// at the ViT's shape. Not run yet (written in a session without GPU time):
//   build-gpu/dev/dev_packed_attention_mma
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <vector>

#include "../../bench/bench_common.h"
#include "qgrad/kernels/attention.h"
#include "qgrad/kernels/bitmask.h"
#include "qgrad/kernels/cuda/launch.cuh"
#include "qgrad/kernels/cuda/mma.cuh"
#include "qgrad/kernels/cuda/warp_rows.cuh"
#include "qgrad/kernels/formulas/attention.h"

using namespace qgrad;
using qgrad::kernels::PackedAttention;
using qgrad::kernels::kPackedAttentionMaxLength;
using qgrad::kernels::kPackedAttentionMaxSmem;

namespace qgrad::kernels::cuda {
namespace {

// ---- packed_attention in f16 and bf16: the products on the tensor cores
// (mma.sync m16n8k16 with f32 accumulators, kernels/cuda/mma.cuh), a block
// of 4 warps per (batch, head) pair, warp w owning query rows 16 w ... 16 w +
// 15, and for dV and dK key rows 16 w ... . The pair's operands sit in shared
// memory as 16-bit words, the sequence and the head dim padded with zeros to
// multiples of 16 (logits of padded keys are -inf); arrays a product reads
// along the sequence are stored transposed as well, so that every fragment is
// 32-bit loads. Probabilities and logit gradients enter their products
// rounded to the dtype (formulas::packed_operand, the CPU's rule too); the
// sums inside a product are the tensor cores', not the CPU's chain of fused
// multiply-adds, so these dtypes agree with the CPU within their rounding,
// not bit for bit (docs/ops.md). A row's max and exp-sum: each lane its
// columns in order, then the quad's four lanes by butterfly. The backward
// recomputes the logits with the forward's own instructions: the same bits. ----
constexpr int kMmaWarps = static_cast<int>(kPackedAttentionMaxLength) / 16;
constexpr int kMmaThreads = 32 * kMmaWarps;
constexpr int kMmaKeyTiles = static_cast<int>(kPackedAttentionMaxLength) / 8;  // n8 tiles of a logits row
// Pitch of a [.][sequence] array and of a [.][head dim] one, in 16-bit words:
// 8 past the data, so the 8 rows a fragment load touches fall on 8 bank groups.
constexpr int kMmaSeqPitch = static_cast<int>(kPackedAttentionMaxLength) + 8;
template <int kDT>
constexpr int mma_dim_pitch() {
  return 16 * kDT + 8;
}
// Shared words of the forward (q, k [64][dim pitch], vᵀ [16 kDT][seq pitch])
// and of the backward (q, k, v, dO and their transposes but v's, Pᵀ and dSᵀ).
template <int kDT>
constexpr std::size_t mma_forward_words() {
  return 2 * 64 * mma_dim_pitch<kDT>() + 16 * kDT * kMmaSeqPitch;
}
template <int kDT>
constexpr std::size_t mma_backward_words() {
  return 4 * 64 * mma_dim_pitch<kDT>() + 3 * 16 * kDT * kMmaSeqPitch + 2 * 64 * kMmaSeqPitch;
}

__device__ __forceinline__ std::uint32_t word_pair(const std::uint16_t* p) {
  return *reinterpret_cast<const std::uint32_t*>(p);
}
// The A fragment of rows r0 ..., columns c0 ... of a row-major array (pitch ld).
__device__ __forceinline__ void mma_load_a(const std::uint16_t* s, int ld, int r0, int c0, std::uint32_t (&a)[4]) {
  const int g = (threadIdx.x % 32) / 4, t = threadIdx.x % 4;
  const std::uint16_t* p = s + (r0 + g) * ld + c0 + 2 * t;
  a[0] = word_pair(p);
  a[1] = word_pair(p + 8 * ld);
  a[2] = word_pair(p + 8);
  a[3] = word_pair(p + 8 * ld + 8);
}
// The B fragment (k x n = 16 x 8) at k0, n0 of an operand stored [n][k] (pitch ld).
__device__ __forceinline__ void mma_load_b(const std::uint16_t* s, int ld, int n0, int k0, std::uint32_t& b0,
                                           std::uint32_t& b1) {
  const int g = (threadIdx.x % 32) / 4, t = threadIdx.x % 4;
  const std::uint16_t* p = s + (n0 + g) * ld + k0 + 2 * t;
  b0 = word_pair(p);
  b1 = word_pair(p + 8);
}
// Row and column of accumulator element c of n8 tile nt (rows from r0).
__device__ __forceinline__ int mma_row(int r0, int c) { return r0 + (threadIdx.x % 32) / 4 + 8 * (c >> 1); }
__device__ __forceinline__ int mma_col(int nt, int c) {
  return 8 * nt + 2 * static_cast<int>(threadIdx.x % 4) + (c & 1);
}

// acc[nt] (nt < tiles) = x rows r0 ... (A, row major, kKT k16 steps) times
// the operand stored [n][k].
template <class T, int kKT, int kTiles>
__device__ __forceinline__ void mma_rows(float (&acc)[kTiles][4], int tiles, const std::uint16_t* x, int ldx, int r0,
                                         int kt_count, const std::uint16_t* y, int ldy) {
  std::uint32_t a[kKT][4];
#pragma unroll
  for (int ks = 0; ks < kKT; ++ks)
    if (ks < kt_count) mma_load_a(x, ldx, r0, 16 * ks, a[ks]);
#pragma unroll
  for (int nt = 0; nt < kTiles; ++nt) {
#pragma unroll
    for (int c = 0; c < 4; ++c) acc[nt][c] = 0.f;
    if (nt >= tiles) continue;
#pragma unroll
    for (int ks = 0; ks < kKT; ++ks) {
      if (ks >= kt_count) break;
      std::uint32_t b0, b1;
      mma_load_b(y, ldy, 8 * nt, 16 * ks, b0, b1);
      Mma<T>::run(acc[nt], a[ks][0], a[ks][1], a[ks][2], a[ks][3], b0, b1);
    }
  }
}
// acc[nt] (nt < tiles) = the warp's 16 rows of a row-major operand held in
// registers as logits-shaped accumulators (k16 step kt from tiles 2 kt, 2 kt
// + 1, packed to T), times the operand stored [n][k], over kt < kt_count.
template <class T, int kTiles>
__device__ __forceinline__ void mma_registers(float (&acc)[kTiles][4], int tiles, const float (&x)[kMmaKeyTiles][4],
                                              int kt_count, const std::uint16_t* y, int ldy) {
  std::uint32_t a[kMmaKeyTiles / 2][4];
#pragma unroll
  for (int kt = 0; kt < kMmaKeyTiles / 2; ++kt) {
    a[kt][0] = Mma<T>::pack(x[2 * kt][0], x[2 * kt][1]);
    a[kt][1] = Mma<T>::pack(x[2 * kt][2], x[2 * kt][3]);
    a[kt][2] = Mma<T>::pack(x[2 * kt + 1][0], x[2 * kt + 1][1]);
    a[kt][3] = Mma<T>::pack(x[2 * kt + 1][2], x[2 * kt + 1][3]);
  }
#pragma unroll
  for (int nt = 0; nt < kTiles; ++nt) {
#pragma unroll
    for (int c = 0; c < 4; ++c) acc[nt][c] = 0.f;
    if (nt >= tiles) continue;
#pragma unroll
    for (int kt = 0; kt < kMmaKeyTiles / 2; ++kt) {
      if (kt >= kt_count) break;
      std::uint32_t b0, b1;
      mma_load_b(y, ldy, 8 * nt, 16 * kt, b0, b1);
      Mma<T>::run(acc[nt], a[kt][0], a[kt][1], a[kt][2], a[kt][3], b0, b1);
    }
  }
}

// The quad's (one row's four lanes') butterfly max and sum.
__device__ __forceinline__ float quad_max(float v) {
  v = formulas::max_nan(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return formulas::max_nan(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// The logits of the warp's 16 query rows from r0 (-inf past the sequence and
// where the causal mask hides a key).
template <class T, int kDT>
__device__ __forceinline__ void mma_logits(float (&z)[kMmaKeyTiles][4], const std::uint16_t* q, const std::uint16_t* k,
                                           int r0, int key_tiles, const PackedAttention& a) {
  mma_rows<T, kDT>(z, key_tiles, q, mma_dim_pitch<kDT>(), r0, kDT, k, mma_dim_pitch<kDT>());
  const float scale = static_cast<float>(a.scale);
#pragma unroll
  for (int nt = 0; nt < kMmaKeyTiles; ++nt)
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int j = mma_col(nt, c);
      z[nt][c] = j < a.L ? formulas::packed_logit(z[nt][c], scale, a.causal, mma_row(r0, c), j)
                         : -std::numeric_limits<float>::infinity();
    }
}

// The pair's rows i < Lq (L rounded up to 16) and head-dim columns d < 16 kDT
// of q, k, v (zero past L and the head dim): f(i, d, q, k, v) as 16-bit words.
template <class T, int kDT, class F>
__device__ __forceinline__ void mma_load_pair(const T* qkv, const PackedAttention& a, std::int64_t n, std::int64_t h,
                                              int Lq, F f) {
  constexpr int Dp = 16 * kDT;
  const std::int64_t W = a.width();
  for (int idx = static_cast<int>(threadIdx.x); idx < Lq * Dp; idx += kMmaThreads) {
    const int i = idx / Dp, d = idx % Dp;
    if (i < a.L && d < a.head_dim) {
      const T* src = qkv + (n * a.L + i) * 3 * W + h * a.head_dim + d;
      f(i, d, src[0].bits, src[W].bits, src[2 * W].bits, (n * a.L + i) * W + h * a.head_dim + d);
    } else {
      f(i, d, std::uint16_t{0}, std::uint16_t{0}, std::uint16_t{0}, std::int64_t{-1});
    }
  }
}

template <class T, int kDT>
__global__ void __launch_bounds__(kMmaThreads)
    packed_attention_forward_mma_kernel(const T* qkv, T* out, float* row_max, float* row_sum, PackedAttention a) {
  ::qgrad::cuda::wait_for_prior_kernels();
  extern __shared__ __align__(16) unsigned char packed_smem[];
  constexpr int ld = mma_dim_pitch<kDT>();
  auto* q = reinterpret_cast<std::uint16_t*>(packed_smem);
  std::uint16_t* k = q + 64 * ld;
  std::uint16_t* vt = k + 64 * ld;
  const std::int64_t n = blockIdx.x / a.heads, h = blockIdx.x % a.heads, W = a.width();
  const int L = static_cast<int>(a.L), Lq = (L + 15) / 16 * 16;
  mma_load_pair<T, kDT>(qkv, a, n, h, Lq, [&](int i, int d, std::uint16_t qv, std::uint16_t kv, std::uint16_t vv,
                                              std::int64_t) {
    q[i * ld + d] = qv;
    k[i * ld + d] = kv;
    vt[d * kMmaSeqPitch + i] = vv;
  });
  __syncthreads();
  const int r0 = 16 * static_cast<int>(threadIdx.x / 32);
  if (r0 >= Lq) return;
  float z[kMmaKeyTiles][4];
  mma_logits<T, kDT>(z, q, k, r0, Lq / 8, a);
  float mx[2] = {-std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()};
#pragma unroll
  for (int nt = 0; nt < kMmaKeyTiles; ++nt)
#pragma unroll
    for (int c = 0; c < 4; ++c) mx[c >> 1] = formulas::max_nan(mx[c >> 1], z[nt][c]);
  float sum[2] = {0.f, 0.f};
#pragma unroll
  for (int r = 0; r < 2; ++r) mx[r] = quad_max(mx[r]);
#pragma unroll
  for (int nt = 0; nt < kMmaKeyTiles; ++nt)
#pragma unroll
    for (int c = 0; c < 4; ++c)
      if (mma_col(nt, c) < L) sum[c >> 1] += formulas::exp_m(z[nt][c] - mx[c >> 1]);
#pragma unroll
  for (int r = 0; r < 2; ++r) sum[r] = quad_sum(sum[r]);
#pragma unroll
  for (int nt = 0; nt < kMmaKeyTiles; ++nt)
#pragma unroll
    for (int c = 0; c < 4; ++c) z[nt][c] = formulas::attention_prob(z[nt][c], mx[c >> 1], sum[c >> 1]);
  if (threadIdx.x % 4 == 0)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int i = mma_row(r0, 2 * r);
      if (i < L) {
        row_max[(n * a.heads + h) * a.L + i] = mx[r];
        row_sum[(n * a.heads + h) * a.L + i] = sum[r];
      }
    }
  float o[2 * kDT][4];  // O = P v over the key tiles
  mma_registers<T>(o, 2 * kDT, z, Lq / 16, vt, kMmaSeqPitch);
#pragma unroll
  for (int nt = 0; nt < 2 * kDT; ++nt)
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int i = mma_row(r0, c), d = mma_col(nt, c);
      if (i < L && d < a.head_dim) out[(n * a.L + i) * W + h * a.head_dim + d] = T(o[nt][c]);
    }
}

template <class T, int kDT>
__global__ void __launch_bounds__(kMmaThreads)
    packed_attention_backward_mma_kernel(const T* qkv, const T* dout, const std::uint32_t* dout_mask,
                                         const float* row_max, const float* row_sum, T* dqkv, PackedAttention a) {
  ::qgrad::cuda::wait_for_prior_kernels();
  extern __shared__ __align__(16) unsigned char packed_smem[];
  constexpr int ld = mma_dim_pitch<kDT>(), Dp = 16 * kDT;
  auto* q = reinterpret_cast<std::uint16_t*>(packed_smem);
  std::uint16_t *k = q + 64 * ld, *v = k + 64 * ld, *g = v + 64 * ld;
  std::uint16_t *qt = g + 64 * ld, *kt = qt + Dp * kMmaSeqPitch, *gt = kt + Dp * kMmaSeqPitch;
  std::uint16_t *pt = gt + Dp * kMmaSeqPitch, *dst = pt + 64 * kMmaSeqPitch;
  const std::int64_t n = blockIdx.x / a.heads, h = blockIdx.x % a.heads, W = a.width();
  const int L = static_cast<int>(a.L), Lq = (L + 15) / 16 * 16;
  mma_load_pair<T, kDT>(qkv, a, n, h, Lq, [&](int i, int d, std::uint16_t qv, std::uint16_t kv, std::uint16_t vv,
                                              std::int64_t at) {
    const std::uint16_t gv = at < 0 ? std::uint16_t{0} : T(formulas::masked_grad(dout, dout_mask, at)).bits;
    q[i * ld + d] = qv;
    k[i * ld + d] = kv;
    v[i * ld + d] = vv;
    g[i * ld + d] = gv;
    qt[d * kMmaSeqPitch + i] = qv;
    kt[d * kMmaSeqPitch + i] = kv;
    gt[d * kMmaSeqPitch + i] = gv;
  });
  __syncthreads();
  const int r0 = 16 * static_cast<int>(threadIdx.x / 32);
  const bool active = r0 < Lq;
  T* base = dqkv + n * a.L * 3 * W + h * a.head_dim;  // row 0 of this pair's q part
  const float scale = static_cast<float>(a.scale);
  if (active) {
    float p[kMmaKeyTiles][4];  // P from the logits and the saved statistics (0 past the sequence)
    mma_logits<T, kDT>(p, q, k, r0, Lq / 8, a);
    float mx[2], sum[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int i = min(mma_row(r0, 2 * r), L - 1);
      mx[r] = row_max[(n * a.heads + h) * a.L + i];
      sum[r] = row_sum[(n * a.heads + h) * a.L + i];
    }
#pragma unroll
    for (int nt = 0; nt < kMmaKeyTiles; ++nt)
#pragma unroll
      for (int c = 0; c < 4; ++c)
        p[nt][c] = mma_row(r0, c) < L ? formulas::attention_prob(p[nt][c], mx[c >> 1], sum[c >> 1]) : 0.f;
    float dp[kMmaKeyTiles][4];  // dP = dO vᵀ
    mma_rows<T, kDT>(dp, Lq / 8, g, ld, r0, kDT, v, ld);
    float dot[2] = {0.f, 0.f};
#pragma unroll
    for (int nt = 0; nt < kMmaKeyTiles; ++nt)
#pragma unroll
      for (int c = 0; c < 4; ++c)
        if (mma_col(nt, c) < L) dot[c >> 1] += dp[nt][c] * p[nt][c];
#pragma unroll
    for (int r = 0; r < 2; ++r) dot[r] = quad_sum(dot[r]);
#pragma unroll
    for (int nt = 0; nt < kMmaKeyTiles; ++nt)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int i = mma_row(r0, c), j = mma_col(nt, c);
        dp[nt][c] = formulas::packed_logit_grad(p[nt][c], dp[nt][c], dot[c >> 1], scale);  // dS
        if (j < Lq) {
          pt[j * kMmaSeqPitch + i] = T(p[nt][c]).bits;
          dst[j * kMmaSeqPitch + i] = T(dp[nt][c]).bits;
        }
      }
    float dq[2 * kDT][4];  // dQ = dS k
    mma_registers<T>(dq, 2 * kDT, dp, Lq / 16, kt, kMmaSeqPitch);
#pragma unroll
    for (int nt = 0; nt < 2 * kDT; ++nt)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int i = mma_row(r0, c), d = mma_col(nt, c);
        if (i < L && d < a.head_dim) base[i * 3 * W + d] = T(dq[nt][c]);
      }
  }
  __syncthreads();
  if (!active) return;
  float acc[2 * kDT][4];  // dV = Pᵀ dO, then dK = dSᵀ q, for key rows r0 ...
  mma_rows<T, kMmaKeyTiles / 2>(acc, 2 * kDT, pt, kMmaSeqPitch, r0, Lq / 16, gt, kMmaSeqPitch);
#pragma unroll
  for (int nt = 0; nt < 2 * kDT; ++nt)
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int j = mma_row(r0, c), d = mma_col(nt, c);
      if (j < L && d < a.head_dim) base[j * 3 * W + 2 * W + d] = T(acc[nt][c]);
    }
  mma_rows<T, kMmaKeyTiles / 2>(acc, 2 * kDT, dst, kMmaSeqPitch, r0, Lq / 16, qt, kMmaSeqPitch);
#pragma unroll
  for (int nt = 0; nt < 2 * kDT; ++nt)
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int j = mma_row(r0, c), d = mma_col(nt, c);
      if (j < L && d < a.head_dim) base[j * 3 * W + W + d] = T(acc[nt][c]);
    }
}


// The launches (the library's would dispatch f16 / bf16 here).
template <class F>
void with_head_tiles(std::int64_t head_dim, F f) {
  switch ((head_dim + 15) / 16) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 3: f(std::integral_constant<int, 3>{}); break;
    default: f(std::integral_constant<int, 4>{}); break;
  }
}

template <class T>
void mma_forward(const Tensor& qkv, const Tensor& out, const Tensor& row_max, const Tensor& row_sum,
                 const PackedAttention& a) {
  const int dev = out.device().index;
  with_head_tiles(a.head_dim, [&](auto dh) {
    constexpr int kDT = decltype(dh)::value;
    constexpr auto kernel = packed_attention_forward_mma_kernel<T, kDT>;
    constexpr std::size_t smem = mma_forward_words<kDT>() * sizeof(std::uint16_t);
    static_assert(smem <= kPackedAttentionMaxSmem);
    allow_dynamic_smem<kernel>(dev, static_cast<int>(kPackedAttentionMaxSmem));
    ::qgrad::cuda::launch_kernel(dev, kernel, static_cast<unsigned>(a.batch * a.heads), kMmaThreads, smem,
                                 static_cast<const T*>(qkv.data_ptr()), static_cast<T*>(out.data_ptr()),
                                 static_cast<float*>(row_max.data_ptr()), static_cast<float*>(row_sum.data_ptr()), a);
  });
}

template <class T>
void mma_backward(const Tensor& qkv, const Tensor& dout, const Tensor& row_max, const Tensor& row_sum,
                  const Tensor& dqkv, const PackedAttention& a, const std::uint32_t* dout_mask) {
  const int dev = dqkv.device().index;
  with_head_tiles(a.head_dim, [&](auto dh) {
    constexpr int kDT = decltype(dh)::value;
    constexpr auto kernel = packed_attention_backward_mma_kernel<T, kDT>;
    constexpr std::size_t smem = mma_backward_words<kDT>() * sizeof(std::uint16_t);
    static_assert(smem <= kPackedAttentionMaxSmem);
    allow_dynamic_smem<kernel>(dev, static_cast<int>(kPackedAttentionMaxSmem));
    ::qgrad::cuda::launch_kernel(dev, kernel, static_cast<unsigned>(a.batch * a.heads), kMmaThreads, smem,
                                 static_cast<const T*>(qkv.data_ptr()), static_cast<const T*>(dout.data_ptr()),
                                 dout_mask, static_cast<const float*>(row_max.data_ptr()),
                                 static_cast<const float*>(row_sum.data_ptr()), static_cast<T*>(dqkv.data_ptr()), a);
  });
}

}  // namespace
}  // namespace qgrad::kernels::cuda

namespace {

// The host reference of one dtype T, in double: the logits from the inputs'
// values, the softmax, and the four products with P and dS rounded to T.
template <class T>
struct Reference {
  std::vector<double> out, dqkv;
};
template <class T>
Reference<T> reference(const std::vector<double>& qkv, const std::vector<double>& dy, const std::vector<bool>& keep,
                       const PackedAttention& a) {
  const std::int64_t L = a.L, Dh = a.head_dim, W = a.width();
  auto round = [](double v) { return static_cast<double>(static_cast<float>(T(static_cast<float>(v)))); };
  auto idx = [](std::int64_t i) { return static_cast<std::size_t>(i); };
  Reference<T> r;
  r.out.assign(idx(a.batch * L * W), 0.0);
  r.dqkv.assign(qkv.size(), 0.0);
  for (std::int64_t n = 0; n < a.batch; ++n)
    for (std::int64_t h = 0; h < a.heads; ++h) {
      // Element d of row i of q (part 0), k (1) or v (2); of the output; of the gradient dO.
      auto in_at = [&](std::int64_t i, int part, std::int64_t d) {
        return idx((n * L + i) * 3 * W + part * W + h * Dh + d);
      };
      auto out_at = [&](std::int64_t i, std::int64_t d) { return idx((n * L + i) * W + h * Dh + d); };
      auto x = [&](std::int64_t i, int part, std::int64_t d) { return qkv[in_at(i, part, d)]; };
      auto g = [&](std::int64_t i, std::int64_t d) { return keep[out_at(i, d)] ? dy[out_at(i, d)] : 0.0; };
      std::vector<double> p(idx(L * L)), ds(p.size());
      auto pij = [&](std::int64_t i, std::int64_t j) -> double& { return p[idx(i * L + j)]; };
      auto dsij = [&](std::int64_t i, std::int64_t j) -> double& { return ds[idx(i * L + j)]; };
      for (std::int64_t i = 0; i < L; ++i) {
        double mx = -INFINITY;
        for (std::int64_t j = 0; j < L; ++j) {
          double s = 0;
          for (std::int64_t d = 0; d < Dh; ++d) s += x(i, 0, d) * x(j, 1, d);
          pij(i, j) = a.causal && j > i ? -INFINITY : s * a.scale;
          mx = std::max(mx, pij(i, j));
        }
        double sum = 0;
        for (std::int64_t j = 0; j < L; ++j) sum += std::exp(pij(i, j) - mx);
        for (std::int64_t j = 0; j < L; ++j) pij(i, j) = std::exp(pij(i, j) - mx) / sum;
      }
      for (std::int64_t i = 0; i < L; ++i)
        for (std::int64_t d = 0; d < Dh; ++d) {
          double o = 0;
          for (std::int64_t j = 0; j < L; ++j) o += round(pij(i, j)) * x(j, 2, d);
          r.out[out_at(i, d)] = o;
        }
      for (std::int64_t i = 0; i < L; ++i) {
        std::vector<double> dp(idx(L));
        double dot = 0;
        for (std::int64_t j = 0; j < L; ++j) {
          double v = 0;
          for (std::int64_t d = 0; d < Dh; ++d) v += g(i, d) * x(j, 2, d);
          dp[idx(j)] = v;
          dot += v * pij(i, j);
        }
        for (std::int64_t j = 0; j < L; ++j) dsij(i, j) = pij(i, j) * (dp[idx(j)] - dot) * a.scale;
      }
      for (std::int64_t i = 0; i < L; ++i)
        for (std::int64_t d = 0; d < Dh; ++d) {
          double dq = 0, dk = 0, dv = 0;
          for (std::int64_t j = 0; j < L; ++j) {
            dq += round(dsij(i, j)) * x(j, 1, d);
            dk += round(dsij(j, i)) * x(j, 0, d);
            dv += round(pij(j, i)) * g(j, d);
          }
          r.dqkv[in_at(i, 0, d)] = dq;
          r.dqkv[in_at(i, 1, d)] = dk;
          r.dqkv[in_at(i, 2, d)] = dv;
        }
    }
  return r;
}

// The worst |got - want| / max(1, |want|).
double worst(const std::vector<double>& got, const std::vector<double>& want) {
  double w = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double e = std::fabs(got[i] - want[i]) / std::max(1.0, std::fabs(want[i]));
    w = std::isnan(e) ? INFINITY : std::max(w, e);
  }
  return w;
}

std::vector<double> host_values(const Tensor& t) { return t.to(DType::f64).cpu().to_vector<double>(); }

template <class T>
bool check_case(DType dt, const PackedAttention& a, bool masked, std::uint64_t seed) {
  const TensorOptions on = TensorOptions{}.with_dtype(dt).with_device(Device::cuda());
  const TensorOptions stats = TensorOptions{}.with_dtype(DType::f32).with_device(Device::cuda());
  Generator g(seed);
  const std::int64_t W = a.width();
  Tensor qkv = randn({a.batch, a.L, 3 * W}, g, on), dy = randn({a.batch, a.L, W}, g, on);
  const std::int64_t outs = a.batch * a.L * W;
  // A mask with about one bit in eight clear (the fake quant's clipped elements).
  std::vector<std::uint32_t> words(static_cast<std::size_t>(bitmask_words(outs)), 0u);
  std::vector<bool> keep(static_cast<std::size_t>(outs), true);
  for (std::int64_t i = 0; i < outs; ++i) {
    keep[static_cast<std::size_t>(i)] = !masked || (static_cast<std::uint64_t>(i) * 2654435761u + seed) % 8 != 0;
    bitmask_set(words.data(), i, keep[static_cast<std::size_t>(i)]);
  }
  Tensor mask = Tensor::from_vector(std::vector<std::int32_t>(words.begin(), words.end()),
                                    {static_cast<std::int64_t>(words.size())})
                    .to(Device::cuda());
  const auto* mask_words = masked ? static_cast<const std::uint32_t*>(mask.data_ptr()) : nullptr;
  Tensor out = full({a.batch, a.L, W}, std::nan(""), on), dqkv = full(qkv.shape(), std::nan(""), on);
  Tensor row_max = Tensor::empty({a.batch, a.heads, a.L}, stats);
  Tensor row_sum = Tensor::empty({a.batch, a.heads, a.L}, stats);
  kernels::cuda::mma_forward<T>(qkv, out, row_max, row_sum, a);
  kernels::cuda::mma_backward<T>(qkv, dy, row_max, row_sum, dqkv, a, mask_words);
  // The library's kernels on the same inputs (f32 chains, P and dS unrounded).
  Tensor lib_out = Tensor::empty(out.shape(), on), lib_dqkv = Tensor::empty(qkv.shape(), on);
  Tensor lib_max = Tensor::empty(row_max.shape(), stats), lib_sum = Tensor::empty(row_sum.shape(), stats);
  kernels::packed_attention_forward(qkv, lib_out, lib_max, lib_sum, a);
  kernels::packed_attention_backward(qkv, dy, lib_max, lib_sum, lib_dqkv, a, mask_words);
  const Reference<T> ref = reference<T>(host_values(qkv), host_values(dy), keep, a);
  const double tol = dt == DType::bf16 ? 2e-2 : 4e-3;
  const double eo = worst(host_values(out), ref.out), eg = worst(host_values(dqkv), ref.dqkv);
  const double lo = worst(host_values(lib_out), ref.out), lg = worst(host_values(lib_dqkv), ref.dqkv);
  const bool ok = eo <= tol && eg <= tol;
  std::printf("%-4s B %3lld L %2lld heads %lld Dh %2lld causal %d mask %d: mma out %.2e dqkv %.2e | library %.2e %.2e "
              "(tolerance %.0e) %s\n",
              dtype_name(dt), static_cast<long long>(a.batch), static_cast<long long>(a.L),
              static_cast<long long>(a.heads), static_cast<long long>(a.head_dim), a.causal, masked, eo, eg, lo, lg,
              tol, ok ? "ok" : "FAILED");
  return ok;
}

}  // namespace

int main() {
  if (cuda_device_count() == 0) {
    std::printf("dev_packed_attention_mma: no CUDA device\n");
    return 0;
  }
  struct Case {
    std::int64_t B, L, W, H;
    bool causal;
  };
  const Case cases[] = {{2, 5, 12, 3, true},  {8, 49, 128, 4, false}, {2, 49, 64, 2, true}, {1, 64, 64, 2, false},
                        {2, 40, 128, 2, true}, {2, 17, 96, 2, true},  {2, 1, 8, 2, false},  {3, 33, 48, 1, false}};
  bool ok = true;
  std::uint64_t seed = 1;
  for (const Case& c : cases)
    for (const bool masked : {false, true}) {
      const PackedAttention a{.batch = c.B, .L = c.L, .heads = c.H, .head_dim = c.W / c.H,
                              .scale = 1.0 / std::sqrt(static_cast<double>(c.W / c.H)), .causal = c.causal};
      if (!kernels::packed_attention_fits(a.L, a.head_dim, DType::bf16)) continue;
      ok = check_case<qgrad::bfloat16>(DType::bf16, a, masked, seed++) && ok;
      ok = check_case<qgrad::half>(DType::f16, a, masked, seed++) && ok;
    }
  // The ViT's shape: the library's kernels against these, forward and backward, bf16.
  const PackedAttention a{.batch = 256, .L = 49, .heads = 4, .head_dim = 32, .scale = 1.0 / std::sqrt(32.0)};
  const TensorOptions on = TensorOptions{}.with_dtype(DType::bf16).with_device(Device::cuda());
  const TensorOptions stats = TensorOptions{}.with_dtype(DType::f32).with_device(Device::cuda());
  Generator g(99);
  Tensor qkv = randn({256, 49, 384}, g, on), dy = randn({256, 49, 128}, g, on);
  Tensor out = Tensor::empty({256, 49, 128}, on), dqkv = Tensor::empty(qkv.shape(), on);
  Tensor row_max = Tensor::empty({256, 4, 49}, stats), row_sum = Tensor::empty({256, 4, 49}, stats);
  // Ten calls a timing (median of 30), us a call.
  auto us = [](const std::function<void()>& call) {
    return bench::time_cuda([&](int) { for (int i = 0; i < 10; ++i) call(); }, 30, 3).median_ms * 100.0;
  };
  for (int round = 0; round < 2; ++round) {
    const double lf = us([&] { kernels::packed_attention_forward(qkv, out, row_max, row_sum, a); });
    const double lb = us([&] { kernels::packed_attention_backward(qkv, dy, row_max, row_sum, dqkv, a); });
    const double mf = us([&] { kernels::cuda::mma_forward<qgrad::bfloat16>(qkv, out, row_max, row_sum, a); });
    const double mb =
        us([&] { kernels::cuda::mma_backward<qgrad::bfloat16>(qkv, dy, row_max, row_sum, dqkv, a, nullptr); });
    std::printf("round %d, ViT shape, bf16, us a call (median of 30 x 10): library forward %.2f backward %.2f | mma "
                "forward %.2f backward %.2f\n",
                round, lf, lb, mf, mb);
  }
  std::printf("%s\n", ok ? "all cases within tolerance" : "SOME CASES FAILED");
  return ok ? 0 : 1;
}
