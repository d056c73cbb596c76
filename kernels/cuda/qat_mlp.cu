// The QAT MLP's forward, loss and backward as one persistent kernel
// (kernels/qat_mlp.h). A small MLP's step is bound by kernel count, not by
// work: the b256 784-256-256-10 step was 35 kernel nodes at ~3.4 µs each for
// ~310 MFLOP (docs/benchmarks.md, issue #16). Here every block of one
// cooperative grid runs the phases in turn, with a grid barrier between
// each phase and the next:
//   0      the weights' per-channel observers + fake quants (a row to a
//          group of warps, into the workspace); the input's range;
//   1..L   layer l: the previous fake quant's qparams from its range (every
//          block derives them; block 0 stores the state), then
//          z_l = act_{l-1} · Wq_lᵀ + b_l with act_{l-1} fake-quantized (and
//          relu'd) in shared memory as it lands, and z_l's range;
//   L+1    the logits' qparams, cross-entropy a warp per row, dz_L;
//   L+2..  per layer from the last: dW_l (times the weight fake quant's
//          mask), db_l, and dz_{l-1} = (dz_l · Wq_l) under act_{l-1}'s mask.
// The products are tiles of 64 x 32 outputs on FFMA (f32 products as
// cuBLAS's f32 GEMM forms them, in another order), each output one FMA
// chain in increasing k; a unit's K (up to kStageK) is copied to shared
// memory at once (cp.async). Tiles that would leave SMs idle are split along
// K over the blocks of a thread-block cluster (kCluster blocks, launched as
// one): each block stores its part in its shared memory, the cluster meets,
// and each of the tile's blocks sums a share of the outputs from every
// part, in part order (the same bits on every run). A tensor's range meets
// in two device words by atomicMax on order-preserving keys (exact and
// order-free). Every other formula is the unfused ops' (kernels/formulas/*.h).
// Measured (H200, forty-fourth session): the b256 step's kernel 87 µs a
// launch, 8 phases of 4.5-24.1 µs (dev/cuda/qat_mlp_phases.cu); a barrier
// alone is ~1 µs (dev/cuda/grid_barrier.cu), a split-K round through the
// cluster ~1.9 µs more (dev/cuda/cluster_splitk.cu). A phase is bound by
// its slowest block's chain of dependent steps, not by bandwidth: work one
// warp or one thread does alone (a weight row, the loss's sum) shows, and
// work added to a chain costs more than a launch it saves (the optimizer's
// update, docs/benchmarks.md). The kernel spills ~300 bytes a thread into
// L1: keep the shared memory of 2 blocks under the 164 KB carve-out (228
// KB, L1 28 KB, costs 3 µs a launch).
#include <cooperative_groups.h>

#include <algorithm>
#include <cstdint>

#include "qgrad/core/cuda/common.cuh"
#include "qgrad/kernels/cuda/entries.h"
#include "qgrad/kernels/cuda/mbarrier.cuh"
#include "qgrad/kernels/cuda/minmax.cuh"
#include "qgrad/kernels/formulas/observer.h"
#include "qgrad/kernels/formulas/quantize.h"
#include "qgrad/kernels/formulas/softmax.h"

namespace qgrad::kernels::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kTileM = 64, kTileN = 32, kTileK = 32;
constexpr int kMaxBlocksPerSm = 2;

QGRAD_HD int ceil_div(int a, int b) { return (a + b - 1) / b; }

// K of a product cut into `split` parts of kper (a multiple of kTileK):
// the parts that are not empty (host and device agree on it).
QGRAD_HD int split_parts(int k, int split, int& kper) {
  kper = ceil_div(ceil_div(k, split), kTileK) * kTileK;
  return ceil_div(k, kper);
}

// The workspace's layout for a's shapes and splits (16-byte aligned buffers).
QatMlpWorkspace workspace_of(const QatMlpArgs& a) {
  QatMlpWorkspace w;
  std::int64_t at = 0;
  const auto take = [&](std::int64_t floats) {
    const std::int64_t o = at;
    at += (floats + 3) / 4 * 4;
    return o;
  };
  const std::int64_t b = a.batch;
  for (int i = 0; i < a.num_layers; ++i) {
    const QatMlpLayer& l = a.layers[i];
    const std::int64_t n = l.out_features, k = l.in_features;
    w.wq[i] = take(n * k);
    w.z[i] = take(b * n);
    w.dz[i] = take(b * n);
  }
  w.loss_parts = take(a.grid);
  w.total = at;
  return w;
}

// The fake quant (per tensor; + relu) applied to an activation as it is read.
struct ActQuant {
  bool on = false, relu = false;
  formulas::ChannelParams p;
  int qmin = 0, qmax = 0;
  __device__ float value(float v, bool& bit) const {
    if (!on) {
      bit = true;
      return v;
    }
    const formulas::FakeQuantOp<float, false> op{qmin, qmax};
    const float y = op.float_form(v, p, bit);
    return relu ? formulas::FakeQuantReluOp<float, false>::apply_relu(y, bit) : y;
  }
  // The backward of that fake quant: relu's select, or dy * mask.
  __device__ float grad(float dy, float v) const {
    bool bit;
    value(v, bit);
    if (relu) return bit ? dy : 0.0f;
    return dy * (bit ? 1.0f : 0.0f);
  }
};

__device__ ActQuant act_quant(float scale, std::int32_t zp, const QatMlpQuant& q, bool relu) {
  ActQuant a;
  a.on = true;
  a.relu = relu;
  a.p.scale = scale;
  a.p.inv_scale = formulas::inv_scale_of(scale);
  a.p.zp = zp;
  a.qmin = q.qmin;
  a.qmax = q.qmax;
  return a;
}

// An operand in storage: element (r, c) at p[r * ld + c] (rows x cols),
// through `act` when it is on.
struct Operand {
  const float* p;
  int ld, rows, cols;
  ActQuant act;
};

// K staged in shared memory at once: a unit's whole part when kper <= kStageK.
constexpr int kStageK = 128;
constexpr int kPad = 4;  // 16-byte rows; with the n = tx + 16 j mapping, conflict-free
constexpr int kStageA = std::max(kTileM * (kStageK + kPad), kStageK * (kTileM + kPad));
constexpr int kStageB = std::max(kTileN * (kStageK + kPad), kStageK * (kTileN + kPad));

struct Smem {
  float loss[kThreads];
  float wlo[kThreads / 32], whi[kThreads / 32];
  float old_min[kQatMlpMaxLayers + 1], old_max[kQatMlpMaxLayers + 1];
  float q_scale;
  std::int32_t q_zp;
  // Each activation fake quant's qparams as this block derived them in its
  // forward phase (the values block 0 stores): the backward reads them here.
  float slot_scale[kQatMlpMaxLayers + 1];
  std::int32_t slot_zp[kQatMlpMaxLayers + 1];
};
// A split product's parts meet in the shared memory of one thread-block
// cluster: the kCluster blocks of a cluster are ranks, and the ranks of one
// tile hold its parts (two buffers, alternating: a rank may store its next
// part while another still reads this one).
constexpr int kCluster = 8;
constexpr int kTileOutputs = kTileM * kTileN;
// The operand stages and the part buffers live in dynamic shared memory (over the 48 KB static limit).
constexpr std::size_t kDynamicSmem = sizeof(float) * (kStageA + kStageB + 2 * kTileOutputs);

__device__ __forceinline__ float* stage_a() {
  extern __shared__ float4 dyn_smem[];
  return reinterpret_cast<float*>(dyn_smem);
}
__device__ __forceinline__ float* stage_b() { return stage_a() + kStageA; }
__device__ __forceinline__ float* part_buffer(int flip) { return stage_b() + kStageB + (flip & 1) * kTileOutputs; }

// The stage of one operand: `extent` rows or columns of the tile (tile
// index t in [0, extent), at tile0 + t in the operand) by kc values of k from
// k0 (kc a multiple of kTileK), zero outside the operand and past ke.
// kAlongK: element (tile t, k) at p[(tile0 + t) * ld + k] and staged at
// [t][k] (row kc + kPad); else at p[k * ld + tile0 + t], staged at [k][t]
// (row extent + kPad). visit_groups(f) calls f(r, c) for each group of 4
// elements this thread copies (stage row r, first column c), so the same
// thread applies the fake quant to exactly what it copied (no barrier
// between the copy's wait and it).
template <bool kAlongK, int kExtent>
struct Stage {
  const Operand& op;
  int tile0, k0, ke, kc;
  float* smem;
  __device__ int row_len() const { return kAlongK ? kc + kPad : kExtent + kPad; }
  __device__ bool vector_ok() const {
    return op.ld % 4 == 0 && (reinterpret_cast<std::uintptr_t>(op.p) & 15) == 0 &&
           (kAlongK ? k0 % 4 == 0 : tile0 % 4 == 0);
  }
  // Groups of 4 elements along the contiguous direction.
  template <class F>
  __device__ void visit_groups(F f) const {
    const int groups_per_row = kAlongK ? kc / 4 : kExtent / 4;
    const int rows = kAlongK ? kExtent : kc;
    for (int g = threadIdx.x; g < rows * groups_per_row; g += kThreads) {
      const int r = g / groups_per_row, c = (g - r * groups_per_row) * 4;
      f(r, c);
    }
  }
  // How many of the group's 4 elements lie inside the operand (and below
  // ke); its storage row and first column.
  __device__ int group(int r, int c, int& row, int& col) const {
    const int t = kAlongK ? r : c, k = k0 + (kAlongK ? c : r);
    row = kAlongK ? tile0 + t : k;
    col = kAlongK ? k : tile0 + t;
    const int row_end = kAlongK ? op.rows : min(op.rows, ke);
    const int col_end = kAlongK ? min(op.cols, ke) : op.cols;
    return row < row_end ? min(4, max(0, col_end - col)) : 0;
  }
  __device__ void issue() const {
    const bool vec = vector_ok();
    const int len = row_len();
    visit_groups([&](int r, int c) {
      int row, col;
      const int valid = group(r, c, row, col);
      float* dst = smem + r * len + c;
      const float* src = op.p + (valid > 0 ? static_cast<std::int64_t>(row) * op.ld + col : 0);
      if (vec) {
        cp_async16(dst, src, valid * 4);
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) cp_async4(dst + e, valid > e ? src + e : op.p, valid > e ? 4 : 0);
      }
    });
  }
  // After the copies landed: the fake quant of this thread's own elements.
  __device__ void quantize() const {
    if (!op.act.on) return;
    const int len = row_len();
    visit_groups([&](int r, int c) {
      int row, col;
      const int valid = group(r, c, row, col);
      float* at = smem + r * len + c;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if (e < valid) {
          bool bit;
          at[e] = op.act.value(at[e], bit);
        }
      }
    });
  }
};

// One product of the step: C[M, N] = sum over k of A(m, k) B(k, n), in
// 64 x 32 tiles, each split along K over `ranks` ranks of a cluster (a power
// of two dividing kCluster): `parts` non-empty parts of kper (<= ranks). A
// unit is one cluster's share: kCluster / ranks tiles.
struct Gemm {
  int M, N, K, ranks, parts, kper, tiles_n, tiles, units;
  __device__ Gemm(int m, int n, int k, int split) : M(m), N(n), K(k), ranks(split) {
    parts = split_parts(k, split, kper);
    tiles_n = ceil_div(n, kTileN);
    tiles = ceil_div(m, kTileM) * tiles_n;
    units = ceil_div(tiles, kCluster / ranks);
  }
};

// This thread's outputs of a tile: rows ty * 4 + i, columns tx + 16 j.
__device__ __forceinline__ int out_row(int i) { return (threadIdx.x >> 4) * 4 + i; }
__device__ __forceinline__ int out_col(int j) { return (threadIdx.x & 15) + 16 * j; }

// This thread's 4 x 2 outputs of the tile at (m0, n0) over k in [kb, ke),
// each an FMA chain in increasing k. kAK: A(m, k) is stored at (m, k)
// (else at (k, m)); kBK: B(k, n) at (n, k) (else at (k, n)). Each stage of up
// to kStageK values of k is copied at once (cp.async, every load in flight);
// `between(A)` runs while the first stage's copies fly (it may set A's fake
// quant), then each thread fake-quantizes what it copied.
template <bool kAK, bool kBK, class Between>
__device__ void tile_product(Operand& A, const Operand& B, int m0, int n0, int kb, int ke, float (&acc)[4][2],
                             Between& between) {
#pragma unroll
  for (int i = 0; i < 4; ++i) acc[i][0] = acc[i][1] = 0.0f;
  float* const sa = stage_a();
  float* const sb = stage_b();
  const int ty = threadIdx.x >> 4, tx = threadIdx.x & 15;
  // The chunks cover whole kTileK steps past ke (zeros), as the FMA chains always have.
  const int kend = kb + ceil_div(ke - kb, kTileK) * kTileK;
  bool first = true;
  for (int k0 = kb; k0 < kend; k0 += kStageK) {
    const int kc = min(kStageK, kend - k0);
    __syncthreads();  // the previous stage's readers are done
    const Stage<kAK, kTileM> a{A, m0, k0, ke, kc, sa};
    const Stage<kBK, kTileN> b{B, n0, k0, ke, kc, sb};
    if (first) between.begin();  // its loads ahead of the copies
    a.issue();
    b.issue();
    if (first) between(A);
    first = false;
    cp_async_wait_all();
    a.quantize();
    b.quantize();
    __syncthreads();
    const int la = a.row_len(), lb = b.row_len();
    for (int k = 0; k < kc; k += 4) {
      float av[4][4], bv[2][4];  // [i or j][k + kk]
      if (kAK) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float4 v = *reinterpret_cast<const float4*>(sa + (ty * 4 + i) * la + k);
          av[i][0] = v.x, av[i][1] = v.y, av[i][2] = v.z, av[i][3] = v.w;
        }
      } else {
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
          const float4 v = *reinterpret_cast<const float4*>(sa + (k + kk) * la + ty * 4);
          av[0][kk] = v.x, av[1][kk] = v.y, av[2][kk] = v.z, av[3][kk] = v.w;
        }
      }
      if (kBK) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const float4 v = *reinterpret_cast<const float4*>(sb + (tx + 16 * j) * lb + k);
          bv[j][0] = v.x, bv[j][1] = v.y, bv[j][2] = v.z, bv[j][3] = v.w;
        }
      } else {
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
#pragma unroll
          for (int j = 0; j < 2; ++j) bv[j][kk] = sb[(k + kk) * lb + tx + 16 * j];
      }
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          acc[i][0] = __fmaf_rn(av[i][kk], bv[0][kk], acc[i][0]);
          acc[i][1] = __fmaf_rn(av[i][kk], bv[1][kk], acc[i][1]);
        }
    }
  }
}

struct NoBetween {
  __device__ void begin() const {}
  __device__ void operator()(Operand&) const {}
};

// A tile's parts summed in part order from the shared memory of its ranks
// (first_rank ..): rank `share` of the tile takes its P-th of the outputs
// (kTileOutputs / P consecutive ones in row-major order, 8 / P a thread),
// loads their epilogue operands and every part at once, then finishes them.
template <int P, class Epi>
__device__ void sum_parts(const Gemm& g, const float* buf, int first_rank, int share, int m0, int n0,
                          const Epi& epi) {
  constexpr int E = kTileOutputs / P / kThreads;
  cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
  typename Epi::Pre pre[E];
  float v[E][P];
  int o[E];
  bool ok[E];
#pragma unroll
  for (int e = 0; e < E; ++e) {
    o[e] = share * (kTileOutputs / P) + e * kThreads + threadIdx.x;
    ok[e] = m0 + o[e] / kTileN < g.M && n0 + o[e] % kTileN < g.N;
    if (ok[e]) pre[e] = epi.load(m0 + o[e] / kTileN, n0 + o[e] % kTileN);
  }
#pragma unroll
  for (int q = 0; q < P; ++q) {
    const float* part = cluster.map_shared_rank(buf, first_rank + q);
#pragma unroll
    for (int e = 0; e < E; ++e) v[e][q] = q < g.parts && ok[e] ? part[o[e]] : 0.0f;
  }
#pragma unroll
  for (int e = 0; e < E; ++e) {
    if (!ok[e]) continue;
    float acc = v[e][0];
#pragma unroll
    for (int q = 1; q < P; ++q)
      if (q < g.parts) acc = acc + v[e][q];
    epi.store(m0 + o[e] / kTileN, n0 + o[e] % kTileN, acc, pre[e]);
  }
}

// Unit u of product g on this block's rank of its cluster: part `rank %
// ranks` of tile u * (kCluster / ranks) + rank / ranks, then the epilogue
// for each output once the tile's K is complete: at once for one part; else
// each rank stores its part in its shared memory (part_buffer(flip)), the
// cluster meets, and the tile's ranks sum a share of its outputs each.
// Epi: load(m, n) -> Pre issues an output's epilogue loads (in flight
// together with the parts' loads), store(m, n, v, pre) finishes it. Every
// rank of the cluster calls it for the same units (the cluster barrier).
template <bool kAK, bool kBK, class Epi, class Between>
__device__ void run_unit(const Gemm& g, int u, Operand& A, const Operand& B, const Epi& epi, Between& between,
                         int& flip) {
  const int rank = static_cast<int>(cooperative_groups::this_cluster().block_rank());
  const int tile = u * (kCluster / g.ranks) + rank / g.ranks, part = rank % g.ranks;
  const int m0 = (tile / g.tiles_n) * kTileM, n0 = (tile % g.tiles_n) * kTileN;
  const bool has_tile = tile < g.tiles;
  float acc[4][2];
  if (g.ranks == 1) {
    if (!has_tile) return;
    tile_product<kAK, kBK>(A, B, m0, n0, 0, g.K, acc, between);
    typename Epi::Pre pre[4][2];
    const auto valid = [&](int i, int j) { return m0 + out_row(i) < g.M && n0 + out_col(j) < g.N; };
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 2; ++j)
        if (valid(i, j)) pre[i][j] = epi.load(m0 + out_row(i), n0 + out_col(j));
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 2; ++j)
        if (valid(i, j)) epi.store(m0 + out_row(i), n0 + out_col(j), acc[i][j], pre[i][j]);
    return;
  }
  float* const buf = part_buffer(flip++);
  if (has_tile && part < g.parts) {
    const int kb = part * g.kper, ke = min(g.K, kb + g.kper);
    tile_product<kAK, kBK>(A, B, m0, n0, kb, ke, acc, between);
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 2; ++j) buf[out_row(i) * kTileN + out_col(j)] = acc[i][j];
  }
  cooperative_groups::this_cluster().sync();  // every part of the cluster's tiles is stored
  if (!has_tile) return;
  const int first_rank = rank - part;
  switch (g.ranks) {
    case 2: sum_parts<2>(g, buf, first_rank, part, m0, n0, epi); break;
    case 4: sum_parts<4>(g, buf, first_rank, part, m0, n0, epi); break;
    default: sum_parts<8>(g, buf, first_rank, part, m0, n0, epi); break;
  }
}

// The forward's epilogue: z = product + bias, and the block's running range of z.
struct ForwardEpi {
  const float* bias;
  float* z;
  int n_features;
  float& lo;
  float& hi;
  using Pre = float;
  __device__ float load(int, int n) const { return bias ? __ldg(bias + n) : 0.0f; }
  __device__ void store(int m, int n, float v, float b) const {
    if (bias) v = v + b;
    __stcg(z + static_cast<std::int64_t>(m) * n_features + n, v);
    lo = formulas::min_combine(lo, v);
    hi = formulas::max_combine(hi, v);
  }
};

// dW's epilogue: times the weight fake quant's straight-through mask, into
// (or onto) the weight's gradient.
struct WeightGradEpi {
  const QatMlpLayer& l;
  formulas::FakeQuantOp<float, true> wop;
  struct Pre {
    float scale, weight, old;
    std::int32_t zp;
  };
  __device__ Pre load(int m, int n) const {
    const std::int64_t at = static_cast<std::int64_t>(m) * l.in_features + n;
    Pre p;
    p.scale = __ldcg(l.weight_quant.scale + m);
    p.zp = __ldcg(l.weight_quant.zero_point + m);
    p.weight = __ldg(l.weight + at);
    p.old = l.accumulate_weight_grad ? l.weight_grad[at] : 0.0f;
    return p;
  }
  __device__ void store(int m, int n, float v, const Pre& pre) const {
    formulas::ChannelParams p;
    p.scale = pre.scale;
    p.inv_scale = formulas::inv_scale_of(p.scale);
    p.zp = pre.zp;
    bool bit;
    wop.float_form(pre.weight, p, bit);
    float gv = v * (bit ? 1.0f : 0.0f);  // fake quant's straight-through mask
    if (l.accumulate_weight_grad) gv = pre.old + gv;
    l.weight_grad[static_cast<std::int64_t>(m) * l.in_features + n] = gv;
  }
};

// dx's epilogue: under the previous activation's fake quant (+ relu) mask.
struct InputGradEpi {
  float* dz_prev;
  const float* z_prev;
  int k_features;
  ActQuant act_in;
  using Pre = float;
  __device__ float load(int m, int n) const { return __ldcg(z_prev + static_cast<std::int64_t>(m) * k_features + n); }
  __device__ void store(int m, int n, float v, float z) const {
    __stcg(dz_prev + static_cast<std::int64_t>(m) * k_features + n, act_in.grad(v, z));
  }
};

// Where the kernel stamps %globaltimer after each grid barrier (block 0,
// thread 0; null: nowhere): qat_mlp_record_phases, for dev/cuda/qat_mlp_phases.cu.
std::uint64_t* g_phase_clock = nullptr;

__device__ void stamp(std::uint64_t* clock, int k) {
  if (clock && blockIdx.x == 0 && threadIdx.x == 0) {
    std::uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    clock[k] = t;
  }
}

// Fake quant `slot` (0: the input, l: layer l - 1's output).
__device__ const QatMlpQuant& quant_of(const QatMlpArgs& a, int slot) {
  return slot == 0 ? a.input_quant : a.layers[slot - 1].output_quant;
}

// The per-tensor ranges meet in device words by atomicMax on order-preserving
// keys: exact and independent of arrival order (min_combine / max_combine's
// order: NaN first, then -0 below +0). 0 is "nothing seen"; both keys of a
// NaN are all ones. The words sit at the top of block_counters and are left
// at 0 for the next launch.
constexpr int kRangeWords = 2 * (kQatMlpMaxLayers + 1);
// KeyOf's key as unsigned (the same order), so that 0 can mean "nothing seen".
__device__ __forceinline__ unsigned ordered_bits(float v) {
  return static_cast<unsigned>(KeyOf<float>::encode(v)) ^ 0x80000000u;
}
__device__ __forceinline__ float from_ordered_bits(unsigned k) {
  return KeyOf<float>::decode(static_cast<int>(k ^ 0x80000000u));
}
__device__ __forceinline__ unsigned min_key(float v) { return v != v ? 0xFFFFFFFFu : ~ordered_bits(v); }
__device__ __forceinline__ unsigned max_key(float v) { return v != v ? 0xFFFFFFFFu : ordered_bits(v); }
__device__ __forceinline__ float min_of_key(unsigned k) {
  return k == 0xFFFFFFFFu ? NAN : (k == 0 ? INFINITY : from_ordered_bits(~k));
}
__device__ __forceinline__ float max_of_key(unsigned k) {
  return k == 0xFFFFFFFFu ? NAN : (k == 0 ? -INFINITY : from_ordered_bits(k));
}

// Fake quant `slot`'s range (every block reads the same words: thread 0
// loads them, begin()), the running range read at the start moved by it and
// the qparams (finish()); block 0 stores them.
struct QuantWords {
  const QatMlpArgs& a;
  const std::uint32_t* ranges;
  int slot;
  unsigned kmin = 0, kmax = 0;
  __device__ void begin() {
    if (threadIdx.x == 0) kmin = __ldcg(ranges + 2 * slot), kmax = __ldcg(ranges + 2 * slot + 1);
  }
  __device__ void finish(Smem& s, float& scale, std::int32_t& zp) const {
    if (threadIdx.x == 0) {
      const QatMlpQuant& q = quant_of(a, slot);
      float run_min = s.old_min[slot], run_max = s.old_max[slot];
      formulas::observer_update(run_min, run_max, min_of_key(kmin), max_of_key(kmax), q.averaging_constant, q.moving);
      formulas::observer_qparams(run_min, run_max, q.qmin, q.qmax, q.symmetric, q.symmetric_zero_point, s.q_scale,
                                 s.q_zp);
      if (blockIdx.x == 0) {
        q.run_min[0] = run_min;
        q.run_max[0] = run_max;
        q.scale[0] = s.q_scale;
        q.zero_point[0] = s.q_zp;
      }
    }
    __syncthreads();
    scale = s.q_scale;
    zp = s.q_zp;
  }
};

// The forward's `between`: A's fake quant from the qparams, once a block.
struct ForwardQuant {
  QuantWords words;
  Smem& s;
  bool relu_in;
  bool have = false;
  __device__ void begin() {
    if (!have) words.begin();
  }
  __device__ void operator()(Operand& op) {
    if (have) return;
    float scale;
    std::int32_t zp;
    words.finish(s, scale, zp);
    op.act = act_quant(scale, zp, quant_of(words.a, words.slot), relu_in);
    if (threadIdx.x == 0) s.slot_scale[words.slot] = scale, s.slot_zp[words.slot] = zp;
    have = true;
  }
};

// Adds this block's range of fake quant `slot` to its words.
__device__ void store_range(std::uint32_t* ranges, int slot, float lo, float hi, Smem& s) {
  warp_minmax(lo, hi);
  const int warp = threadIdx.x >> 5;
  if ((threadIdx.x & 31) == 0) s.wlo[warp] = lo, s.whi[warp] = hi;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int k = 1; k < kThreads / 32; ++k) {
      lo = formulas::min_combine(lo, s.wlo[k]);
      hi = formulas::max_combine(hi, s.whi[k]);
    }
    atomicMax(ranges + 2 * slot, min_key(lo));
    atomicMax(ranges + 2 * slot + 1, max_key(hi));
  }
}

// Phase 0's per-channel weight observers + fake quants. A row goes to a
// group of `group` warps of one block (a power of two, as wide as lets every
// row start in the first round): thread t of the group reads columns t,
// t + 32 group, ... (up to kRowRegs of them in registers; longer rows are
// read twice), the warps' ranges meet in shared memory in warp order, and
// every thread of the group derives the row's qparams. The step is bound by
// one warp's instruction chain here: a warp a row (1700 instructions) took
// 6 µs for the b256 step's 522 rows (ncu, docs/benchmarks.md, forty-third
// session).
constexpr int kRowRegs = 16;

__device__ int weight_row_group(int rows, int grid) {
  int group = kThreads / 32;
  while (group > 1 && rows > grid * (kThreads / 32 / group)) group /= 2;
  return group;
}

__device__ void quantize_weight_rows(const QatMlpArgs& a, float* ws, const QatMlpWorkspace& w, Smem& s) {
  int rows = 0;
  for (int i = 0; i < a.num_layers; ++i) rows += a.layers[i].out_features;
  const int grid = static_cast<int>(gridDim.x), warp = threadIdx.x >> 5;
  const int group = weight_row_group(rows, grid), groups = kThreads / 32 / group;
  const int first_warp = warp / group * group, width = group * 32;
  const int t = static_cast<int>(threadIdx.x) - 32 * first_warp;  // the thread's place in its group
  // Every thread runs every round (the barriers); row gr = block + grid * (group slot + groups * round).
  const int rounds = ceil_div(rows, grid * groups);
  for (int round = 0; round < rounds; ++round) {
    int gr = blockIdx.x + grid * (warp / group + groups * round), i = 0;
    const bool has_row = gr < rows;
    if (has_row)
      while (gr >= a.layers[i].out_features) gr -= a.layers[i++].out_features;
    const QatMlpLayer& l = a.layers[i];
    const QatMlpQuant& q = l.weight_quant;
    const int k = l.in_features, r = gr;
    const float* row = l.weight + static_cast<std::int64_t>(r) * k;
    float run_min = 0.0f, run_max = 0.0f;
    if (has_row) {
      run_min = q.run_min[r];  // loaded with the row
      run_max = q.run_max[r];
    }
    const bool in_registers = k <= kRowRegs * width;
    float v[kRowRegs];
    float lo = INFINITY, hi = -INFINITY;
    if (has_row) {
      for (int c0 = 0; c0 < k; c0 += kRowRegs * width) {
        // Columns past the row repeat its first element (neutral for min and max).
#pragma unroll
        for (int j = 0; j < kRowRegs; ++j) {
          const int c = c0 + j * width + t;
          v[j] = __ldg(row + (c < k ? c : 0));
        }
        float clo, chi;
        warp_minmax_values(v, clo, chi);
        lo = formulas::min_combine(lo, clo);
        hi = formulas::max_combine(hi, chi);
      }
    }
    if ((threadIdx.x & 31) == 0) s.wlo[warp] = lo, s.whi[warp] = hi;
    __syncthreads();
    lo = s.wlo[first_warp];
    hi = s.whi[first_warp];
    for (int o = 1; o < group; ++o) {
      lo = formulas::min_combine(lo, s.wlo[first_warp + o]);
      hi = formulas::max_combine(hi, s.whi[first_warp + o]);
    }
    __syncthreads();  // read before the next round's ranges land
    if (!has_row) continue;
    float scale = 1.0f;
    std::int32_t zp = 0;
    formulas::observer_update(run_min, run_max, lo, hi, q.averaging_constant, q.moving);
    formulas::observer_qparams(run_min, run_max, q.qmin, q.qmax, q.symmetric, q.symmetric_zero_point, scale, zp);
    if (t == 0) {
      q.run_min[r] = run_min;
      q.run_max[r] = run_max;
      q.scale[r] = scale;
      q.zero_point[r] = zp;
    }
    formulas::ChannelParams p;
    p.scale = scale;
    p.inv_scale = formulas::inv_scale_of(scale);
    p.zp = zp;
    const formulas::FakeQuantOp<float, true> op{q.qmin, q.qmax};
    float* out = ws + w.wq[i] + static_cast<std::int64_t>(r) * k;
    for (int c0 = 0; c0 < k; c0 += kRowRegs * width) {
#pragma unroll
      for (int j = 0; j < kRowRegs; ++j) {
        const int c = c0 + j * width + t;
        if (c < k) {
          bool bit;
          __stcg(out + c, op.float_form(in_registers ? v[j] : __ldg(row + c), p, bit));
        }
      }
    }
  }
}

// One unit of a bias gradient: db[n] = sum over b of dz[b, n] for 32
// columns; the block's 8 warps take every 8th row (4 loads in flight each),
// then their sums meet in warp order.
__device__ void bias_grad_unit(const QatMlpLayer& l, const float* dz, int batch, int unit, Smem& s) {
  const int n_features = l.out_features, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int n = unit * 32 + lane;
  float sum = 0.0f;
  if (n < n_features) {
    int b = warp;
    for (; b + 24 < batch; b += 32) {
      const float v0 = __ldcg(dz + static_cast<std::int64_t>(b) * n_features + n);
      const float v1 = __ldcg(dz + static_cast<std::int64_t>(b + 8) * n_features + n);
      const float v2 = __ldcg(dz + static_cast<std::int64_t>(b + 16) * n_features + n);
      const float v3 = __ldcg(dz + static_cast<std::int64_t>(b + 24) * n_features + n);
      sum = ((sum + v0) + v1) + v2;
      sum = sum + v3;
    }
    for (; b < batch; b += 8) sum += __ldcg(dz + static_cast<std::int64_t>(b) * n_features + n);
  }
  __syncthreads();  // s.loss is free (the previous unit's readers are done)
  s.loss[threadIdx.x] = sum;
  __syncthreads();
  if (warp == 0 && n < n_features) {
    float total = s.loss[lane];
    for (int w = 1; w < kThreads / 32; ++w) total += s.loss[w * 32 + lane];
    if (l.accumulate_bias_grad) total = l.bias_grad[n] + total;
    l.bias_grad[n] = total;
  }
}

__global__ void __cluster_dims__(kCluster, 1, 1) __launch_bounds__(kThreads, kMaxBlocksPerSm)
    qat_mlp_kernel(const __grid_constant__ QatMlpArgs a) {
  ::qgrad::cuda::wait_for_prior_kernels();
  __shared__ Smem s;
  cooperative_groups::grid_group grid = cooperative_groups::this_grid();
  const QatMlpWorkspace& w = a.offsets;
  float* const ws = a.workspace;
  std::uint32_t* const counters = a.counters;
  std::uint32_t* const ranges = counters + (::qgrad::cuda::kBlockCounters - kRangeWords);
  const int L = a.num_layers, B = a.batch;
  const int gthread = blockIdx.x * kThreads + threadIdx.x, nthreads = gridDim.x * kThreads;
  // The products' units go to clusters (blockIdx.x / kCluster: a 1-D grid's clusters are runs of blocks).
  const int cluster_id = blockIdx.x / kCluster, clusters = gridDim.x / kCluster;
  int flip = 0;  // run_unit's part buffer

  int phase = 0;
  stamp(a.phase_clock, phase++);
  // ---- phase 0 ----
  // The per-tensor running ranges as they were: block 0 moves them later.
  if (threadIdx.x <= L) {
    const QatMlpQuant& q = quant_of(a, threadIdx.x);
    s.old_min[threadIdx.x] = q.run_min[0];
    s.old_max[threadIdx.x] = q.run_max[0];
  }
  {
    quantize_weight_rows(a, ws, w, s);
    float lo = INFINITY, hi = -INFINITY;
    const std::int64_t n = std::int64_t{B} * a.layers[0].in_features;
    std::int64_t e = gthread;
    for (; e + 3 * std::int64_t{nthreads} < n; e += 4 * std::int64_t{nthreads}) {  // four loads in flight
      float v[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) v[j] = __ldg(a.x + e + j * std::int64_t{nthreads});
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        lo = formulas::min_combine(lo, v[j]);
        hi = formulas::max_combine(hi, v[j]);
      }
    }
    for (; e < n; e += nthreads) {
      const float v = __ldg(a.x + e);
      lo = formulas::min_combine(lo, v);
      hi = formulas::max_combine(hi, v);
    }
    store_range(ranges, 0, lo, hi, s);
  }
  grid.sync();
  stamp(a.phase_clock, phase++);

  // ---- forward: layer i reads act_i (fake quant slot i) and writes z_i ----
  for (int i = 0; i < L; ++i) {
    const QatMlpLayer& l = a.layers[i];
    const bool relu_in = i > 0 && a.layers[i - 1].relu;
    // A's fake quant is set from the qparams while the block's first stage loads.
    Operand A{i == 0 ? a.x : ws + w.z[i - 1], l.in_features, B, l.in_features, ActQuant{}};
    ForwardQuant quant_in{QuantWords{a, ranges, i}, s, relu_in};
    const Operand Wq{ws + w.wq[i], l.in_features, l.out_features, l.in_features, ActQuant{}};
    const Gemm g(B, l.out_features, l.in_features, l.split_forward);
    float* z = ws + w.z[i];
    float lo = INFINITY, hi = -INFINITY;
    for (int u = cluster_id; u < g.units; u += clusters)
      run_unit<true, true>(g, u, A, Wq, ForwardEpi{l.bias, z, g.N, lo, hi}, quant_in, flip);
    quant_in.begin();  // every block derives the qparams (the backward's), block 0 stores them, unit or not
    quant_in(A);
    store_range(ranges, i + 1, lo, hi, s);
    grid.sync();
  stamp(a.phase_clock, phase++);
  }

  // ---- loss: logits = fq_L(z_L); per row log-sum-exp and dz_L ----
  {
    const QatMlpLayer& l = a.layers[L - 1];
    float scale;
    std::int32_t zp;
    QuantWords words{a, ranges, L};
    words.begin();
    words.finish(s, scale, zp);
    const ActQuant act = act_quant(scale, zp, l.output_quant, l.relu);
    const int C = l.out_features;
    const float* z = ws + w.z[L - 1];
    float* dz = ws + w.dz[L - 1];
    const float g_over_b = 1.0f / static_cast<float>(B);
    float loss = 0.0f;
    // A warp a row, the rows dealt across the blocks first; lane c holds
    // classes c, c + 32, ...; the sum over classes runs in class order
    // (shuffled to every lane), as one thread's loop would.
    const int lane = threadIdx.x & 31, warps = nthreads >> 5;
    constexpr int kLossRegs = 4;  // up to 128 classes in registers
    for (int b = blockIdx.x + (threadIdx.x >> 5) * gridDim.x; b < B; b += warps) {
      const float* zr = z + static_cast<std::int64_t>(b) * C;
      const std::int64_t label = a.labels_s64 ? static_cast<const std::int64_t*>(a.labels)[b]
                                              : static_cast<const std::int32_t*>(a.labels)[b];
      if (C > kLossRegs * 32) {  // wide rows: one lane, the plain loop
        if (lane == 0) {
          bool bit;
          float mx = act.value(__ldcg(zr), bit);
          for (int c = 1; c < C; ++c) mx = formulas::max_nan(mx, act.value(__ldcg(zr + c), bit));
          float sum = 0.0f, at_label = 0.0f;
          for (int c = 0; c < C; ++c) {
            const float v = act.value(__ldcg(zr + c), bit);
            sum += formulas::exp_m(v - mx);
            if (c == label) at_label = v;
          }
          const bool valid = label >= 0 && label < C;
          loss += valid ? formulas::log_m(sum) - (at_label - mx) : formulas::quiet_nan<float>();
          for (int c = 0; c < C; ++c) {
            const float zc = __ldcg(zr + c);
            const float v = act.value(zc, bit);
            const float p = formulas::exp_m(v - mx) / sum;
            const float d = valid ? formulas::cross_entropy_grad(p, c == label, g_over_b) : formulas::quiet_nan<float>();
            __stcg(dz + static_cast<std::int64_t>(b) * C + c, act.grad(d, zc));
          }
        }
        continue;
      }
      float zc[kLossRegs], v[kLossRegs], e[kLossRegs];
#pragma unroll
      for (int j = 0; j < kLossRegs; ++j) zc[j] = j * 32 + lane < C ? __ldcg(zr + j * 32 + lane) : 0.0f;
      float mx = -INFINITY;
      bool first = true;
#pragma unroll
      for (int j = 0; j < kLossRegs; ++j) {
        bool bit;
        v[j] = act.value(zc[j], bit);
        if (j * 32 + lane < C) mx = first ? v[j] : formulas::max_nan(mx, v[j]);
        first = false;
      }
      // max_nan is order-free up to which NaN wins (any NaN row is all NaN below).
      for (int w = 16; w > 0; w /= 2) {
        const float o = __shfl_xor_sync(0xffffffffu, mx, w);
        mx = formulas::max_nan(mx, o);
      }
#pragma unroll
      for (int j = 0; j < kLossRegs; ++j) e[j] = formulas::exp_m(v[j] - mx);
      float sum = 0.0f, at_label = 0.0f;
#pragma unroll
      for (int j = 0; j < kLossRegs; ++j) {
        if (j * 32 >= C) break;
        for (int src = 0; src < 32 && j * 32 + src < C; ++src) sum += __shfl_sync(0xffffffffu, e[j], src);
        const float vl = __shfl_sync(0xffffffffu, v[j], static_cast<int>(label & 31));
        if (label >= j * 32 && label < j * 32 + 32) at_label = vl;
      }
      const bool valid = label >= 0 && label < C;
      if (lane == 0) loss += valid ? formulas::log_m(sum) - (at_label - mx) : formulas::quiet_nan<float>();
#pragma unroll
      for (int j = 0; j < kLossRegs; ++j) {
        const int c = j * 32 + lane;
        if (c < C) {
          const float p = e[j] / sum;
          const float d = valid ? formulas::cross_entropy_grad(p, c == label, g_over_b) : formulas::quiet_nan<float>();
          __stcg(dz + static_cast<std::int64_t>(b) * C + c, act.grad(d, zc[j]));
        }
      }
    }
    s.loss[threadIdx.x] = loss;
    __syncthreads();
    for (int k = kThreads / 2; k > 0; k /= 2) {
      if (threadIdx.x < k) s.loss[threadIdx.x] += s.loss[threadIdx.x + k];
      __syncthreads();
    }
    if (threadIdx.x == 0) ws[w.loss_parts + blockIdx.x] = s.loss[0];
  }
  grid.sync();
  stamp(a.phase_clock, phase++);

  // ---- backward, from the last layer ----
  // Every range word has been read: back to 0 for the next launch.
  if (blockIdx.x == 0 && threadIdx.x < kRangeWords) ranges[threadIdx.x] = 0;
  if (blockIdx.x == gridDim.x - 1) {
    // The blocks' parts summed in block order by one thread, from shared
    // memory: every load in flight at once, not a round trip per part. The
    // last block: the last cluster is the likeliest to have no unit in the
    // first backward phase (units go to clusters from 0), so no cluster waits.
    float sum = 0.0f;
    for (unsigned k0 = 0; k0 < gridDim.x; k0 += kThreads) {
      __syncthreads();  // s.loss is free
      if (k0 + threadIdx.x < gridDim.x) s.loss[threadIdx.x] = __ldcg(ws + w.loss_parts + k0 + threadIdx.x);
      __syncthreads();
      if (threadIdx.x == 0)
        for (unsigned k = k0; k < min(gridDim.x, k0 + kThreads); ++k) sum += s.loss[k - k0];
    }
    if (threadIdx.x == 0) a.loss[0] = sum / static_cast<float>(B);
  }
  for (int i = L - 1; i >= 0; --i) {
    const QatMlpLayer& l = a.layers[i];
    const int N = l.out_features, K = l.in_features;
    // act_i's fake quant, from the qparams this block derived in its forward phase.
    const QatMlpQuant& qi = quant_of(a, i);
    const ActQuant act_in = act_quant(s.slot_scale[i], s.slot_zp[i], qi, i > 0 && a.layers[i - 1].relu);
    const float* dz = ws + w.dz[i];
    // The units' counts only; each unit builds its operands (fewer registers
    // held through the loop: the dW epilogue spilled with them live).
    const int gw_units = Gemm(N, K, B, l.split_weight_grad).units;
    const int dx_units = i > 0 ? Gemm(B, K, N, l.split_input_grad).units : 0;
    const int db_columns = l.bias_grad ? ceil_div(N, 32) : 0;  // bias_grad_unit's, kCluster a unit
    const int db_units = ceil_div(db_columns, kCluster);
    NoBetween none;
    for (int u = cluster_id; u < gw_units + dx_units + db_units; u += clusters) {
      if (u < gw_units) {
        // dW_i[n, k] = sum_b dz_i[b, n] act_i[b, k]
        Operand dz_t{dz, N, B, N, ActQuant{}};  // A(m = n, k = b) at (b, n)
        const Operand act{i == 0 ? a.x : ws + w.z[i - 1], K, B, K, act_in};  // B(k = b, n = k) at (b, k)
        const formulas::FakeQuantOp<float, true> wop{l.weight_quant.qmin, l.weight_quant.qmax};
        run_unit<false, false>(Gemm(N, K, B, l.split_weight_grad), u, dz_t, act, WeightGradEpi{l, wop}, none, flip);
      } else if (u < gw_units + dx_units) {
        // dz_{i-1}[b, k] = mask(z_{i-1}[b, k]) (sum_n dz_i[b, n] Wq_i[n, k])
        Operand dz_a{dz, N, B, N, ActQuant{}};                // A(m = b, k = n) at (b, n)
        const Operand wq{ws + w.wq[i], K, N, K, ActQuant{}};  // B(k = n, n = k) at (n, k)
        run_unit<true, false>(Gemm(B, K, N, l.split_input_grad), u - gw_units, dz_a, wq,
                              InputGradEpi{ws + w.dz[i - 1], ws + w.z[i - 1], K, act_in}, none, flip);
      } else {
        const int rank = static_cast<int>(cooperative_groups::this_cluster().block_rank());
        const int column_unit = (u - gw_units - dx_units) * kCluster + rank;
        if (column_unit < db_columns) bias_grad_unit(l, dz, B, column_unit, s);
      }
    }
    if (i > 0) grid.sync();
    stamp(a.phase_clock, phase++);
  }
  // A block's shared memory must outlive its cluster's reads of it: the last
  // phase's ranks may still sum this block's part.
  if (a.layers[0].split_weight_grad > 1) cooperative_groups::this_cluster().sync();
}

}  // namespace

bool qat_mlp_available(int device) { return ::qgrad::cuda::cooperative_launch(device); }

bool qat_mlp_plan(QatMlpArgs& a) {
  const int dev = a.device;
  if (!qat_mlp_available(dev)) return false;
  // Blocks resident at once in whole clusters with the kernel's registers and
  // shared memory: asked once per device, not every step (-1: none).
  static int resident[16] = {};
  int& blocks = resident[std::min(dev, 15)];
  if (blocks == 0) {
    QGRAD_CUDA_CHECK(cudaFuncSetAttribute(qat_mlp_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(kDynamicSmem)));
    int per_sm = 0, clusters = 0;
    QGRAD_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, qat_mlp_kernel, kThreads, kDynamicSmem));
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(static_cast<unsigned>(::qgrad::cuda::multiprocessor_count(dev) *
                                                std::min(per_sm, kMaxBlocksPerSm)));
    config.blockDim = dim3(kThreads);
    config.dynamicSmemBytes = kDynamicSmem;
    QGRAD_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, qat_mlp_kernel, &config));
    blocks = std::min(static_cast<int>(config.gridDim.x), clusters * kCluster) / kCluster * kCluster;
    if (blocks == 0) blocks = -1;
  }
  if (blocks < kCluster) return false;
  a.grid = blocks;
  a.counters = ::qgrad::cuda::block_counters(dev);
  const int clusters = a.grid / kCluster;
  // Split K over as many ranks a tile as one round of units allows: a power
  // of two up to kCluster and to the chunks (kTileK) of K; in a backward
  // phase the larger of the two products' splits is halved first (the bias
  // gradient's units, kCluster columns of 32 a unit, come on top).
  const auto ranks_for = [](int k) {
    int r = 1;
    while (2 * r <= std::min(kCluster, ceil_div(k, kTileK))) r *= 2;
    return r;
  };
  const auto units = [](int tiles, int ranks) { return ceil_div(tiles, kCluster / ranks); };
  const int b = a.batch;
  for (int i = 0; i < a.num_layers; ++i) {
    QatMlpLayer& l = a.layers[i];
    const int n = l.out_features, k = l.in_features;
    const int f_tiles = ceil_div(b, kTileM) * ceil_div(n, kTileN);
    int rf = ranks_for(k);
    while (rf > 1 && units(f_tiles, rf) > clusters) rf /= 2;
    l.split_forward = rf;
    const int dw_tiles = ceil_div(n, kTileM) * ceil_div(k, kTileN);
    const int dx_tiles = i > 0 ? ceil_div(b, kTileM) * ceil_div(k, kTileN) : 0;
    const int db_units = l.bias_grad ? ceil_div(ceil_div(n, 32), kCluster) : 0;
    int rw = ranks_for(b), rx = i > 0 ? ranks_for(n) : 1;
    while (std::max(rw, rx) > 1 && units(dw_tiles, rw) + units(dx_tiles, rx) + db_units > clusters) {
      if (rw >= rx) rw /= 2;
      else rx /= 2;
    }
    l.split_weight_grad = rw;
    l.split_input_grad = rx;
  }
  a.offsets = workspace_of(a);
  return true;
}

void qat_mlp_record_phases(std::uint64_t* device_words) { g_phase_clock = device_words; }

void qat_mlp_forward_backward(const QatMlpArgs& args) {
  QatMlpArgs a = args;
  a.phase_clock = g_phase_clock;
  ::qgrad::cuda::launch_cooperative_kernel(a.device, qat_mlp_kernel, static_cast<unsigned>(a.grid), kThreads, kDynamicSmem, a);
}

}  // namespace qgrad::kernels::cuda
