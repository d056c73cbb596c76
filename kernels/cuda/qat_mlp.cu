// The QAT MLP's forward, loss and backward as one persistent kernel
// (kernels/qat_mlp.h). A small MLP's step is bound by kernel count, not by
// work: the b256 784-256-256-10 step was 35 kernel nodes at ~3.4 µs each for
// ~310 MFLOP (docs/benchmarks.md, issue #16). Here every block of one
// cooperative grid runs the phases in turn, with a grid barrier between
// each phase and the next:
//   0      the weights' per-channel observers + fake quants (a warp a row,
//          into the workspace); the input's partial min/max;
//   1..L   layer l: the previous fake quant's qparams from the partials
//          (every block combines them; block 0 stores the state), then
//          z_l = act_{l-1} · Wq_lᵀ + b_l with act_{l-1} fake-quantized (and
//          relu'd) as it is loaded, and z_l's partial min/max;
//   L+1    the logits' qparams, cross-entropy per row, dz_L;
//   L+2..  per layer from the last: dW_l (times the weight fake quant's
//          mask), db_l, and dz_{l-1} = (dz_l · Wq_l) under act_{l-1}'s mask.
// The products are tiles of 64 x 32 outputs on FFMA (f32 products as
// cuBLAS's f32 GEMM forms them, in another order); tiles that would leave
// SMs idle are split along K, each part stored and the last part of a tile
// to arrive summing the parts in part order (the same bits on every run).
// Every other formula is the unfused ops' (kernels/formulas/*.h).
// Measured (H200, fortieth session): correct, but the b256 step's kernel is
// 133 µs in 8 phases of 10-26 µs (dev/cuda/qat_mlp_phases.cu), slower than
// the composed ops' 35 nodes; a barrier alone is ~1 µs (dev/cuda/grid_barrier.cu).
#include <cooperative_groups.h>

#include <algorithm>
#include <cstdint>

#include "qgrad/core/cuda/common.cuh"
#include "qgrad/kernels/cuda/entries.h"
#include "qgrad/kernels/cuda/minmax.cuh"
#include "qgrad/kernels/formulas/observer.h"
#include "qgrad/kernels/formulas/quantize.h"
#include "qgrad/kernels/formulas/softmax.h"

namespace qgrad::kernels::cuda {

namespace {

constexpr int kThreads = 256;  // = kMinmaxThreads (block_minmax)
constexpr int kTileM = 64, kTileN = 32, kTileK = 32;
constexpr int kMaxBlocksPerSm = 2;
static_assert(kThreads == static_cast<int>(kMinmaxThreads));

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
    int kper = 0;
    w.wq[i] = take(n * k);
    w.z[i] = take(b * n);
    w.dz[i] = take(b * n);
    const int pf = split_parts(l.in_features, l.split_forward, kper);
    const int pw = split_parts(a.batch, l.split_weight_grad, kper);
    const int px = split_parts(l.out_features, l.split_input_grad, kper);
    w.fwd_parts[i] = pf > 1 ? take(pf * b * n) : -1;
    w.dw_parts[i] = pw > 1 ? take(pw * n * k) : -1;
    w.dx_parts[i] = (i > 0 && px > 1) ? take(px * b * k) : -1;
  }
  w.minmax = take(std::int64_t{2} * (a.num_layers + 1) * a.grid);
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

// An operand in storage: element (r, c) at p[r * ld + c], zero outside
// rows x cols, through `act` when it is on.
struct Operand {
  const float* p;
  int ld, rows, cols;
  ActQuant act;
  __device__ float at(int r, int c) const {
    if (r >= rows || c >= cols) return 0.0f;
    bool bit;
    return act.value(__ldcg(p + static_cast<std::int64_t>(r) * ld + c), bit);
  }
};

struct Smem {
  float a[kTileK][kTileM + 4];  // A's chunk, k-major (+4: 16-byte rows, fewer bank conflicts)
  float b[kTileK][kTileN + 4];
  float loss[kThreads];
  float old_min[kQatMlpMaxLayers + 1], old_max[kQatMlpMaxLayers + 1];
  bool last;
};

// One product of the step: C[M, N] = sum over k of A(m, k) B(k, n).
struct Gemm {
  int M, N, K, parts, kper, tiles_n, units;
  float* part_buf;           // parts x M x N (parts > 1)
  std::uint32_t* counters;   // one per tile (parts > 1)
  __device__ Gemm(int m, int n, int k, int split, float* buf, std::uint32_t* cnt)
      : M(m), N(n), K(k), part_buf(buf), counters(cnt) {
    parts = split_parts(k, split, kper);
    tiles_n = ceil_div(n, kTileN);
    units = ceil_div(m, kTileM) * tiles_n * parts;
  }
};

// This thread's 4 x 2 outputs of the tile at (m0, n0) over k in [kb, ke).
// kAK: A(m, k) is stored at (m, k) (else at (k, m)); kBK: B(k, n) at (n, k)
// (else at (k, n)). The next chunk is loaded into registers while this one
// is multiplied.
template <bool kAK, bool kBK>
__device__ void tile_product(const Operand& A, const Operand& B, int m0, int n0, int kb, int ke, float (&acc)[4][2],
                             Smem& s) {
  const int t = threadIdx.x, ty = t >> 4, tx = t & 15;
#pragma unroll
  for (int i = 0; i < 4; ++i) acc[i][0] = acc[i][1] = 0.0f;
  float ra[8], rb[4];
  const auto a_index = [&](int e, int& m, int& k) {
    if (kAK) m = e >> 5, k = e & 31;
    else m = e & 63, k = e >> 6;
  };
  const auto b_index = [&](int e, int& n, int& k) {
    if (kBK) n = e >> 5, k = e & 31;
    else n = e & 31, k = e >> 5;
  };
  const auto load = [&](int k0) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      int m, k;
      a_index(t + i * kThreads, m, k);
      const int kk = k0 + k;
      ra[i] = kk < ke ? (kAK ? A.at(m0 + m, kk) : A.at(kk, m0 + m)) : 0.0f;
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      int n, k;
      b_index(t + i * kThreads, n, k);
      const int kk = k0 + k;
      rb[i] = kk < ke ? (kBK ? B.at(n0 + n, kk) : B.at(kk, n0 + n)) : 0.0f;
    }
  };
  load(kb);
  for (int k0 = kb; k0 < ke; k0 += kTileK) {
    __syncthreads();  // the previous chunk's products are done
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      int m, k;
      a_index(t + i * kThreads, m, k);
      s.a[k][m] = ra[i];
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      int n, k;
      b_index(t + i * kThreads, n, k);
      s.b[k][n] = rb[i];
    }
    __syncthreads();
    if (k0 + kTileK < ke) load(k0 + kTileK);
#pragma unroll
    for (int k = 0; k < kTileK; ++k) {
      const float4 av = *reinterpret_cast<const float4*>(&s.a[k][ty * 4]);
      const float2 bv = *reinterpret_cast<const float2*>(&s.b[k][tx * 2]);
      const float am[4] = {av.x, av.y, av.z, av.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        acc[i][0] = __fmaf_rn(am[i], bv.x, acc[i][0]);
        acc[i][1] = __fmaf_rn(am[i], bv.y, acc[i][1]);
      }
    }
  }
}

// Unit u of product g: its tile's products, then epi(m, n, value) for each
// of this thread's outputs once the tile's K is complete: at once for one
// part; else each part is stored and the last to arrive sums them in part
// order.
template <bool kAK, bool kBK, class Epi>
__device__ void run_unit(const Gemm& g, int u, const Operand& A, const Operand& B, Smem& s, Epi epi) {
  const int tile = u / g.parts, part = u % g.parts;
  const int m0 = (tile / g.tiles_n) * kTileM, n0 = (tile % g.tiles_n) * kTileN;
  const int kb = part * g.kper, ke = min(g.K, kb + g.kper);
  float acc[4][2];
  tile_product<kAK, kBK>(A, B, m0, n0, kb, ke, acc, s);
  const int ty = threadIdx.x >> 4, tx = threadIdx.x & 15;
  const std::int64_t plane = static_cast<std::int64_t>(g.M) * g.N;
  if (g.parts > 1) {
    float* mine = g.part_buf + part * plane;
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int m = m0 + ty * 4 + i, n = n0 + tx * 2 + j;
        if (m < g.M && n < g.N) __stcg(mine + static_cast<std::int64_t>(m) * g.N + n, acc[i][j]);
      }
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) s.last = atomicAdd(g.counters + tile, 1u) == static_cast<unsigned>(g.parts - 1);
    __syncthreads();
    if (!s.last) return;
    __threadfence();
    // Part by part, this thread's eight outputs at a time (their loads in flight together).
    const auto at = [&](int i, int j) {
      return static_cast<std::int64_t>(m0 + ty * 4 + i) * g.N + (n0 + tx * 2 + j);
    };
    const auto valid = [&](int i, int j) { return m0 + ty * 4 + i < g.M && n0 + tx * 2 + j < g.N; };
    float sum[4][2];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 2; ++j) sum[i][j] = valid(i, j) ? __ldcg(g.part_buf + at(i, j)) : 0.0f;
    for (int p = 1; p < g.parts; ++p) {
      float v[4][2];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) v[i][j] = valid(i, j) ? __ldcg(g.part_buf + p * plane + at(i, j)) : 0.0f;
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) sum[i][j] += v[i][j];
    }
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 2; ++j)
        if (valid(i, j)) epi(m0 + ty * 4 + i, n0 + tx * 2 + j, sum[i][j]);
    if (threadIdx.x == 0) g.counters[tile] = 0;  // left at 0 for the next product (block_counters' rule)
    return;
  }
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int m = m0 + ty * 4 + i, n = n0 + tx * 2 + j;
      if (m < g.M && n < g.N) epi(m, n, acc[i][j]);
    }
}

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

// Combines fake quant `slot`'s partial ranges (every block, the same
// result), moves the running range read at the start and derives the
// qparams; block 0 stores them.
__device__ void finish_quant(const QatMlpArgs& a, const float* minmax, int slot, Smem& s, float& scale,
                             std::int32_t& zp) {
  const QatMlpQuant& q = quant_of(a, slot);
  const float* part = minmax + std::int64_t{2} * slot * gridDim.x;
  float lo = INFINITY, hi = -INFINITY;
  for (unsigned k = threadIdx.x; k < gridDim.x; k += blockDim.x) {
    lo = formulas::min_combine(lo, __ldcg(part + 2 * k));
    hi = formulas::max_combine(hi, __ldcg(part + 2 * k + 1));
  }
  block_minmax(lo, hi);
  float run_min = s.old_min[slot], run_max = s.old_max[slot];
  formulas::observer_update(run_min, run_max, lo, hi, q.averaging_constant, q.moving);
  formulas::observer_qparams(run_min, run_max, q.qmin, q.qmax, q.symmetric, q.symmetric_zero_point, scale, zp);
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    q.run_min[0] = run_min;
    q.run_max[0] = run_max;
    q.scale[0] = scale;
    q.zero_point[0] = zp;
  }
}

// Stores this block's partial range of fake quant `slot`.
__device__ void store_partial(float* minmax, int slot, float lo, float hi) {
  block_minmax(lo, hi);
  if (threadIdx.x == 0) {
    float* part = minmax + std::int64_t{2} * (slot * gridDim.x + blockIdx.x);
    part[0] = lo;
    part[1] = hi;
  }
}

// Phase 0's per-channel weight observer + fake quant of one row (one warp):
// rows of up to kRowRegs * 32 elements are read once into registers (all
// loads in flight at once), longer ones twice in chunks of that size.
constexpr int kRowRegs = 16;

__device__ void quantize_weight_row(const QatMlpLayer& l, int r, float* wq) {
  const int lane = threadIdx.x & 31, k = l.in_features;
  const float* row = l.weight + static_cast<std::int64_t>(r) * k;
  float* out = wq + static_cast<std::int64_t>(r) * k;
  const bool in_registers = k <= kRowRegs * 32;
  float v[kRowRegs];
  float lo = INFINITY, hi = -INFINITY;
  for (int c0 = 0; c0 < k; c0 += kRowRegs * 32) {
#pragma unroll
    for (int j = 0; j < kRowRegs; ++j) {
      const int c = c0 + j * 32 + lane;
      v[j] = c < k ? __ldg(row + c) : NAN;
    }
#pragma unroll
    for (int j = 0; j < kRowRegs; ++j) {
      if (c0 + j * 32 + lane < k) {
        lo = formulas::min_combine(lo, v[j]);
        hi = formulas::max_combine(hi, v[j]);
      }
    }
  }
  warp_minmax(lo, hi);
  const QatMlpQuant& q = l.weight_quant;
  float run_min = q.run_min[r], run_max = q.run_max[r], scale = 1.0f;
  std::int32_t zp = 0;
  formulas::observer_update(run_min, run_max, lo, hi, q.averaging_constant, q.moving);
  formulas::observer_qparams(run_min, run_max, q.qmin, q.qmax, q.symmetric, q.symmetric_zero_point, scale, zp);
  __syncwarp();
  if (lane == 0) {
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
  for (int c0 = 0; c0 < k; c0 += kRowRegs * 32) {
    if (!in_registers) {
#pragma unroll
      for (int j = 0; j < kRowRegs; ++j) {
        const int c = c0 + j * 32 + lane;
        v[j] = c < k ? __ldg(row + c) : 0.0f;
      }
    }
#pragma unroll
    for (int j = 0; j < kRowRegs; ++j) {
      const int c = c0 + j * 32 + lane;
      bool bit;
      if (c < k) __stcg(out + c, op.float_form(v[j], p, bit));
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

__global__ void __launch_bounds__(kThreads, kMaxBlocksPerSm) qat_mlp_kernel(const __grid_constant__ QatMlpArgs a) {
  ::qgrad::cuda::wait_for_prior_kernels();
  __shared__ Smem s;
  cooperative_groups::grid_group grid = cooperative_groups::this_grid();
  const QatMlpWorkspace& w = a.offsets;
  float* const ws = a.workspace;
  float* const minmax = ws + w.minmax;
  std::uint32_t* const counters = a.counters;
  const int L = a.num_layers, B = a.batch;
  const int gthread = blockIdx.x * kThreads + threadIdx.x, nthreads = gridDim.x * kThreads;

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
    int rows = 0;
    for (int i = 0; i < L; ++i) rows += a.layers[i].out_features;
    for (int gr = gthread >> 5; gr < rows; gr += nthreads >> 5) {
      int i = 0, r = gr;
      while (r >= a.layers[i].out_features) r -= a.layers[i++].out_features;
      quantize_weight_row(a.layers[i], r, ws + w.wq[i]);
    }
    float lo = INFINITY, hi = -INFINITY;
    const std::int64_t n = std::int64_t{B} * a.layers[0].in_features;
    for (std::int64_t e = gthread; e < n; e += nthreads) {
      const float v = __ldg(a.x + e);
      lo = formulas::min_combine(lo, v);
      hi = formulas::max_combine(hi, v);
    }
    store_partial(minmax, 0, lo, hi);
  }
  grid.sync();
  stamp(a.phase_clock, phase++);

  // ---- forward: layer i reads act_i (fake quant slot i) and writes z_i ----
  for (int i = 0; i < L; ++i) {
    const QatMlpLayer& l = a.layers[i];
    float scale;
    std::int32_t zp;
    finish_quant(a, minmax, i, s, scale, zp);
    const bool relu_in = i > 0 && a.layers[i - 1].relu;
    const Operand A{i == 0 ? a.x : ws + w.z[i - 1], l.in_features, B, l.in_features,
                    act_quant(scale, zp, quant_of(a, i), relu_in)};
    const Operand Wq{ws + w.wq[i], l.in_features, l.out_features, l.in_features, ActQuant{}};
    const Gemm g(B, l.out_features, l.in_features, l.split_forward,
                 w.fwd_parts[i] >= 0 ? ws + w.fwd_parts[i] : nullptr, counters);
    float* z = ws + w.z[i];
    float lo = INFINITY, hi = -INFINITY;
    for (int u = blockIdx.x; u < g.units; u += gridDim.x) {
      run_unit<true, true>(g, u, A, Wq, s, [&](int m, int n, float v) {
        if (l.bias) v = v + __ldg(l.bias + n);
        __stcg(z + static_cast<std::int64_t>(m) * g.N + n, v);
        lo = formulas::min_combine(lo, v);
        hi = formulas::max_combine(hi, v);
      });
    }
    store_partial(minmax, i + 1, lo, hi);
    grid.sync();
  stamp(a.phase_clock, phase++);
  }

  // ---- loss: logits = fq_L(z_L); per row log-sum-exp and dz_L ----
  {
    const QatMlpLayer& l = a.layers[L - 1];
    float scale;
    std::int32_t zp;
    finish_quant(a, minmax, L, s, scale, zp);
    const ActQuant act = act_quant(scale, zp, l.output_quant, l.relu);
    const int C = l.out_features;
    const float* z = ws + w.z[L - 1];
    float* dz = ws + w.dz[L - 1];
    const float g_over_b = 1.0f / static_cast<float>(B);
    float loss = 0.0f;
    // A thread a row; up to kLossRegs logits are read once, all in flight.
    constexpr int kLossRegs = 16;
    for (int b = gthread; b < B; b += nthreads) {
      const float* zr = z + static_cast<std::int64_t>(b) * C;
      const std::int64_t label = a.labels_s64 ? static_cast<const std::int64_t*>(a.labels)[b]
                                              : static_cast<const std::int32_t*>(a.labels)[b];
      float held[kLossRegs];
#pragma unroll
      for (int c = 0; c < kLossRegs; ++c) held[c] = c < C ? __ldcg(zr + c) : 0.0f;
      const auto z_at = [&](int c) { return c < kLossRegs ? held[c] : __ldcg(zr + c); };
      bool bit;
      float mx = act.value(z_at(0), bit);
      for (int c = 1; c < C; ++c) mx = formulas::max_nan(mx, act.value(z_at(c), bit));
      float sum = 0.0f, at_label = 0.0f;
      for (int c = 0; c < C; ++c) {
        const float v = act.value(z_at(c), bit);
        sum += formulas::exp_m(v - mx);
        if (c == label) at_label = v;
      }
      const bool valid = label >= 0 && label < C;
      loss += valid ? formulas::log_m(sum) - (at_label - mx) : formulas::quiet_nan<float>();
      for (int c = 0; c < C; ++c) {
        const float zc = z_at(c);
        const float v = act.value(zc, bit);
        const float p = formulas::exp_m(v - mx) / sum;
        const float d = valid ? formulas::cross_entropy_grad(p, c == label, g_over_b) : formulas::quiet_nan<float>();
        __stcg(dz + static_cast<std::int64_t>(b) * C + c, act.grad(d, zc));
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
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    float sum = 0.0f;
    for (unsigned k = 0; k < gridDim.x; ++k) sum += __ldcg(ws + w.loss_parts + k);
    a.loss[0] = sum / static_cast<float>(B);
  }
  for (int i = L - 1; i >= 0; --i) {
    const QatMlpLayer& l = a.layers[i];
    const int N = l.out_features, K = l.in_features;
    // act_i's fake quant, from the qparams its forward phase stored.
    const QatMlpQuant& qi = quant_of(a, i);
    const ActQuant act_in = act_quant(__ldcg(qi.scale), __ldcg(qi.zero_point), qi, i > 0 && a.layers[i - 1].relu);
    const float* dz = ws + w.dz[i];
    const float* in = i == 0 ? a.x : ws + w.z[i - 1];
    // dW_i[n, k] = sum_b dz_i[b, n] act_i[b, k]
    const Operand dz_t{dz, N, B, N, ActQuant{}};  // A(m = n, k = b) at (b, n)
    const Operand act{in, K, B, K, act_in};       // B(k = b, n = k) at (b, k)
    const Gemm gw(N, K, B, l.split_weight_grad, w.dw_parts[i] >= 0 ? ws + w.dw_parts[i] : nullptr, counters);
    // dz_{i-1}[b, k] = mask(z_{i-1}[b, k]) (sum_n dz_i[b, n] Wq_i[n, k])
    const Operand dz_a{dz, N, B, N, ActQuant{}};  // A(m = b, k = n) at (b, n)
    const Operand wq{ws + w.wq[i], K, N, K, ActQuant{}};  // B(k = n, n = k) at (n, k)
    const int dw_tiles = ceil_div(N, kTileM) * ceil_div(K, kTileN);
    const Gemm gx(B, K, N, l.split_input_grad, w.dx_parts[i] >= 0 ? ws + w.dx_parts[i] : nullptr,
                  counters + dw_tiles);
    const int dx_units = i > 0 ? gx.units : 0;
    const int db_units = l.bias_grad ? ceil_div(N, 32) : 0;
    const formulas::FakeQuantOp<float, true> wop{l.weight_quant.qmin, l.weight_quant.qmax};
    for (int u = blockIdx.x; u < gw.units + dx_units + db_units; u += gridDim.x) {
      if (u < gw.units) {
        run_unit<false, false>(gw, u, dz_t, act, s, [&](int m, int n, float v) {
          formulas::ChannelParams p;
          p.scale = __ldcg(l.weight_quant.scale + m);
          p.inv_scale = formulas::inv_scale_of(p.scale);
          p.zp = __ldcg(l.weight_quant.zero_point + m);
          bool bit;
          const std::int64_t at = static_cast<std::int64_t>(m) * K + n;
          wop.float_form(__ldg(l.weight + at), p, bit);
          float gv = v * (bit ? 1.0f : 0.0f);  // fake quant's straight-through mask
          if (l.accumulate_weight_grad) gv = l.weight_grad[at] + gv;
          l.weight_grad[at] = gv;
        });
      } else if (u < gw.units + dx_units) {
        float* dz_prev = ws + w.dz[i - 1];
        const float* z_prev = ws + w.z[i - 1];
        run_unit<true, false>(gx, u - gw.units, dz_a, wq, s, [&](int m, int n, float v) {
          const std::int64_t at = static_cast<std::int64_t>(m) * K + n;
          __stcg(dz_prev + at, act_in.grad(v, __ldcg(z_prev + at)));
        });
      } else {
        bias_grad_unit(l, dz, B, u - gw.units - dx_units, s);
      }
    }
    if (i > 0) grid.sync();
    stamp(a.phase_clock, phase++);
  }
}

}  // namespace

bool qat_mlp_available(int device) { return ::qgrad::cuda::cooperative_launch(device); }

bool qat_mlp_plan(QatMlpArgs& a) {
  const int dev = a.device;
  if (!qat_mlp_available(dev)) return false;
  // Blocks an SM holds with the kernel's registers: asked once per device, not every step.
  static int resident[16] = {};
  int& per_sm = resident[std::min(dev, 15)];
  if (per_sm == 0) QGRAD_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, qat_mlp_kernel, kThreads, 0));
  if (per_sm < 1) return false;
  a.grid = ::qgrad::cuda::multiprocessor_count(dev) * std::min(per_sm, kMaxBlocksPerSm);
  a.counters = ::qgrad::cuda::block_counters(dev);
  // Split K where the tiles alone would leave blocks idle, each part at
  // least two chunks long.
  const auto split_for = [&](int tiles, int k) {
    const int s = std::max(1, std::min(a.grid / std::max(tiles, 1), ceil_div(k, 2 * kTileK)));
    int kper = 0;
    return split_parts(k, s, kper);
  };
  const int b = a.batch;
  for (int i = 0; i < a.num_layers; ++i) {
    QatMlpLayer& l = a.layers[i];
    const int n = l.out_features, k = l.in_features;
    l.split_forward = split_for(ceil_div(b, kTileM) * ceil_div(n, kTileN), k);
    const int dw_tiles = ceil_div(n, kTileM) * ceil_div(k, kTileN);
    const int dx_tiles = i > 0 ? ceil_div(b, kTileM) * ceil_div(k, kTileN) : 0;
    l.split_weight_grad = split_for(dw_tiles + dx_tiles, b);
    l.split_input_grad = split_for(dw_tiles + dx_tiles, n);
    // The tile counters of a phase come from block_counters.
    if (std::int64_t{dw_tiles} + dx_tiles > static_cast<std::int64_t>(::qgrad::cuda::kBlockCounters))
      l.split_weight_grad = l.split_input_grad = 1;
    if (ceil_div(b, kTileM) * ceil_div(n, kTileN) > static_cast<int>(::qgrad::cuda::kBlockCounters))
      l.split_forward = 1;
  }
  a.offsets = workspace_of(a);
  return true;
}

void qat_mlp_record_phases(std::uint64_t* device_words) { g_phase_clock = device_words; }

void qat_mlp_forward_backward(const QatMlpArgs& args) {
  QatMlpArgs a = args;
  a.phase_clock = g_phase_clock;
  ::qgrad::cuda::launch_cooperative_kernel(a.device, qat_mlp_kernel, static_cast<unsigned>(a.grid), kThreads, 0, a);
}

}  // namespace qgrad::kernels::cuda
