// scaled_dot_product_attention's fused row kernels on CUDA, one warp per row:
// lane l handles columns l, l + 32, ... ; the row max by butterfly, the sums
// in formulas::lane_sum's order (warp_lane_sum), so a row gives the CPU's
// bits wherever exp does. The element formulas are kernels/formulas/attention.h.
// Then packed_attention's fused kernels, a block per (batch, head) pair: f32
// and f64 on the CUDA cores in the CPU loop's order, f16 and bf16 on the
// tensor cores.
#include <type_traits>

#include "qgrad/kernels/cuda/entries.h"
#include "qgrad/kernels/cuda/launch.cuh"
#include "qgrad/kernels/cuda/mma.cuh"
#include "qgrad/kernels/cuda/warp_rows.cuh"
#include "qgrad/kernels/formulas/attention.h"
#include "qgrad/kernels/formulas/transformer.h"

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

// ---- packed_attention in f32 and f64: a block of 16 x 16 threads per (batch, head) pair.
// Thread (ty, tx) owns a 4 x kCols tile of every product: rows 4 ty + a
// (a < 4) and, in the L x Dh products, columns kCols tx + c (kCols the head
// dim's ceil(Dh / 16)); in the L x L products (the logits and dP) its columns
// are the keys tx, tx + 16, tx + 32, tx + 48, stored at places 4 tx ... 4 tx +
// 3 of the transposed k and v (packed_key_slot), so that a row's 16 threads
// hold its keys as a warp of lane_sum's order holds them (lane l: keys l and
// l + 32) and its max, exp-sum and dP . P come from the tile itself (5
// shuffles a row among the 16) instead of a warp pass over a stored row. Each
// output is a chain of fused multiply-adds over its reduction index from 0
// upward, as the CPU loop (kernels/attention.cpp). The operands sit in shared
// memory so that a thread's 4 rows, and its columns, at one reduction index
// are one run wherever a layout allows (one vector load each, not 4 + kCols
// scalar ones: the kernels are bound by issue slots), and a warp whose 8 rows
// all lie past a product's rows skips it (L = 49: one warp of 8). ----
constexpr int kPackedSide = 16;
constexpr int kPackedThreads = kPackedSide * kPackedSide;
constexpr int kPackedTile = 4;  // kPackedSide * kPackedTile == kPackedAttentionMaxLength

// v[0..N) = p[0..N): one load where N values make 8 or 16 bytes, two for 32
// (the layouts keep such runs aligned), else N scalar loads.
template <int N, class M>
__device__ __forceinline__ void load_run(const M* p, M (&v)[N]) {
  constexpr std::size_t kBytes = N * sizeof(M);
  if constexpr (kBytes == 8 || kBytes == 16) {
    struct alignas(kBytes) Run {
      M x[N];
    };
    const Run r = *reinterpret_cast<const Run*>(p);
#pragma unroll
    for (int t = 0; t < N; ++t) v[t] = r.x[t];
  } else if constexpr (kBytes == 32) {
    struct alignas(16) Run {
      M x[N / 2];
    };
    const Run lo = reinterpret_cast<const Run*>(p)[0], hi = reinterpret_cast<const Run*>(p)[1];
#pragma unroll
    for (int t = 0; t < N / 2; ++t) {
      v[t] = lo.x[t];
      v[t + N / 2] = hi.x[t];
    }
  } else {
#pragma unroll
    for (int t = 0; t < N; ++t) v[t] = p[t];
  }
}

__device__ __forceinline__ int packed_ty() { return static_cast<int>(threadIdx.x) / kPackedSide; }
__device__ __forceinline__ int packed_tx() { return static_cast<int>(threadIdx.x) % kPackedSide; }
// Whether the thread's warp holds a row below `rows` (its rows are 8 w ... 8 w + 7).
__device__ __forceinline__ bool packed_rows_active(int rows) { return static_cast<int>(threadIdx.x) / 32 * 8 < rows; }

// The x operand x(row, r) for the thread's rows, stored [r][row] (pitch ld):
// the 4 rows one run. Rows stay below the warp's 8-row bound, inside the pitch.
template <class M>
struct RowRuns {
  const M* base;
  int ld;
  __device__ RowRuns(const M* b, int ld_) : base(b + kPackedTile * packed_ty()), ld(ld_) {}
  __device__ void operator()(int r, M (&v)[kPackedTile]) const { load_run<kPackedTile>(base + r * ld, v); }
};
// The x operand stored [row][r] (pitch ld): 4 loads, rows past the last valid
// one read it (their outputs are never stored).
template <class M>
struct RowScalars {
  const M* base;
  int off[kPackedTile];
  __device__ RowScalars(const M* b, int ld, int rows) : base(b) {
#pragma unroll
    for (int a = 0; a < kPackedTile; ++a) off[a] = min(kPackedTile * packed_ty() + a, rows - 1) * ld;
  }
  __device__ void operator()(int r, M (&v)[kPackedTile]) const {
#pragma unroll
    for (int a = 0; a < kPackedTile; ++a) v[a] = base[off[a] + r];
  }
};
// The y operand y(r, column) stored [r][column] (pitch ld): the thread's
// kCols columns one run; a run past the pitch reads its last full run instead
// (columns past the valid ones, never stored).
template <int kCols, class M>
struct ColRuns {
  const M* base;
  int ld;
  __device__ ColRuns(const M* b, int ld_) : base(b + min(kCols * packed_tx(), ld_ - kCols)), ld(ld_) {}
  __device__ void operator()(int r, M (&v)[kCols]) const { load_run<kCols>(base + r * ld, v); }
};

// acc[a][c] = the chain fma(x(row a, r), y(r, column c), .) over r < n from 0.
template <int kCols, class M, class X, class Y>
__device__ __forceinline__ void tile_fma(M (&acc)[kPackedTile][kCols], int n, const X& x, const Y& y) {
#pragma unroll
  for (int a = 0; a < kPackedTile; ++a)
#pragma unroll
    for (int c = 0; c < kCols; ++c) acc[a][c] = M(0);
  for (int r = 0; r < n; ++r) {
    M xv[kPackedTile], yv[kCols];
    x(r, xv);
    y(r, yv);
#pragma unroll
    for (int a = 0; a < kPackedTile; ++a)
#pragma unroll
      for (int c = 0; c < kCols; ++c) acc[a][c] = formulas::fused_multiply_add(xv[a], yv[c], acc[a][c]);
  }
}

// f(a, row, column, value) for the tile's outputs inside rows x cols.
template <int kCols, class M, class F>
__device__ __forceinline__ void tile_store(const M (&acc)[kPackedTile][kCols], int rows, int cols, F f) {
#pragma unroll
  for (int a = 0; a < kPackedTile; ++a)
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      const int i = kPackedTile * packed_ty() + a, j = kCols * packed_tx() + c;
      if (i < rows && j < cols) f(a, i, j, acc[a][c]);
    }
}

// The L x L tiles: column c of thread tx is key tx + 16 c, stored at place
// 4 (j mod 16) + j / 16 of the transposed k and v (pitch kPackedAttentionKeyPitch).
__device__ __forceinline__ int packed_key(int tx, int c) { return tx + kPackedSide * c; }
__device__ __forceinline__ int packed_key_slot(int j) { return kPackedTile * (j % kPackedSide) + j / kPackedSide; }

// f(a, row, key, value) for the L x L tile's outputs inside rows x keys.
template <class M, class F>
__device__ __forceinline__ void key_tile_store(const M (&acc)[kPackedTile][kPackedTile], int rows, int keys, F f) {
#pragma unroll
  for (int a = 0; a < kPackedTile; ++a)
#pragma unroll
    for (int c = 0; c < kPackedTile; ++c) {
      const int i = kPackedTile * packed_ty() + a, j = packed_key(packed_tx(), c);
      if (i < rows && j < keys) f(a, i, j, acc[a][c]);
    }
}

// A row's reduction over its keys j < L from the row's 16 threads, with the
// bits of the warp pass over a stored row (warp_max, warp_lane_sum): lane l's
// part (identity, then keys l and l + 32 in order) is thread l's columns 0
// and 2 for l < 16 and thread l - 16's columns 1 and 3 otherwise; the
// butterfly's first step (lane l with l + 16) is then inside the thread, its
// steps 8 ... 1 among the 16 threads (one half of the warp: the row's), and
// the result is the value of the half's lane 0. Every thread of the warp calls it.
template <class M, class Combine, class Term>
__device__ __forceinline__ M key_tile_reduce(int L, M identity, Combine combine, Term term) {
  const int tx = packed_tx();
  M lo = identity, hi = identity;
  if (tx < L) lo = combine(lo, term(0));
  if (tx + 32 < L) lo = combine(lo, term(2));
  if (tx + 16 < L) hi = combine(hi, term(1));
  if (tx + 48 < L) hi = combine(hi, term(3));
  M v = combine(lo, hi);
#pragma unroll
  for (int m = kPackedSide / 2; m > 0; m >>= 1) v = combine(v, __shfl_xor_sync(0xffffffffu, v, m));
  return __shfl_sync(0xffffffffu, v, 0, kPackedSide);
}
// The row max (warp_max's) of z over the row's keys.
template <class M>
__device__ __forceinline__ M key_tile_max(const M (&z)[kPackedTile], int L) {
  return key_tile_reduce(L, -std::numeric_limits<M>::infinity(), [](M a, M b) { return formulas::max_nan(a, b); },
                         [&](int c) { return z[c]; });
}
// lane_sum's order of term(c) over the row's keys.
template <class M, class Term>
__device__ __forceinline__ M key_tile_lane_sum(int L, Term term) {
  return key_tile_reduce(L, M(0), [](M a, M b) { return a + b; }, term);
}

// The pair's shared arrays (kernels/attention.h gives their sizes): "t" ones
// transposed, q's [Dh][lp], k's and v's [Dh][kp] in the key order
// (packed_key_slot), the forward's probabilities [key][row] (pitch lp); the
// others [L][dp] or [L][lp]. The backward's q and k [L][dp] take q's and k's
// transposed place once the logits are done; dO has no transposed copy (dP
// reads its rows as scalars), which keeps the ViT's backward (L = 49, Dh = 32,
// f32) at 4 blocks an SM.
template <class M>
struct PackedLayout {
  int L, Dh, lp, dp;
  static constexpr int kp = static_cast<int>(kPackedAttentionKeyPitch);
  M *qt, *kt, *vt, *q, *k, *v, *g, *p, *ds;
  __device__ PackedLayout(M* base, const PackedAttention& a, bool backward)
      : L(static_cast<int>(a.L)), Dh(static_cast<int>(a.head_dim)),
        lp(static_cast<int>(packed_attention_seq_pitch(a.L))), dp(static_cast<int>(packed_attention_dim_pitch(a.head_dim))) {
    qt = q = base;
    kt = qt + Dh * lp;
    if (!backward) {
      v = kt + Dh * kp;
      p = v + L * dp;
      vt = k = g = ds = nullptr;
      return;
    }
    k = q + L * dp;
    vt = base + max(Dh * (lp + kp), 2 * L * dp);
    g = vt + Dh * kp;
    p = g + L * dp;
    ds = p + L * lp;
  }
};

// The pair's layout in the block's dynamic shared memory.
template <class M>
__device__ __forceinline__ PackedLayout<M> packed_layout(const PackedAttention& a, bool backward) {
  extern __shared__ __align__(16) unsigned char packed_smem[];
  return PackedLayout<M>(reinterpret_cast<M*>(packed_smem), a, backward);
}

// f(i, d) for the elements of an L x Dh matrix, consecutive threads on
// consecutive d (coalesced reads of the packed rows). A head dim of whole
// column tiles (Dh = 16 kDh, the ViT's 32) divides by a constant.
template <int kDh, class F>
__device__ __forceinline__ void for_pair_elements(const PackedAttention& a, F f) {
  const int L = static_cast<int>(a.L), Dh = static_cast<int>(a.head_dim);
  if (Dh == kPackedSide * kDh) {
    constexpr int kD = kPackedSide * kDh;
    for (int idx = static_cast<int>(threadIdx.x); idx < L * kD; idx += kPackedThreads) f(idx / kD, idx % kD);
  } else {
    for (int idx = static_cast<int>(threadIdx.x); idx < L * Dh; idx += kPackedThreads) f(idx / Dh, idx % Dh);
  }
}

// Element (i, d) of the pair's q at pair[i * row + d]; k and v follow W later.
template <class T>
struct PairRows {
  const T* pair;
  std::int64_t row, W;
  __device__ PairRows(const T* qkv, const PackedAttention& a, std::int64_t n, std::int64_t h)
      : pair(qkv + n * a.L * 3 * a.width() + h * a.head_dim), row(3 * a.width()), W(a.width()) {}
  __device__ const T* operator()(int i, int d) const { return pair + i * row + d; }
};

// The pair's q transposed into s.qt and k transposed in the key order into
// s.kt; place_v(i, d, v[i][d]) puts v where the kernel wants it.
template <int kDh, class T, class M, class F>
__device__ __forceinline__ void load_pair(const PackedLayout<M>& s, const T* qkv, const PackedAttention& a,
                                          std::int64_t n, std::int64_t h, F place_v) {
  const PairRows<T> rows(qkv, a, n, h);
  for_pair_elements<kDh>(a, [&](int i, int d) {
    const T* src = rows(i, d);
    s.qt[d * s.lp + i] = M(src[0]);
    s.kt[d * s.kp + packed_key_slot(i)] = M(src[rows.W]);
    place_v(i, d, M(src[2 * rows.W]));
  });
}

// The backward's registers are held to 4 blocks an SM in f32, what the ViT's
// pairs (L = 49, Dh = 32) fit in shared memory: the compiler's own choice, 77
// registers, gave 3 (H200, ViT step: 70.4 -> 66.1 us a layer, 64 registers,
// a 24-byte spill). The forward held to 5
// blocks measured no faster (37.7 -> 38.2 us) and keeps its 58; f64 keeps
// the compiler's choice (held, it spills hundreds of bytes).
template <class T>
constexpr int packed_backward_min_blocks() {
  return sizeof(op_math_t<T>) == 4 ? 4 : 1;
}

// kDh: the head dim's column tiles, ceil(Dh / 16).
template <class T, int kDh>
__global__ void __launch_bounds__(kPackedThreads)
    packed_attention_forward_kernel(const T* qkv, T* out, op_math_t<T>* row_max, op_math_t<T>* row_sum,
                                    PackedAttention a) {
  ::qgrad::cuda::wait_for_prior_kernels();
  using M = op_math_t<T>;
  const std::int64_t n = blockIdx.x / a.heads, h = blockIdx.x % a.heads, W = a.width();
  const PackedLayout<M> s = packed_layout<M>(a, false);
  load_pair<kDh>(s, qkv, a, n, h, [&](int i, int d, M v) { s.v[i * s.dp + d] = v; });
  __syncthreads();
  const bool active = packed_rows_active(s.L);
  if (active) {  // logits [i][j] = q_i . k_j * scale, then each row's softmax from the tile
    M z[kPackedTile][kPackedTile];
    tile_fma<kPackedTile>(z, s.Dh, RowRuns<M>(s.qt, s.lp), ColRuns<kPackedTile, M>(s.kt, s.kp));
    const M scale = M(a.scale);
    const bool causal = a.causal;
    const int tx = packed_tx();
#pragma unroll
    for (int t = 0; t < kPackedTile; ++t) {
      const int i = kPackedTile * packed_ty() + t;
#pragma unroll
      for (int c = 0; c < kPackedTile; ++c) z[t][c] = formulas::packed_logit(z[t][c], scale, causal, i, packed_key(tx, c));
      const M mx = key_tile_max(z[t], s.L);
#pragma unroll
      for (int c = 0; c < kPackedTile; ++c) z[t][c] = formulas::exp_m(z[t][c] - mx);  // attention_prob's exp
      const M sum = key_tile_lane_sum<M>(s.L, [&](int c) { return z[t][c]; });
#pragma unroll
      for (int c = 0; c < kPackedTile; ++c) z[t][c] = formulas::attention_prob_of_exp(z[t][c], mx, sum);
      if (tx == 0 && i < s.L) {
        row_max[(n * a.heads + h) * a.L + i] = mx;
        row_sum[(n * a.heads + h) * a.L + i] = sum;
      }
    }
    // P transposed [key][row]: the product below reads a thread's 4 rows as one run.
    key_tile_store(z, s.L, s.L, [&](int, int i, int j, M p) { s.p[j * s.lp + i] = p; });
  }
  __syncthreads();
  if (!active) return;
  M acc[kPackedTile][kDh];  // O[i][d] = sum_j P[i][j] v[j][d]
  tile_fma<kDh>(acc, s.L, RowRuns<M>(s.p, s.lp), ColRuns<kDh, M>(s.v, s.dp));
  tile_store<kDh>(acc, s.L, s.Dh, [&](int, int i, int d, M o) { out[(n * a.L + i) * W + h * a.head_dim + d] = T(o); });
}

template <class T, int kDh>
__global__ void __launch_bounds__(kPackedThreads, packed_backward_min_blocks<T>())
    packed_attention_backward_kernel(const T* qkv, const T* dout, const std::uint32_t* dout_mask,
                                     const op_math_t<T>* row_max, const op_math_t<T>* row_sum, T* dqkv,
                                     PackedAttention a) {
  ::qgrad::cuda::wait_for_prior_kernels();
  using M = op_math_t<T>;
  const std::int64_t n = blockIdx.x / a.heads, h = blockIdx.x % a.heads, W = a.width();
  const PackedLayout<M> s = packed_layout<M>(a, true);
  load_pair<kDh>(s, qkv, a, n, h, [&](int i, int d, M v) {
    s.vt[d * s.kp + packed_key_slot(i)] = v;
    s.g[i * s.dp + d] = formulas::masked_grad(dout, dout_mask, (n * a.L + i) * W + h * a.head_dim + d);
  });
  __syncthreads();
  const bool active = packed_rows_active(s.L);
  if (active) {  // P[i][j] from the logits and the saved row statistics
    const std::int64_t stats = (n * a.heads + h) * a.L;
    M mx[kPackedTile], sum[kPackedTile];
#pragma unroll
    for (int t = 0; t < kPackedTile; ++t) {
      const std::int64_t i = min(kPackedTile * packed_ty() + t, s.L - 1);
      mx[t] = row_max[stats + i];
      sum[t] = row_sum[stats + i];
    }
    M acc[kPackedTile][kPackedTile];
    tile_fma<kPackedTile>(acc, s.Dh, RowRuns<M>(s.qt, s.lp), ColRuns<kPackedTile, M>(s.kt, s.kp));
    const M scale = M(a.scale);
    const bool causal = a.causal;
    key_tile_store(acc, s.L, s.L, [&](int t, int i, int j, M dot) {
      s.p[i * s.lp + j] = formulas::attention_prob(formulas::packed_logit(dot, scale, causal, i, j), mx[t], sum[t]);
    });
  }
  __syncthreads();
  const PairRows<T> rows(qkv, a, n, h);
  for_pair_elements<kDh>(a, [&](int i, int d) {  // q and k [L][dp] over their transposed copies
    const T* src = rows(i, d);
    s.q[i * s.dp + d] = M(src[0]);
    s.k[i * s.dp + d] = M(src[W]);
  });
  T* base = dqkv + n * a.L * 3 * W + h * a.head_dim;  // row 0 of this pair's q part
  if (active) {
    M acc[kPackedTile][kDh];  // dV[j][d] = sum_i P[i][j] dO[i][d]
    tile_fma<kDh>(acc, s.L, RowRuns<M>(s.p, s.lp), ColRuns<kDh, M>(s.g, s.dp));
    tile_store<kDh>(acc, s.L, s.Dh, [&](int, int j, int d, M dv) { base[j * 3 * W + 2 * W + d] = T(dv); });
    M dp[kPackedTile][kPackedTile];  // dP[i][j] = sum_d dO[i][d] v[j][d]
    tile_fma<kPackedTile>(dp, s.Dh, RowScalars<M>(s.g, s.dp, s.L), ColRuns<kPackedTile, M>(s.vt, s.kp));
    // dS = P (dP - rowsum(dP . P)) scale, the row sums from the tile; P at the
    // tile's own places, written by this thread above (rows and keys past L
    // are not read into a sum and not stored).
    const M scale = M(a.scale);
    const int tx = packed_tx();
#pragma unroll
    for (int t = 0; t < kPackedTile; ++t) {
      const int i = min(kPackedTile * packed_ty() + t, s.L - 1);
      M p[kPackedTile];
#pragma unroll
      for (int c = 0; c < kPackedTile; ++c) p[c] = s.p[i * s.lp + min(packed_key(tx, c), s.L - 1)];
      const M dot = key_tile_lane_sum<M>(s.L, [&](int c) { return dp[t][c] * p[c]; });
#pragma unroll
      for (int c = 0; c < kPackedTile; ++c) dp[t][c] = formulas::packed_logit_grad(p[c], dp[t][c], dot, scale);
    }
    key_tile_store(dp, s.L, s.L, [&](int, int i, int j, M v) { s.ds[i * s.lp + j] = v; });
  }
  __syncthreads();
  if (!active) return;
  M acc[kPackedTile][kDh];  // dQ[i][d] = sum_j dS[i][j] k[j][d]
  tile_fma<kDh>(acc, s.L, RowScalars<M>(s.ds, s.lp, s.L), ColRuns<kDh, M>(s.k, s.dp));
  tile_store<kDh>(acc, s.L, s.Dh, [&](int, int i, int d, M dq) { base[i * 3 * W + d] = T(dq); });
  tile_fma<kDh>(acc, s.L, RowRuns<M>(s.ds, s.lp), ColRuns<kDh, M>(s.q, s.dp));  // dK[j][d] = sum_i dS[i][j] q[i][d]
  tile_store<kDh>(acc, s.L, s.Dh, [&](int, int j, int d, M dk) { base[j * 3 * W + W + d] = T(dk); });
}

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
// The largest head dim's backward (more than its forward) fits the fit rule's bound.
static_assert(mma_backward_words<4>() * sizeof(std::uint16_t) <= kPackedAttentionMaxSmem);

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

// acc[nt] (nt < tiles) = the warp's A fragments a[ks] (k16 steps ks <
// kt_count) times the operand stored [n][k]; acc[nt] = 0 for nt >= tiles.
template <class T, int kKT, int kTiles>
__device__ __forceinline__ void mma_fragments(float (&acc)[kTiles][4], int tiles, const std::uint32_t (&a)[kKT][4],
                                              int kt_count, const std::uint16_t* y, int ldy) {
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

// acc[nt] (nt < tiles) = x rows r0 ... (A, row major, kKT k16 steps) times
// the operand stored [n][k].
template <class T, int kKT, int kTiles>
__device__ __forceinline__ void mma_rows(float (&acc)[kTiles][4], int tiles, const std::uint16_t* x, int ldx, int r0,
                                         int kt_count, const std::uint16_t* y, int ldy) {
  std::uint32_t a[kKT][4];
#pragma unroll
  for (int ks = 0; ks < kKT; ++ks)
    if (ks < kt_count) mma_load_a(x, ldx, r0, 16 * ks, a[ks]);
  mma_fragments<T>(acc, tiles, a, kt_count, y, ldy);
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
  mma_fragments<T>(acc, tiles, a, kt_count, y, ldy);
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


// The fit rule's bound of dynamic shared memory, allowed once per kernel and
// device (the head-dim instantiations share one function type).
template <auto kKernel>
void allow_packed_smem(int dev) {
  allow_dynamic_smem<kKernel>(dev, static_cast<int>(kPackedAttentionMaxSmem));
}

unsigned packed_blocks(const PackedAttention& a) {
  const std::int64_t pairs = a.batch * a.heads;
  QGRAD_CHECK(pairs <= 0x7fffffff, "packed_attention", "qkv", "too many (batch, head) pairs: ", pairs);
  return static_cast<unsigned>(pairs);
}

// kKernel over the (batch, head) pairs, a block each, with `smem` bytes of
// dynamic shared memory (within the fit rule's bound, allowed once).
template <auto kKernel, class... Args>
void launch_packed(int dev, const PackedAttention& a, unsigned threads, std::size_t smem, Args... args) {
  allow_packed_smem<kKernel>(dev);
  ::qgrad::cuda::launch_kernel(dev, kKernel, packed_blocks(a), threads, smem, args..., a);
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
    const auto* x = static_cast<const T*>(qkv.data_ptr());
    auto* o = static_cast<T*>(out.data_ptr());
    auto* mx = static_cast<M*>(row_max.data_ptr());
    auto* sum = static_cast<M*>(row_sum.data_ptr());
    const int dev = out.device().index;
    with_head_tiles(a.head_dim, [&](auto dh) {
      constexpr int kDh = decltype(dh)::value;
      if constexpr (sizeof(T) == 2)  // f16, bf16: the tensor cores
        launch_packed<packed_attention_forward_mma_kernel<T, kDh>>(
            dev, a, kMmaThreads, mma_forward_words<kDh>() * sizeof(std::uint16_t), x, o, mx, sum);
      else
        launch_packed<packed_attention_forward_kernel<T, kDh>>(
            dev, a, kPackedThreads, packed_attention_forward_smem(a.L, a.head_dim, sizeof(M)), x, o, mx, sum);
    });
  });
}

void packed_attention_backward(const Tensor& qkv, const Tensor& dout, const Tensor& row_max, const Tensor& row_sum,
                               const Tensor& dqkv, const PackedAttention& a, const std::uint32_t* dout_mask) {
  dispatch_floating(qkv.dtype(), "packed_attention", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using M = op_math_t<T>;
    const auto* x = static_cast<const T*>(qkv.data_ptr());
    const auto* g = static_cast<const T*>(dout.data_ptr());
    const auto* mx = static_cast<const M*>(row_max.data_ptr());
    const auto* sum = static_cast<const M*>(row_sum.data_ptr());
    auto* dx = static_cast<T*>(dqkv.data_ptr());
    const int dev = dqkv.device().index;
    with_head_tiles(a.head_dim, [&](auto dh) {
      constexpr int kDh = decltype(dh)::value;
      if constexpr (sizeof(T) == 2)  // f16, bf16: the tensor cores
        launch_packed<packed_attention_backward_mma_kernel<T, kDh>>(
            dev, a, kMmaThreads, mma_backward_words<kDh>() * sizeof(std::uint16_t), x, g, dout_mask, mx, sum, dx);
      else
        launch_packed<packed_attention_backward_kernel<T, kDh>>(
            dev, a, kPackedThreads, packed_attention_backward_smem(a.L, a.head_dim, sizeof(M)), x, g, dout_mask, mx,
            sum, dx);
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
