// scaled_dot_product_attention's fused row kernels on CUDA, one warp per row:
// lane l handles columns l, l + 32, ... ; the row max by butterfly, the sums
// in formulas::lane_sum's order (warp_lane_sum), so a row gives the CPU's
// bits wherever exp does. The element formulas are kernels/formulas/attention.h.
#include <mutex>
#include <type_traits>

#include "qgrad/kernels/cuda/entries.h"
#include "qgrad/kernels/cuda/launch.cuh"
#include "qgrad/kernels/cuda/warp_rows.cuh"
#include "qgrad/kernels/formulas/attention.h"

namespace qgrad::kernels::cuda {

namespace {

template <class T, class MaskT>
void softmax_impl(const Tensor& scores, const Tensor& mask, const Tensor& probs, const Tensor& attn,
                  const AttentionRows& a) {
  using M = op_math_t<T>;
  const T* s = static_cast<const T*>(scores.data_ptr());
  const MaskT* mk = mask.defined() ? static_cast<const MaskT*>(mask.data_ptr()) : nullptr;
  T* pp = static_cast<T*>(probs.data_ptr());
  T* pa = attn.defined() ? static_cast<T*>(attn.data_ptr()) : nullptr;
  const M scale_d = M(a.p < 1.0 ? 1.0 / (1.0 - a.p) : 0.0);
  launch_warp_rows(probs.device().index, a.rows, [=] __device__(std::int64_t r, int lane) {
    const std::int64_t mrow = mk != nullptr ? a.mask_row(r) : 0;
    M m = -std::numeric_limits<M>::infinity();
    for (std::int64_t j = lane; j < a.S; j += 32) m = formulas::max_nan(m, formulas::attention_logit<T, MaskT>(a, s, mk, mrow, r, j));
    const M mx = warp_max(m);
    M part = M(0);
    for (std::int64_t j = lane; j < a.S; j += 32)
      part += formulas::exp_m(formulas::attention_logit<T, MaskT>(a, s, mk, mrow, r, j) - mx);
    const M sum = warp_lane_sum(part);
    for (std::int64_t j = lane; j < a.S; j += 32) {
      const T p = T(formulas::attention_prob(formulas::attention_logit<T, MaskT>(a, s, mk, mrow, r, j), mx, sum));
      pp[r * a.S + j] = p;
      if (pa != nullptr) pa[r * a.S + j] = T(formulas::attention_drop(a, r * a.S + j, M(p), scale_d));
    }
  });
}

template <class T>
void softmax_backward_impl(const Tensor& probs, const Tensor& dattn, const Tensor& dscores, const Tensor& dlogits,
                           const AttentionRows& a) {
  using M = op_math_t<T>;
  const T* p = static_cast<const T*>(probs.data_ptr());
  const T* da = static_cast<const T*>(dattn.data_ptr());
  T* ds = static_cast<T*>(dscores.data_ptr());
  T* dz = dlogits.defined() ? static_cast<T*>(dlogits.data_ptr()) : nullptr;
  const M scale_d = M(a.p < 1.0 ? 1.0 / (1.0 - a.p) : 0.0), scale = M(a.scale);
  launch_warp_rows(probs.device().index, a.rows, [=] __device__(std::int64_t r, int lane) {
    const std::int64_t b = r * a.S;
    M part = M(0);
    for (std::int64_t j = lane; j < a.S; j += 32)
      part += formulas::attention_drop(a, b + j, M(da[b + j]), scale_d) * M(p[b + j]);
    const M dot = warp_lane_sum(part);
    for (std::int64_t j = lane; j < a.S; j += 32) {
      const M g = M(p[b + j]) * (formulas::attention_drop(a, b + j, M(da[b + j]), scale_d) - dot);
      ds[b + j] = T(g * scale);
      if (dz != nullptr) dz[b + j] = T(g);
    }
  });
}

template <class T>
void dropout_impl(const Tensor& probs, const Tensor& attn, const AttentionRows& a) {
  using M = op_math_t<T>;
  const T* p = static_cast<const T*>(probs.data_ptr());
  T* o = static_cast<T*>(attn.data_ptr());
  const M scale_d = M(a.p < 1.0 ? 1.0 / (1.0 - a.p) : 0.0);
  launch_elementwise(probs.device().index, probs.numel(), [=] __device__(std::int64_t i) {
    o[i] = T(formulas::attention_drop(a, i, M(p[i]), scale_d));
  });
}

// ---- packed_attention: a block of 16 x 16 threads per (batch, head) pair.
// Thread (ty, tx) owns a 4 x 4 tile of every [64 x 64] product: rows
// ty + 16 a, columns tx + 16 c (a, c < 4), each output summed over its
// reduction index from 0 upward, as the CPU loop (kernels/attention.cpp);
// the rows' softmax and dp . p a warp per row in lane_sum's order. ----
constexpr int kPackedSide = 16;
constexpr int kPackedThreads = kPackedSide * kPackedSide;
constexpr int kPackedTile = 4;  // kPackedSide * kPackedTile == kPackedAttentionMaxLength

// acc[a][c] = sum over r < n of x(row a, r) * y(r, column c), rows ty + 16 a
// of x and columns tx + 16 c (c < kCols: 4 for the L x L products, the head
// dim's ceil(Dh / 16) for the L x Dh ones) of y clamped to the last valid one
// (their results are never stored), r from 0 upward. Element (row, r) of x
// at x[row * x_row + r * x_r] (same for y with (r, column)).
template <int kCols, class M>
__device__ __forceinline__ void tile_product(M (&acc)[kPackedTile][kCols], const M* x, int x_row, int x_r, int rows,
                                             const M* y, int y_r, int y_col, int cols, int n) {
  const int ty = threadIdx.x / kPackedSide, tx = threadIdx.x % kPackedSide;
  int xr[kPackedTile], yc[kCols];
#pragma unroll
  for (int t = 0; t < kPackedTile; ++t) xr[t] = min(ty + kPackedSide * t, rows - 1) * x_row;
#pragma unroll
  for (int t = 0; t < kCols; ++t) yc[t] = min(tx + kPackedSide * t, cols - 1) * y_col;
#pragma unroll
  for (int a = 0; a < kPackedTile; ++a)
#pragma unroll
    for (int c = 0; c < kCols; ++c) acc[a][c] = M(0);
  for (int r = 0; r < n; ++r) {
    M xv[kPackedTile], yv[kCols];
#pragma unroll
    for (int t = 0; t < kPackedTile; ++t) xv[t] = x[xr[t] + r * x_r];
#pragma unroll
    for (int t = 0; t < kCols; ++t) yv[t] = y[r * y_r + yc[t]];
#pragma unroll
    for (int a = 0; a < kPackedTile; ++a)
#pragma unroll
      for (int c = 0; c < kCols; ++c) acc[a][c] += xv[a] * yv[c];
  }
}

// f(row, column, value) for the tile's outputs inside rows x cols.
template <int kCols, class M, class F>
__device__ __forceinline__ void tile_store(const M (&acc)[kPackedTile][kCols], int rows, int cols, F f) {
  const int ty = threadIdx.x / kPackedSide, tx = threadIdx.x % kPackedSide;
#pragma unroll
  for (int a = 0; a < kPackedTile; ++a)
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      const int i = ty + kPackedSide * a, j = tx + kPackedSide * c;
      if (i < rows && j < cols) f(i, j, acc[a][c]);
    }
}

// The pair's shared-memory layout: q, k, v (and dO) [L][Dh + 1], then the
// probabilities (and their gradient) [L][L + 1].
template <class M>
struct PackedSmem {
  int L, Dh, ld, lp;
  M* q;
  M* k;
  M* v;
  M* g;
  M* p;
  M* ds;
  __device__ PackedSmem(M* base, const PackedAttention& a, bool backward)
      : L(static_cast<int>(a.L)), Dh(static_cast<int>(a.head_dim)), ld(Dh + 1), lp(L + 1) {
    q = base;
    k = q + L * ld;
    v = k + L * ld;
    g = v + L * ld;
    p = backward ? g + L * ld : g;
    ds = p + L * lp;
  }
};

// Loads the pair's q, k, v (and, with dout, dO) as M, then writes the
// logits into s.p.
template <class T, class M>
__device__ void packed_load_logits(const PackedSmem<M>& s, const T* qkv, const T* dout, const PackedAttention& a,
                                   std::int64_t n, std::int64_t h) {
  const std::int64_t W = a.width();
  for (int idx = threadIdx.x; idx < s.L * s.Dh; idx += kPackedThreads) {
    const int i = idx / s.Dh, d = idx % s.Dh;
    const T* src = qkv + (n * a.L + i) * 3 * W + h * a.head_dim + d;
    s.q[i * s.ld + d] = M(src[0]);
    s.k[i * s.ld + d] = M(src[W]);
    s.v[i * s.ld + d] = M(src[2 * W]);
    if (dout != nullptr) s.g[i * s.ld + d] = M(dout[(n * a.L + i) * W + h * a.head_dim + d]);
  }
  __syncthreads();
  M acc[kPackedTile][kPackedTile];
  tile_product<kPackedTile>(acc, s.q, s.ld, 1, s.L, s.k, 1, s.ld, s.L, s.Dh);
  const M scale = M(a.scale);
  const bool causal = a.causal;
  tile_store<kPackedTile>(acc, s.L, s.L,
                          [&](int i, int j, M dot) { s.p[i * s.lp + j] = formulas::packed_logit(dot, scale, causal, i, j); });
  __syncthreads();
}

// Both kernels' start (after their wait for the kernels before them): the
// block's pair (n, h) laid out in the dynamic shared memory (with dO for the
// backward), its logits computed.
template <class T, class M>
__device__ PackedSmem<M> packed_begin(const T* qkv, const T* dout, const PackedAttention& a, std::int64_t n,
                                      std::int64_t h) {
  extern __shared__ __align__(16) unsigned char packed_smem[];
  const PackedSmem<M> s(reinterpret_cast<M*>(packed_smem), a, dout != nullptr);
  packed_load_logits<T, M>(s, qkv, dout, a, n, h);
  return s;
}

// kDh: the head dim's column tiles, ceil(Dh / 16).
template <class T, int kDh>
__global__ void __launch_bounds__(kPackedThreads)
    packed_attention_forward_kernel(const T* qkv, T* out, op_math_t<T>* row_max, op_math_t<T>* row_sum,
                                    PackedAttention a) {
  ::qgrad::cuda::wait_for_prior_kernels();
  using M = op_math_t<T>;
  const std::int64_t n = blockIdx.x / a.heads, h = blockIdx.x % a.heads;
  const PackedSmem<M> s = packed_begin<T, M>(qkv, nullptr, a, n, h);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int i = warp; i < s.L; i += kPackedThreads / 32) {
    M* row = s.p + i * s.lp;
    M m = -std::numeric_limits<M>::infinity();
    for (int j = lane; j < s.L; j += 32) m = formulas::max_nan(m, row[j]);
    const M mx = warp_max(m);
    M part = M(0);
    for (int j = lane; j < s.L; j += 32) part += formulas::exp_m(row[j] - mx);
    const M sum = warp_lane_sum(part);
    for (int j = lane; j < s.L; j += 32) row[j] = formulas::attention_prob(row[j], mx, sum);
    if (lane == 0) {
      row_max[(n * a.heads + h) * a.L + i] = mx;
      row_sum[(n * a.heads + h) * a.L + i] = sum;
    }
  }
  __syncthreads();
  M acc[kPackedTile][kDh];
  tile_product<kDh>(acc, s.p, s.lp, 1, s.L, s.v, s.ld, 1, s.Dh, s.L);
  const std::int64_t W = a.width();
  tile_store<kDh>(acc, s.L, s.Dh, [&](int i, int d, M o) { out[(n * a.L + i) * W + h * a.head_dim + d] = T(o); });
}

template <class T, int kDh>
__global__ void __launch_bounds__(kPackedThreads)
    packed_attention_backward_kernel(const T* qkv, const T* dout, const op_math_t<T>* row_max,
                                     const op_math_t<T>* row_sum, T* dqkv, PackedAttention a) {
  ::qgrad::cuda::wait_for_prior_kernels();
  using M = op_math_t<T>;
  const std::int64_t n = blockIdx.x / a.heads, h = blockIdx.x % a.heads;
  const PackedSmem<M> s = packed_begin<T, M>(qkv, dout, a, n, h);
  const std::int64_t stats = (n * a.heads + h) * a.L, W = a.width();
  for (int idx = threadIdx.x; idx < s.L * s.L; idx += kPackedThreads) {
    const int i = idx / s.L, j = idx % s.L;
    s.p[i * s.lp + j] = formulas::attention_prob(s.p[i * s.lp + j], row_max[stats + i], row_sum[stats + i]);
  }
  __syncthreads();
  T* base = dqkv + n * a.L * 3 * W + h * a.head_dim;  // row 0 of this pair's q part
  // dV[j][d] = sum_i p[i][j] dO[i][d]; dP[i][j] = sum_d dO[i][d] v[j][d].
  M acc[kPackedTile][kDh];
  tile_product<kDh>(acc, s.p, 1, s.lp, s.L, s.g, s.ld, 1, s.Dh, s.L);
  tile_store<kDh>(acc, s.L, s.Dh, [&](int j, int d, M dv) { base[j * 3 * W + 2 * W + d] = T(dv); });
  M dp[kPackedTile][kPackedTile];
  tile_product<kPackedTile>(dp, s.g, s.ld, 1, s.L, s.v, 1, s.ld, s.L, s.Dh);
  tile_store<kPackedTile>(dp, s.L, s.L, [&](int i, int j, M v) { s.ds[i * s.lp + j] = v; });
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const M scale = M(a.scale);
  for (int i = warp; i < s.L; i += kPackedThreads / 32) {
    const M* p = s.p + i * s.lp;
    M* ds = s.ds + i * s.lp;
    M part = M(0);
    for (int j = lane; j < s.L; j += 32) part += ds[j] * p[j];
    const M dot = warp_lane_sum(part);
    for (int j = lane; j < s.L; j += 32) ds[j] = formulas::packed_logit_grad(p[j], ds[j], dot, scale);
  }
  __syncthreads();
  // dQ[i][d] = sum_j dS[i][j] k[j][d]; dK[j][d] = sum_i dS[i][j] q[i][d].
  tile_product<kDh>(acc, s.ds, s.lp, 1, s.L, s.k, s.ld, 1, s.Dh, s.L);
  tile_store<kDh>(acc, s.L, s.Dh, [&](int i, int d, M dq) { base[i * 3 * W + d] = T(dq); });
  tile_product<kDh>(acc, s.ds, 1, s.lp, s.L, s.q, s.ld, 1, s.Dh, s.L);
  tile_store<kDh>(acc, s.L, s.Dh, [&](int j, int d, M dk) { base[j * 3 * W + W + d] = T(dk); });
}

// Past 48 KiB a kernel's dynamic shared memory must be allowed: the fit rule's
// bound, once per kernel and device (a template on the kernel itself: the
// head-dim instantiations share one function type).
template <auto kKernel>
void allow_packed_smem(int dev) {
  static std::once_flag once[64];
  auto allow = [] {
    QGRAD_CUDA_CHECK(cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(kPackedAttentionMaxSmem)));
  };
  if (dev >= 0 && dev < 64) std::call_once(once[dev], allow);
  else allow();
}

unsigned packed_blocks(const PackedAttention& a) {
  const std::int64_t pairs = a.batch * a.heads;
  QGRAD_CHECK(pairs <= 0x7fffffff, "packed_attention", "qkv", "too many (batch, head) pairs: ", pairs);
  return static_cast<unsigned>(pairs);
}

// f(std::integral_constant<int, kDh>) for the head dim's column tiles.
template <class F>
void with_head_tiles(std::int64_t head_dim, F f) {
  switch ((head_dim + kPackedSide - 1) / kPackedSide) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 3: f(std::integral_constant<int, 3>{}); break;
    default: f(std::integral_constant<int, 4>{}); break;  // head_dim <= 64 (packed_attention_fits)
  }
}

}  // namespace

void packed_attention_forward(const Tensor& qkv, const Tensor& out, const Tensor& row_max, const Tensor& row_sum,
                              const PackedAttention& a) {
  dispatch_floating(qkv.dtype(), "packed_attention", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using M = op_math_t<T>;
    const int dev = out.device().index;
    const std::size_t smem = static_cast<std::size_t>(3 * a.L * (a.head_dim + 1) + a.L * (a.L + 1)) * sizeof(M);
    with_head_tiles(a.head_dim, [&](auto dh) {
      constexpr auto kernel = packed_attention_forward_kernel<T, decltype(dh)::value>;
      allow_packed_smem<kernel>(dev);
      ::qgrad::cuda::launch_kernel(dev, kernel, packed_blocks(a), kPackedThreads, smem,
                                   static_cast<const T*>(qkv.data_ptr()), static_cast<T*>(out.data_ptr()),
                                   static_cast<M*>(row_max.data_ptr()), static_cast<M*>(row_sum.data_ptr()), a);
    });
  });
}

void packed_attention_backward(const Tensor& qkv, const Tensor& dout, const Tensor& row_max, const Tensor& row_sum,
                               const Tensor& dqkv, const PackedAttention& a) {
  dispatch_floating(qkv.dtype(), "packed_attention", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using M = op_math_t<T>;
    const int dev = dqkv.device().index;
    with_head_tiles(a.head_dim, [&](auto dh) {
      constexpr auto kernel = packed_attention_backward_kernel<T, decltype(dh)::value>;
      allow_packed_smem<kernel>(dev);
      ::qgrad::cuda::launch_kernel(dev, kernel, packed_blocks(a), kPackedThreads,
                                   packed_attention_backward_smem(a.L, a.head_dim, sizeof(M)),
                                   static_cast<const T*>(qkv.data_ptr()), static_cast<const T*>(dout.data_ptr()),
                                   static_cast<const M*>(row_max.data_ptr()),
                                   static_cast<const M*>(row_sum.data_ptr()), static_cast<T*>(dqkv.data_ptr()), a);
    });
  });
}

void attention_softmax_warp_rows(const Tensor& scores, const Tensor& mask, const Tensor& probs, const Tensor& attn,
                                 const AttentionRows& a) {
  dispatch_floating(probs.dtype(), "scaled_dot_product_attention", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (a.mask == AttentionMaskKind::boolean) softmax_impl<T, bool>(scores, mask, probs, attn, a);
    else softmax_impl<T, T>(scores, mask, probs, attn, a);
  });
}

void attention_softmax_backward_warp_rows(const Tensor& probs, const Tensor& dattn, const Tensor& dscores,
                                          const Tensor& dlogits, const AttentionRows& a) {
  dispatch_floating(probs.dtype(), "scaled_dot_product_attention", [&](auto tag) {
    softmax_backward_impl<typename decltype(tag)::type>(probs, dattn, dscores, dlogits, a);
  });
}

void attention_dropout(const Tensor& probs, const Tensor& attn, const AttentionRows& a) {
  dispatch_floating(probs.dtype(), "scaled_dot_product_attention",
                    [&](auto tag) { dropout_impl<typename decltype(tag)::type>(probs, attn, a); });
}

}  // namespace qgrad::kernels::cuda
