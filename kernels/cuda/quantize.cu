// CUDA kernels of the quantization ops.
//
// The elementwise engine of fake_quantize, quantize, dequantize and their
// backward kernels: one warp per 128-element mask block, each lane four
// consecutive elements (a 16-byte load/store for f32 when the pointers are
// aligned), the channel found once per lane by a magic-number division
// when `inner` is a multiple of 4 (per element otherwise), and the mask
// word k of the block built by one __ballot_sync over the lanes' k-th
// elements: no atomics. Same formulas and mask layout as the CPU kernels.
#include <cooperative_groups.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <numeric>
#include <tuple>
#include <type_traits>
#include <vector>

#include "qgrad/kernels/bitmask.h"
#include "qgrad/kernels/cuda/entries.h"
#include "qgrad/kernels/cuda/launch.cuh"
#include "qgrad/kernels/cuda/minmax.cuh"
#include "qgrad/kernels/formulas/lowbit.h"
#include "qgrad/kernels/formulas/transformer.h"
#include "qgrad/kernels/observer.h"
#include "qgrad/kernels/quantize.h"
#include "qgrad/kernels/vec4.h"

namespace qgrad::kernels::cuda {

namespace {

// Loads the four elements of lane `lane` in mask block b.
template <class In, bool kVec>
__device__ __forceinline__ void engine_load(const In* __restrict__ in, std::int64_t b, unsigned lane, std::int64_t n,
                                            In (&v)[4]) {
  const std::int64_t i0 = b * kBitmaskBlock + 4 * static_cast<std::int64_t>(lane);
  if (kVec && i0 + 3 < n) {
    const Vec4<In> w = *reinterpret_cast<const Vec4<In>*>(in + i0);
#pragma unroll
    for (int k = 0; k < 4; ++k) v[k] = w.v[k];
  } else {
#pragma unroll
    for (int k = 0; k < 4; ++k) v[k] = i0 + k < n ? in[i0 + k] : In{};
  }
}

// Applies op to the loaded elements of mask block b and stores the results
// (and the block's mask words, built by ballots).
template <class Op, bool kVec>
__device__ __forceinline__ void engine_finish(const Op& op, const typename Op::In (&v)[4],
                                              typename Op::Out* __restrict__ out,
                                              const std::uint32_t* __restrict__ mask_in,
                                              std::uint32_t* __restrict__ mask_out, std::int64_t b, unsigned lane,
                                              std::int64_t n, const ChannelIndexer& map,
                                              const formulas::ParamSource& ps, bool same4) {
  using Out = typename Op::Out;
  const std::int64_t i0 = b * kBitmaskBlock + 4 * static_cast<std::int64_t>(lane);
  const bool full = i0 + 3 < n;
  bool bit_in[4] = {false, false, false, false};
  if constexpr (Op::kReadsMask) {
    const uint4 w = *reinterpret_cast<const uint4*>(mask_in + b * kBitmaskWordsPerBlock);
    bit_in[0] = (w.x >> lane) & 1u;
    bit_in[1] = (w.y >> lane) & 1u;
    bit_in[2] = (w.z >> lane) & 1u;
    bit_in[3] = (w.w >> lane) & 1u;
  }
  formulas::ChannelParams p;
  if constexpr (Op::kParams) {
    if (same4 && i0 < n) p = ps.get(map.channel(i0));
  }
  Out o[4];
  bool bit[4] = {false, false, false, false};
  if (full) {  // no per-element bound checks on all but the last block
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if constexpr (Op::kParams) {
        if (!same4) p = ps.get(map.channel(i0 + k));
      }
      o[k] = op(v[k], p, bit_in[k], bit[k]);
    }
  } else {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if (i0 + k < n) {
        if constexpr (Op::kParams) {
          if (!same4) p = ps.get(map.channel(i0 + k));
        }
        o[k] = op(v[k], p, bit_in[k], bit[k]);
      }
    }
  }
  if (kVec && full) {
    Vec4<Out> w;
#pragma unroll
    for (int k = 0; k < 4; ++k) w.v[k] = o[k];
    *reinterpret_cast<Vec4<Out>*>(out + i0) = w;
  } else {
#pragma unroll
    for (int k = 0; k < 4; ++k)
      if (i0 + k < n) out[i0 + k] = o[k];
  }
  if constexpr (Op::kWritesMask) {
    if (mask_out) store_mask_block(mask_out, b, bit, lane);  // uniform: no mask wanted, no ballots
  }
}

// Each warp takes kUnroll consecutive mask blocks per iteration and issues
// all their loads before any arithmetic: more bytes in flight per warp,
// which the narrow-output ops (quantize: 4 bytes in, 1 out) need to reach
// the copy bandwidth on a grid of a few waves. Ops whose output is at least
// as wide as their input (dequantize, fake quantize, the gradients) run one
// mask block per warp on a grid that covers the tensor once: H100 sweeps of
// both shapes (2026-11-24, docs/benchmarks.md) put the single pass at the copy
// rate (s8 -> f32 dequantize 0.458 ms for 256M against 0.487 on 8 waves of 4
// blocks per warp), the few-waves grid 5-7% under it.
constexpr int kEngineUnroll = 4;

template <class Op>
constexpr int engine_unroll() {
  return sizeof(typename Op::Out) < sizeof(typename Op::In) ? kEngineUnroll : 1;
}

// The engine over mask blocks [first, last): warp w of nwarps takes groups
// of kUnroll consecutive mask blocks, striding by nwarps groups.
template <class Op, bool kVec, int kUnroll = kEngineUnroll>
__device__ __forceinline__ void engine_range(const Op& op, const typename Op::In* __restrict__ in,
                                             typename Op::Out* __restrict__ out,
                                             const std::uint32_t* __restrict__ mask_in,
                                             std::uint32_t* __restrict__ mask_out, std::int64_t n,
                                             const ChannelIndexer& map, const formulas::ParamSource& ps,
                                             bool same4, std::int64_t first, std::int64_t last, std::int64_t warp,
                                             std::int64_t nwarps) {
  using In = typename Op::In;
  const unsigned lane = threadIdx.x & 31u;
  for (std::int64_t b0 = first + warp * kUnroll; b0 < last; b0 += nwarps * kUnroll) {
    In v[kUnroll][4];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (b0 + u < last) engine_load<In, kVec>(in, b0 + u, lane, n, v[u]);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (b0 + u < last) engine_finish<Op, kVec>(op, v[u], out, mask_in, mask_out, b0 + u, lane, n, map, ps, same4);
  }
}

template <class Op, bool kVec>
__global__ void __launch_bounds__(256)
    engine_kernel(Op op, const typename Op::In* __restrict__ in, typename Op::Out* __restrict__ out,
                  const std::uint32_t* __restrict__ mask_in, std::uint32_t* __restrict__ mask_out, std::int64_t n,
                  ChannelIndexer map, formulas::ParamSource ps, bool same4) {
  ::qgrad::cuda::wait_for_prior_kernels();
  const std::int64_t warp = (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const std::int64_t nwarps = (static_cast<std::int64_t>(gridDim.x) * blockDim.x) >> 5;
  engine_range<Op, kVec, engine_unroll<Op>()>(op, in, out, mask_in, mask_out, n, map, ps, same4, 0,
                                              bitmask_blocks(n), warp, nwarps);
}

// Blocks of 256 threads for the engine of Op over n elements: one warp per
// engine_unroll<Op>() mask blocks; narrow-output ops at most 8 waves of
// resident blocks, the others one pass (at most blocks_for's cap).
template <class Op>
unsigned engine_blocks(int dev, std::int64_t n) {
  constexpr int unroll = engine_unroll<Op>();
  const std::int64_t warps_needed = (bitmask_blocks(n) + unroll - 1) / unroll;
  if (unroll == 1) return ::qgrad::cuda::blocks_for(warps_needed * 32, 256);
  return ::qgrad::cuda::blocks_for(warps_needed * 32, 256, ::qgrad::cuda::fill_blocks(dev, 256) * 8LL);
}

// Per-tensor parameters, no mask read or written (quantize, dequantize, the
// no-grad fake quantize, dequantize's gradient): kPerTensorVecs vectors of
// four a thread, all loaded before any is stored (vectors blockDim apart, so
// each load and store instruction stays coalesced), on a grid that covers
// the tensor once; the parameters read once a thread, no channel or mask
// arithmetic. The same op, the same bits. Chosen by dev/cuda/quant_per_tensor.cu
// on an H200 (2026-11-26; 256M elements, every shape of 1, 2, 4, 8 vectors a
// thread on one pass or 1-16 waves): 4 vectors on one pass fastest for
// f32 -> s8 (0.3052 ms against the engine's 0.4075 with its mask-block
// layout); widening ops take PerTensorShape's shape below.
constexpr int kPerTensorVecs = 4;

// Widening ops (dequantize: 1 byte in, 4 out) take two vectors a thread on
// blocks of 512 with evict-first (st.global.cs) stores: the fastest s8 -> f32
// shape of dev/cuda/quant_per_tensor.cu in three H200 calls (2026-11-27:
// 0.3308-0.3309 ms against 0.3383-0.3386 for 4 vectors on blocks of 256).
template <class Op>
struct PerTensorShape {
  static constexpr bool kWidening = sizeof(typename Op::Out) > sizeof(typename Op::In);
  static constexpr unsigned kThreads = kWidening ? 512 : 256;
  static constexpr int kVecs = kWidening ? 2 : kPerTensorVecs;
  static constexpr bool kStream = kWidening;
};

// Stores v at p, evict-first where kStream (the output is not read again
// by this kernel, and a widening op's output is most of its traffic).
template <bool kStream, class T>
__device__ __forceinline__ void store_vec4(Vec4<T>* p, const Vec4<T>& v) {
  if constexpr (kStream && sizeof(Vec4<T>) == 16) {
    float4 w;
    memcpy(&w, &v, 16);
    __stcs(reinterpret_cast<float4*>(p), w);
  } else if constexpr (kStream && sizeof(Vec4<T>) == 8) {
    uint2 w;
    memcpy(&w, &v, 8);
    __stcs(reinterpret_cast<uint2*>(p), w);
  } else {
    *p = v;
  }
}

// The per-tensor loop with U vectors a thread: y = f(x, bit) elementwise.
// The grid may cover fewer than the tensor's n / (4 * U) vector groups
// (the general form's loop, U = 1, runs on the grid sized for more):
// grid-stride.
template <int U, bool kStream, class In, class Out, class F>
__device__ __forceinline__ void per_tensor_loop(const In* __restrict__ in, Out* __restrict__ out, std::int64_t n,
                                                F f) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x * U;
  const std::int64_t full = n / 4;
  bool bit = false;
  // The last n % 4 elements, one a thread, before the loop: after it, the
  // tail's index arithmetic stayed live through the loop (16-24 more
  // registers for the f32 <-> s8 kernels, one block an SM fewer).
  const std::int64_t tail = 4 * full + static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (tail < n) out[tail] = f(in[tail], bit);
  for (std::int64_t v0 = static_cast<std::int64_t>(blockIdx.x) * blockDim.x * U + threadIdx.x; v0 < full;
       v0 += stride) {
    Vec4<In> x[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const std::int64_t v = v0 + static_cast<std::int64_t>(u) * blockDim.x;
      if (v < full) x[u] = reinterpret_cast<const Vec4<In>*>(in)[v];
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const std::int64_t v = v0 + static_cast<std::int64_t>(u) * blockDim.x;
      if (v >= full) continue;
      Vec4<Out> y;
#pragma unroll
      for (int k = 0; k < 4; ++k) y.v[k] = f(x[u].v[k], bit);
      store_vec4<kStream>(reinterpret_cast<Vec4<Out>*>(out) + v, y);
    }
  }
}

// An op with a float form (formulas/quantize.h: the same bits as its general
// form where float_form_exact holds).
template <class Op>
concept HasFloatForm = requires { Op::kHasFloatForm; } && Op::kHasFloatForm;

// Narrowing ops with a float form (quantize) at five blocks of 256 an SM (at
// most 51 registers), as the dev kernels of the same shape: the general
// form's one-vector loop beside the float form's still asked for 56
// (quantize f32 -> s8); 0: no minimum.
template <class Op>
constexpr int per_tensor_min_blocks() {
  return HasFloatForm<Op> && sizeof(typename Op::Out) < sizeof(typename Op::In) ? 5 : 0;
}

// Where the op has a float form and the parameters allow it (every integer
// format with a zero point inside +-2^24: decided once, for the whole
// tensor), the loop runs the float form alone; the general form (int64
// arithmetic) runs one vector a thread. Inlined per element beside the float
// form, as operator() chooses, the general form's registers held the
// 4-vector loop to 3 blocks an SM (quantize f32 -> s8: 76 registers, 0.3431
// ms for 256M elements on an H200; 48 now, 0.3052).
template <class Op>
__global__ void __launch_bounds__(PerTensorShape<Op>::kThreads, per_tensor_min_blocks<Op>())
    per_tensor_kernel(Op op, const typename Op::In* __restrict__ in, typename Op::Out* __restrict__ out,
                      std::int64_t n, formulas::ParamSource ps) {
  ::qgrad::cuda::wait_for_prior_kernels();
  using In = typename Op::In;
  using Shape = PerTensorShape<Op>;
  formulas::ChannelParams p;
  if constexpr (Op::kParams) p = ps.get(0);
  if constexpr (HasFloatForm<Op>) {
    if (op.float_form_exact(p)) {
      per_tensor_loop<Shape::kVecs, Shape::kStream>(in, out, n,
                                                    [&](In x, bool& bit) { return op.float_form(x, p, bit); });
      return;
    }
    per_tensor_loop<1, Shape::kStream>(in, out, n, [&](In x, bool& bit) { return op(x, p, false, bit); });
  } else {
    per_tensor_loop<Shape::kVecs, Shape::kStream>(in, out, n, [&](In x, bool& bit) { return op(x, p, false, bit); });
  }
}

template <class Op>
void engine(const QuantLaunch& a) {
  using In = typename Op::In;
  using Out = typename Op::Out;
  const std::int64_t n = a.in.numel();
  if (n == 0) return;
  const int dev = a.out.device().index;
  const In* in = static_cast<const In*>(a.in.data_ptr());
  Out* out = static_cast<Out*>(a.out.data_ptr());
  const bool vec = vec4_aligned<In>(in) && vec4_aligned<Out>(out);
  const AxisLayout& lay = a.params.layout;
  const bool same4 = lay.channels == 1 || lay.inner % 4 == 0;
  const ChannelIndexer map(lay);
  constexpr unsigned threads = 256;
  const unsigned blocks = engine_blocks<Op>(dev, n);
  const Op op{a.params.qmin, a.params.qmax};
  const formulas::ParamSource ps = a.params.source;
  if constexpr (!Op::kReadsMask) {
    if (vec && lay.channels == 1 && a.mask_out == nullptr) {
      using Shape = PerTensorShape<Op>;
      const std::int64_t vectors = (n + 3) / 4;
      ::qgrad::cuda::launch_kernel(dev, per_tensor_kernel<Op>,
                                   ::qgrad::cuda::blocks_for((vectors + Shape::kVecs - 1) / Shape::kVecs, Shape::kThreads),
                                   Shape::kThreads, 0, op, in, out, n, ps);
      return;
    }
  }
  if (vec)
    ::qgrad::cuda::launch_kernel(dev, engine_kernel<Op, true>, blocks, threads, 0, op, in, out, a.mask_in, a.mask_out,
                                 n, map, ps, same4);
  else
    ::qgrad::cuda::launch_kernel(dev, engine_kernel<Op, false>, blocks, threads, 0, op, in, out, a.mask_in, a.mask_out,
                                 n, map, ps, same4);
}

// ---- observe + fake quantize of rows (per-channel weights) ----
// x is [C, inner] (channel axis 0). Each block takes `rows` consecutive
// channels, where rows * inner is a multiple of the 128-element mask block
// (or reaches the end), so the mask words of its elements are its own. Each
// warp reduces rows (warp shuffles, no block barrier; rows of at most 32
// elements: a thread each), and its lane 0
// updates that channel's running range and writes its qparams; after one
// block barrier the block fake quantizes its rows with them. One launch, no
// barrier between blocks; the same formulas as observer_minmax + engine,
// so the same bits. Blocks of kThreads: 256, or kWideRowsThreads where the
// grid has fewer blocks than SMs (then several warps share each row).
// One tensor of it (observe_rows_kernel takes one, observe_rows_batch_kernel
// a table of them).
template <class Op>
struct ObserveRows {
  const typename Op::In* in = nullptr;
  typename Op::Out* out = nullptr;
  std::uint32_t* mask_out = nullptr;
  std::int64_t n = 0, channels = 0, inner = 0, rows = 0;
  ChannelIndexer map;
  float *run_min = nullptr, *run_max = nullptr;
  QparamsArgs q;
  bool same4 = false;
};

// Block `block` of tensor g: its rows' observer update, then their fake quantize.
template <class Op, bool kVec, unsigned kThreads>
__device__ __forceinline__ void observe_rows_block(const Op& op, const ObserveRows<Op>& g, std::int64_t block,
                                                   float c, bool moving) {
  using In = typename Op::In;
  const In* __restrict__ in = g.in;
  const std::int64_t inner = g.inner, channels = g.channels;
  const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const std::int64_t r0 = block * g.rows;
  const std::int64_t r1 = r0 + g.rows < channels ? r0 + g.rows : channels;
  const auto nrows = static_cast<unsigned>(r1 - r0);
  if (inner <= 32) {  // short rows (a 3x3 conv's weight): a thread per row, all rows at once
    // (a warp per row left most lanes idle and took its rows one after another:
    // 23 us for the CNN's [32, 9] first-layer weight, H100 under ncu)
    for (std::int64_t r = r0 + threadIdx.x; r < r1; r += blockDim.x) {
      const In* row = in + r * inner;
      float lo, hi;
      strided_minmax(
          0, inner, 1, [&](std::int64_t k) { return formulas::cast_value<float>(row[k]); }, lo, hi);
      update_channel(r, lo, hi, g.run_min, g.run_max, c, moving, g.q);
    }
  } else if (nrows * 2 > nwarps) {  // a warp per row
    for (std::int64_t r = r0 + warp; r < r1; r += nwarps) {
      const In* row = in + r * inner;
      float lo, hi;
      strided_minmax(lane, inner, 32, [&](std::int64_t k) { return formulas::cast_value<float>(row[k]); }, lo, hi);
      warp_minmax(lo, hi);
      if (lane == 0) update_channel(r, lo, hi, g.run_min, g.run_max, c, moving, g.q);
    }
  } else {  // few long rows (a linear head's weight): wpr warps share each row, then combine (exact, order-free)
    __shared__ float s_lo[kThreads / 32], s_hi[kThreads / 32];
    const unsigned wpr = nwarps / nrows, k = warp / wpr, part = warp % wpr;
    if (k < nrows) {
      const In* row = in + (r0 + k) * inner;
      float lo, hi;
      strided_minmax(lane + 32 * part, inner, 32 * wpr,
                     [&](std::int64_t e) { return formulas::cast_value<float>(row[e]); }, lo, hi);
      warp_minmax(lo, hi);
      if (lane == 0) s_lo[warp] = lo, s_hi[warp] = hi;
    }
    __syncthreads();
    if (threadIdx.x < nrows) {
      float lo = s_lo[threadIdx.x * wpr], hi = s_hi[threadIdx.x * wpr];
      for (unsigned w = 1; w < wpr; ++w) {
        lo = formulas::min_combine(lo, s_lo[threadIdx.x * wpr + w]);
        hi = formulas::max_combine(hi, s_hi[threadIdx.x * wpr + w]);
      }
      update_channel(r0 + threadIdx.x, lo, hi, g.run_min, g.run_max, c, moving, g.q);
    }
  }
  __syncthreads();  // the block's qparams (global, written by lanes 0) are visible to the block
  const formulas::ParamSource ps{g.q.scale, g.q.zero_point, 1.0f, 0};
  const std::int64_t first = r0 * inner / kBitmaskBlock;
  const std::int64_t last = r1 == channels ? bitmask_blocks(g.n) : r1 * inner / kBitmaskBlock;
  // Wide blocks (few blocks on the GPU) take pairs of mask blocks a warp: more warps busy.
  engine_range<Op, kVec, (kThreads > kMinmaxThreads ? 2 : kEngineUnroll)>(
      op, in, g.out, nullptr, g.mask_out, g.n, g.map, ps, g.same4, first, last, warp, nwarps);
}

template <class Op, bool kVec, unsigned kThreads>
__global__ void __launch_bounds__(kThreads)
    observe_rows_kernel(Op op, const __grid_constant__ ObserveRows<Op> g, float c, bool moving) {
  ::qgrad::cuda::wait_for_prior_kernels();
  observe_rows_block<Op, kVec, kThreads>(op, g, blockIdx.x, c, moving);
}

// Several tensors' observe_rows in one launch (observe_fake_quantize_batch:
// a step's weights do not depend on its batch, so their fake quants need
// not wait for one another): tensor t's blocks from first_block[t]; a block
// finds its tensor by a scan of the table (uniform across the block).
constexpr int kObserveRowsBatchMax = 8;
template <class Op>
struct ObserveRowsTable {
  ObserveRows<Op> t[kObserveRowsBatchMax];
  std::int64_t first_block[kObserveRowsBatchMax + 1] = {};
  int count = 0;
};

template <class Op, bool kVec, unsigned kThreads>
__global__ void __launch_bounds__(kThreads)
    observe_rows_batch_kernel(Op op, const __grid_constant__ ObserveRowsTable<Op> table, float c, bool moving) {
  ::qgrad::cuda::wait_for_prior_kernels();
  const std::int64_t block = blockIdx.x;
  int t = 0;
  while (t + 1 < table.count && block >= table.first_block[t + 1]) ++t;
  observe_rows_block<Op, kVec, kThreads>(op, table.t[t], block - table.first_block[t], c, moving);
}

// observe_rows_kernel's blocks where there are fewer than SMs.
constexpr unsigned kWideRowsThreads = 1024;

// Channels per block for observe_rows_kernel: a multiple of the fewest
// whole rows that end on a mask-block boundary, one row per warp when that
// fits; 0 when even the fewest are more work than one block should take
// (then the observer and the engine run as two launches).
// Fewer channels than SMs keep the fewest rows per block, so that more
// blocks share the work (their warps then split each row): a [10, 3136]
// head weight took 2 blocks of a warp per row, ~48 us (H100).
std::int64_t rows_per_block(std::int64_t inner, std::int64_t channels, unsigned sms) {
  constexpr std::int64_t kMaxElements = std::int64_t(1) << 16, kWarps = kMinmaxThreads / 32;
  const std::int64_t fewest = kBitmaskBlock / std::gcd(inner, std::int64_t(kBitmaskBlock));
  if (fewest * inner > kMaxElements) return 0;
  std::int64_t rows = fewest;
  if (channels < static_cast<std::int64_t>(sms)) return rows;
  while (rows < kWarps && 2 * rows * inner <= kMaxElements) rows *= 2;
  return rows;
}

// ---- observe + fake quantize of a whole tensor (per-tensor activations) ----
// One cooperative launch instead of the observer's partial min/max kernel and
// the engine: each block reduces its grid-stride share to a partial, all
// wait at a grid barrier, then every block combines the partials (exact and
// order-free), moves the running range it read before the barrier and
// derives the qparams in registers (block 0 also stores them), and fake
// quantizes its warps' mask blocks with them: the formulas of
// observer_minmax + engine, so the same bits (test_observer's CUDA-vs-CPU
// cases). H200, captured (the dev program observe_fq_coop.cu, in git history
// before 63a9f94): [256, 784] f32
// 8.26 -> 7.11 us, [256, 256] 7.72 -> 6.63, [4096, 1024] 23.16 -> 21.02;
// tensors that the observer reduces in one part (a warp: [256, 10]) keep
// the two launches (4.31 us there against 6.47 in one).
template <class Op, bool kVec>
__global__ void __launch_bounds__(kMinmaxThreads)
    observe_tensor_kernel(Op op, const typename Op::In* __restrict__ in, typename Op::Out* __restrict__ out,
                          std::uint32_t* __restrict__ mask_out, std::int64_t n, float* __restrict__ partial,
                          float* run_min, float* run_max, float c, bool moving, QparamsArgs q, ChannelIndexer map,
                          bool same4) {
  ::qgrad::cuda::wait_for_prior_kernels();
  float lo, hi;
  slice_minmax(in, 1, n, n, 0, std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x,
               std::int64_t{gridDim.x} * blockDim.x, lo, hi);
  block_minmax(lo, hi);
  // The running range before this call: block 0 stores the new one only after the barrier.
  float new_min = run_min[0], new_max = run_max[0];
  if (threadIdx.x == 0) {
    partial[2 * blockIdx.x] = lo;
    partial[2 * blockIdx.x + 1] = hi;
  }
  cooperative_groups::this_grid().sync();
  lo = INFINITY;
  hi = -INFINITY;
  for (unsigned k = threadIdx.x; k < gridDim.x; k += blockDim.x) {
    lo = formulas::min_combine(lo, __ldcg(partial + 2 * k));
    hi = formulas::max_combine(hi, __ldcg(partial + 2 * k + 1));
  }
  block_minmax(lo, hi);
  formulas::observer_update(new_min, new_max, lo, hi, c, moving);
  float scale = 1.0f;
  std::int32_t zp = 0;
  formulas::observer_qparams(new_min, new_max, q.qmin, q.qmax, q.symmetric, q.symmetric_zero_point, scale, zp);
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    run_min[0] = new_min;
    run_max[0] = new_max;
    q.scale[0] = scale;
    q.zero_point[0] = zp;
  }
  const formulas::ParamSource ps{nullptr, nullptr, scale, zp};
  const std::int64_t warp = (std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x) >> 5;
  const std::int64_t nwarps = (std::int64_t{gridDim.x} * blockDim.x) >> 5;
  engine_range<Op, kVec, 1>(op, in, out, nullptr, mask_out, n, map, ps, same4, 0, bitmask_blocks(n), warp, nwarps);
}

// Runs observe + fake quantize of a whole tensor as one cooperative launch
// where it pays (see observe_tensor_kernel); false: nothing launched.
template <class Op>
bool observe_tensor_one_launch(const QuantLaunch& a, const ObserveArgs& o, const QparamsArgs& q) {
  using In = typename Op::In;
  using Out = typename Op::Out;
  const std::int64_t n = a.in.numel();
  const int dev = a.out.device().index;
  if (o.axis >= 0 || n == 0 || q.scale == nullptr || !::qgrad::cuda::cooperative_launch(dev) ||
      minmax_parts(dev, 1, n) <= 1)
    return false;
  const In* in = static_cast<const In*>(a.in.data_ptr());
  Out* out = static_cast<Out*>(a.out.data_ptr());
  const bool vec = vec4_aligned<In>(in) && vec4_aligned<Out>(out);
  auto kernel = vec ? observe_tensor_kernel<Op, true> : observe_tensor_kernel<Op, false>;
  // Blocks: a warp per mask block, at most what stays resident at once (a cooperative grid's limit).
  static int per_sm[2][16] = {};
  int& resident = per_sm[vec ? 1 : 0][std::min(dev, 15)];
  if (resident == 0) {
    int k = 0;
    QGRAD_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&k, kernel, kMinmaxThreads, 0));
    resident = std::max(k, 1);
  }
  const std::int64_t warps = kMinmaxThreads / 32;
  const std::int64_t blocks = std::min<std::int64_t>((bitmask_blocks(n) + warps - 1) / warps,
                                                     std::int64_t{resident} * ::qgrad::cuda::multiprocessor_count(dev));
  const Tensor partial = Tensor::empty({2 * blocks}, TensorOptions{}.with_device(a.out.device()));
  const bool moving = o.averaging_constant >= 0.0;
  ::qgrad::cuda::launch_cooperative_kernel(
      dev, kernel, static_cast<unsigned>(blocks), kMinmaxThreads, 0, Op{a.params.qmin, a.params.qmax}, in, out,
      a.mask_out, n, partial.data<float>(), o.run_min.data<float>(), o.run_max.data<float>(),
      static_cast<float>(o.averaging_constant), moving, q, ChannelIndexer(a.params.layout),
      /*same4=*/true);  // one channel: its parameters hold for every element
  return true;
}

// observe_rows_kernel's channels per block for launch a: 0 where its layout
// does not take that kernel (axis-0 channels of whole rows, rows_per_block).
std::int64_t observe_rows_per_block(const QuantLaunch& a, const ObserveArgs& o, unsigned sms) {
  const AxisLayout v = AxisLayout::of(a.in.shape(), o.axis);
  return a.in.numel() > 0 && o.axis >= 0 && v.outer == 1 ? rows_per_block(v.inner, v.channels, sms) : 0;
}

// The observe_rows tensor of launch a, when its layout takes that kernel;
// false otherwise.
template <class Op>
bool observe_rows_of(const QuantLaunch& a, const ObserveArgs& o, unsigned sms, ObserveRows<Op>& g, bool& vec) {
  using In = typename Op::In;
  using Out = typename Op::Out;
  const std::int64_t rows = observe_rows_per_block(a, o, sms);
  if (rows == 0) return false;
  const AxisLayout v = AxisLayout::of(a.in.shape(), o.axis);
  const ObserverQparams qparams{o.scale, o.zero_point, a.params.qmin, a.params.qmax, o.symmetric,
                                o.symmetric_zero_point};
  g.in = static_cast<const In*>(a.in.data_ptr());
  g.out = static_cast<Out*>(a.out.data_ptr());
  g.mask_out = a.mask_out;
  g.n = a.in.numel();
  g.channels = v.channels;
  g.inner = v.inner;
  g.rows = rows;
  g.map = ChannelIndexer(v);
  g.run_min = o.run_min.data<float>();
  g.run_max = o.run_max.data<float>();
  g.q = qparams_args(&qparams);
  g.same4 = v.inner % 4 == 0;
  vec = vec4_aligned<In>(g.in) && vec4_aligned<Out>(g.out);
  return true;
}

template <class Op>
std::int64_t observe_rows_blocks(const ObserveRows<Op>& g) {
  return (g.channels + g.rows - 1) / g.rows;
}

// launch.template operator()<kVec, kThreads>() for a grid of `blocks`.
// Fewer blocks than SMs (the b256 MLP's [256, 784] weight: 32 blocks of 8
// rows, the fewest whose mask words are their own) take blocks of 1024
// threads: 4 warps a row instead of one, and twice the warps on the fake
// quantize. H200 (2026-11-28, bench_train_step, two alternating rounds
// against blocks of 256): MLP b256 0.1539 / 0.1558 -> 0.1484 / 0.1492 ms,
// b4096 1.0990 / 1.1010 -> 1.0725 / 1.0748, CNN 0.7168 / 0.7140 -> 0.6893 /
// 0.6921; under ncu the b256 weights 3 x 14.5 -> 3 x 10.5 us. The fewest rows
// for every shape (more blocks) measured no better.
template <class F>
void with_rows_launch_shape(std::int64_t blocks, unsigned sms, bool vec, F&& launch) {
  const bool wide = blocks < static_cast<std::int64_t>(sms);
  if (vec && wide) launch.template operator()<true, kWideRowsThreads>();
  else if (vec) launch.template operator()<true, kMinmaxThreads>();
  else if (wide) launch.template operator()<false, kWideRowsThreads>();
  else launch.template operator()<false, kMinmaxThreads>();
}

template <class Op>
void observe_fake_quantize_impl(const QuantLaunch& a, const ObserveArgs& o) {
  const int dev = a.out.device().index;
  const unsigned sms = ::qgrad::cuda::fill_blocks(dev, 2048);  // one block per SM
  ObserveRows<Op> g;
  bool vec = false;
  if (!observe_rows_of(a, o, sms, g, vec)) {  // one cooperative launch, or the observer (one launch), then the engine
    const ObserverQparams qparams{o.scale, o.zero_point, a.params.qmin, a.params.qmax, o.symmetric,
                                  o.symmetric_zero_point};
    if (observe_tensor_one_launch<Op>(a, o, qparams_args(&qparams))) return;
    cuda::observer_minmax(a.in, o.run_min, o.run_max, o.axis, o.averaging_constant, &qparams);
    engine<Op>(a);
    return;
  }
  const Op op{a.params.qmin, a.params.qmax};
  const std::int64_t blocks = observe_rows_blocks(g);
  const float c = static_cast<float>(o.averaging_constant);
  const bool moving = o.averaging_constant >= 0.0;
  with_rows_launch_shape(blocks, sms, vec, [&]<bool kVec, unsigned kThreads>() {
    ::qgrad::cuda::launch_kernel(dev, observe_rows_kernel<Op, kVec, kThreads>, static_cast<unsigned>(blocks), kThreads,
                                 0, op, g, c, moving);
  });
}

// observe_fake_quantize_impl of items (one Op, device, qmin, qmax and
// averaging constant, each taking observe_rows), kObserveRowsBatchMax a launch.
template <class Op>
void observe_rows_batch(const std::vector<const ObserveLaunch*>& items) {
  const QuantLaunch& a0 = items.front()->fq;
  const ObserveArgs& o0 = items.front()->obs;
  const int dev = a0.out.device().index;
  const unsigned sms = ::qgrad::cuda::fill_blocks(dev, 2048);
  const Op op{a0.params.qmin, a0.params.qmax};
  const float c = static_cast<float>(o0.averaging_constant);
  const bool moving = o0.averaging_constant >= 0.0;
  for (std::size_t first = 0; first < items.size(); first += kObserveRowsBatchMax) {
    const std::size_t count = std::min<std::size_t>(kObserveRowsBatchMax, items.size() - first);
    if (count == 1) {
      observe_fake_quantize_impl<Op>(items[first]->fq, items[first]->obs);
      continue;
    }
    ObserveRowsTable<Op> table;
    table.count = static_cast<int>(count);
    bool vec = true;
    for (std::size_t i = 0; i < count; ++i) {
      bool v = false;
      if (!observe_rows_of(items[first + i]->fq, items[first + i]->obs, sms, table.t[i], v))
        throw Error("observe_fake_quantize_batch", "items", "a tensor the row kernel does not take");  // never
      vec = vec && v;
      table.first_block[i + 1] = table.first_block[i] + observe_rows_blocks(table.t[i]);
    }
    const std::int64_t blocks = table.first_block[count];
    with_rows_launch_shape(blocks, sms, vec, [&]<bool kVec, unsigned kThreads>() {
      ::qgrad::cuda::launch_kernel(dev, observe_rows_batch_kernel<Op, kVec, kThreads>, static_cast<unsigned>(blocks),
                                   kThreads, 0, op, table, c, moving);
    });
  }
}

// The tree p[t] += p[t + s], s = 128, ..., 1, over the block's partials;
// thread 0 gets the result. Same order as kernels/cpu/quantize.cpp.
template <class M>
__device__ void lsq_block_tree(M s, M z, M* sh_s, M* sh_z) {
  const int t = static_cast<int>(threadIdx.x);
  sh_s[t] = s;
  sh_z[t] = z;
  __syncthreads();
  for (int w = formulas::kLsqThreads / 2; w > 0; w >>= 1) {
    if (t < w) {
      sh_s[t] = sh_s[t] + sh_s[t + w];
      sh_z[t] = sh_z[t] + sh_z[t + w];
    }
    __syncthreads();
  }
}

// Stage 1 of the LSQ backward: one block per (channel, chunk), fused with
// dx (x and dy read once). Thread t sums j = t, t + 256, ... in order; the
// loads of four iterations are issued before their sums, to keep enough
// bytes in flight.
template <class T>
__global__ void __launch_bounds__(formulas::kLsqThreads)
    lsq_partial_kernel(const T* __restrict__ x, const T* __restrict__ dy, T* __restrict__ dx,
                       op_math_t<T>* __restrict__ part_s, op_math_t<T>* __restrict__ part_z,
                       formulas::ParamSource ps, AxisLayout lay, std::int64_t chunks, std::int64_t qmin,
                       std::int64_t qmax, op_math_t<T> g) {
  ::qgrad::cuda::wait_for_prior_kernels();
  using M = op_math_t<T>;
  constexpr int kT = formulas::kLsqThreads, kU = 4;
  __shared__ M sh_s[kT];
  __shared__ M sh_z[kT];
  const int t = static_cast<int>(threadIdx.x);
  const std::int64_t per_channel = lay.outer * lay.inner;
  for (std::int64_t blk = blockIdx.x; blk < lay.channels * chunks; blk += gridDim.x) {
    const std::int64_t c = blk / chunks, start = (blk % chunks) * formulas::kLsqChunk;
    const std::int64_t end = start + formulas::kLsqChunk < per_channel ? start + formulas::kLsqChunk : per_channel;
    const formulas::ChannelParams p = ps.get(c);
    M s = M(0), z = M(0);
    for (std::int64_t j0 = start + t; j0 < end; j0 += kU * kT) {
      std::int64_t off[kU];
      T xv[kU], gv[kU];
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const std::int64_t j = j0 + u * kT;
        off[u] = j < end ? formulas::lsq_offset(lay, j, c) : -1;
        if (off[u] >= 0) {
          xv[u] = x[off[u]];
          gv[u] = dy[off[u]];
        }
      }
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        if (off[u] < 0) break;
        const auto r = formulas::lsq_grad<M>(M(xv[u]), M(gv[u]), p, qmin, qmax, g);
        dx[off[u]] = T(r.dx);
        s = s + r.ds;
        z = z + r.dz;
      }
    }
    lsq_block_tree<M>(s, z, sh_s, sh_z);
    if (t == 0) {
      part_s[blk] = sh_s[0];
      part_z[blk] = sh_z[0];
    }
    __syncthreads();
  }
}

// Stage 2: one block per channel combines its chunk sums in fixed order.
template <class M>
__global__ void __launch_bounds__(formulas::kLsqThreads)
    lsq_finish_kernel(const M* __restrict__ part_s, const M* __restrict__ part_z, std::int64_t chunks,
                      M* __restrict__ ds, M* __restrict__ dz) {
  ::qgrad::cuda::wait_for_prior_kernels();
  __shared__ M sh_s[formulas::kLsqThreads];
  __shared__ M sh_z[formulas::kLsqThreads];
  const std::int64_t c = blockIdx.x;
  M s = M(0), z = M(0);
  for (std::int64_t k = threadIdx.x; k < chunks; k += formulas::kLsqThreads) {
    s = s + part_s[c * chunks + k];
    z = z + part_z[c * chunks + k];
  }
  lsq_block_tree<M>(s, z, sh_s, sh_z);
  if (threadIdx.x == 0) {
    ds[c] = sh_s[0];
    dz[c] = sh_z[0];
  }
}

template <class T>
void lsq_backward_impl(const LsqArgs& a) {
  using M = op_math_t<T>;
  const int dev = a.dx.device().index;
  const std::int64_t per_channel = a.layout.outer * a.layout.inner;
  const std::int64_t chunks = (per_channel + formulas::kLsqChunk - 1) / formulas::kLsqChunk;
  const std::int64_t total = a.layout.channels * chunks;
  if (a.layout.channels == 0) return;
  Tensor part = Tensor::empty({2 * total}, TensorOptions{}.with_dtype(dtype_of<M>).with_device(a.dx.device()));
  M* part_s = static_cast<M*>(part.data_ptr());
  M* part_z = part_s + total;
  const formulas::ParamSource ps{a.scale.data<float>(), a.zp.data<std::int32_t>(), 1.0f, 0};
  if (total > 0) {
    const unsigned blocks = static_cast<unsigned>(total < 65535LL * 32 ? total : 65535LL * 32);
    ::qgrad::cuda::launch_kernel(dev, lsq_partial_kernel<T>, blocks, formulas::kLsqThreads, 0,
                                 static_cast<const T*>(a.x.data_ptr()), static_cast<const T*>(a.dy.data_ptr()),
                                 static_cast<T*>(a.dx.data_ptr()), part_s, part_z, ps, a.layout, chunks, a.qmin, a.qmax,
                                 static_cast<M>(a.grad_factor));
  }
  // One block per channel (grid x allows 2^31 - 1 blocks).
  ::qgrad::cuda::launch_kernel(dev, lsq_finish_kernel<M>, static_cast<unsigned>(a.layout.channels),
                               formulas::kLsqThreads, 0, part_s, part_z, chunks, static_cast<M*>(a.ds.data_ptr()),
                               static_cast<M*>(a.dz.data_ptr()));
}

// ---- fake_quantize_dynamic over rows (ops/lowbit.h) ----
// A warp per row of D = 128 * kChunks elements (per-token activations,
// per-channel weight rows): the row is loaded once into registers (each lane
// four consecutive elements of each 128-element mask block, as the engine),
// its min/max reduced by shuffles (warp_minmax_values: the observer's
// order-free combine), the qparams formed by formulas::int4_qparams
// (choose_qparams_affine's) in every lane, then fake quantized with
// formulas::FakeQuantOp (the per-token op, f64 product form; its float form
// where exact) and its mask words built by ballots. One launch for
// what the composition does in five (two fills, min/max, qparams, fake quant).
constexpr int kDynamicRowsThreads = 256;

// The row's values after the prologue, in x's dtype (the gelu op's rounding).
template <RowPrologue kPrologue, class T>
__device__ __forceinline__ T row_prologue(T v) {
  if constexpr (kPrologue == RowPrologue::gelu) return T(formulas::gelu_erf(op_math_t<T>(v)));
  else if constexpr (kPrologue == RowPrologue::gelu_tanh) return T(formulas::gelu_tanh(op_math_t<T>(v)));
  else return v;
}

// One warp's row: load, min/max, qparams, fake quant, mask (rows of the
// tensor at x / y / mask, `rows` of them).
template <class T, int kChunks, bool kVec, RowPrologue kPrologue>
__device__ __forceinline__ void fake_quantize_dynamic_row(const T* __restrict__ x, T* __restrict__ y,
                                                          std::uint32_t* __restrict__ mask, std::int64_t row,
                                                          std::int64_t rows, unsigned lane, int qmin, int qmax,
                                                          bool symmetric, float eps) {
  const std::int64_t n = rows * kChunks * kBitmaskBlock;
  T v[kChunks][4];
  float f[kChunks * 4];
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    engine_load<T, kVec>(x, row * kChunks + c, lane, n, v[c]);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      v[c][k] = row_prologue<kPrologue>(v[c][k]);
      f[4 * c + k] = formulas::cast_value<float>(v[c][k]);
    }
  }
  float lo, hi;
  warp_minmax_values(f, lo, hi);
  formulas::ChannelParams p;
  formulas::int4_qparams(lo, hi, qmin, qmax, symmetric, eps, p.scale, p.zp);
  p.inv_scale = formulas::inv_scale_of(p.scale);
  const formulas::FakeQuantOp<T, true> op{qmin, qmax};
  const bool float_form = op.float_form_exact(p);
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const std::int64_t b = row * kChunks + c, i0 = b * kBitmaskBlock + 4 * static_cast<std::int64_t>(lane);
    T o[4];
    bool bit[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) o[k] = op.row_value(v[c][k], p, float_form, bit[k]);
    if (kVec) {
      Vec4<T> w;
#pragma unroll
      for (int k = 0; k < 4; ++k) w.v[k] = o[k];
      *reinterpret_cast<Vec4<T>*>(y + i0) = w;
    } else {
#pragma unroll
      for (int k = 0; k < 4; ++k) y[i0 + k] = o[k];
    }
    if (mask) store_mask_block(mask, b, bit, lane);  // uniform across the warp
  }
}

template <class T, int kChunks, bool kVec, RowPrologue kPrologue>
__global__ void __launch_bounds__(kDynamicRowsThreads)
    fake_quantize_dynamic_rows_kernel(const T* __restrict__ x, T* __restrict__ y, std::uint32_t* __restrict__ mask,
                                      std::int64_t rows, int qmin, int qmax, bool symmetric, float eps) {
  ::qgrad::cuda::wait_for_prior_kernels();
  const std::int64_t row = (std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x) >> 5;
  if (row >= rows) return;  // whole warps leave together
  fake_quantize_dynamic_row<T, kChunks, kVec, kPrologue>(x, y, mask, row, rows, threadIdx.x & 31u, qmin, qmax,
                                                         symmetric, eps);
}

// f(std::integral_constant<int, kChunks>) for the row lengths the row
// kernels take (128 * kChunks elements); false for any other length.
template <class F>
bool with_row_chunks(std::int64_t row_len, F f) {
  switch (row_len) {
    case 128: return f(std::integral_constant<int, 1>{});
    case 256: return f(std::integral_constant<int, 2>{});
    case 384: return f(std::integral_constant<int, 3>{});
    case 512: return f(std::integral_constant<int, 4>{});
    case 768: return f(std::integral_constant<int, 6>{});
    case 1024: return f(std::integral_constant<int, 8>{});
    default: return false;
  }
}

// fake_quantize_dynamic_rows_batch: up to kRowsBatchMax tensors of one row
// length in one launch, their rows numbered one after another (tensor t's
// rows from first_row[t]); a warp finds its tensor by a scan of the table
// (uniform across the warp), then does fake_quantize_dynamic_row.
constexpr int kRowsBatchMax = 32;
template <class T>
struct RowsBatchTable {
  const T* x[kRowsBatchMax];
  T* y[kRowsBatchMax];
  std::uint32_t* mask[kRowsBatchMax];
  std::int64_t first_row[kRowsBatchMax + 1];
  int count;
};

template <class T, int kChunks, bool kVec>
__global__ void __launch_bounds__(kDynamicRowsThreads)
    fake_quantize_dynamic_rows_batch_kernel(const RowsBatchTable<T> table, int qmin, int qmax, bool symmetric,
                                            float eps) {
  ::qgrad::cuda::wait_for_prior_kernels();
  const std::int64_t row = (std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x) >> 5;
  if (row >= table.first_row[table.count]) return;  // whole warps leave together
  int t = 0;
  while (row >= table.first_row[t + 1]) ++t;
  fake_quantize_dynamic_row<T, kChunks, kVec, RowPrologue::none>(
      table.x[t], table.y[t], table.mask[t], row - table.first_row[t], table.first_row[t + 1] - table.first_row[t],
      threadIdx.x & 31u, qmin, qmax, symmetric, eps);
}

template <class T, int kChunks>
void fake_quantize_dynamic_rows_batch_launch(const std::vector<RowsBatchItem>& items, std::size_t first,
                                             std::size_t count, std::int64_t row_len, int qmin, int qmax,
                                             bool symmetric, float eps) {
  RowsBatchTable<T> table{};
  table.count = static_cast<int>(count);
  bool vec = true;
  for (std::size_t i = 0; i < count; ++i) {
    const RowsBatchItem& it = items[first + i];
    table.x[i] = static_cast<const T*>(it.x.data_ptr());
    table.y[i] = static_cast<T*>(it.y.data_ptr());
    table.mask[i] = it.mask;
    table.first_row[i + 1] = table.first_row[i] + it.x.numel() / row_len;
    vec = vec && vec4_aligned<T>(table.x[i]) && vec4_aligned<T>(table.y[i]);
  }
  constexpr int rows_per_block = kDynamicRowsThreads / 32;
  const auto blocks = static_cast<unsigned>((table.first_row[count] + rows_per_block - 1) / rows_per_block);
  const int dev = items[first].y.device().index;
  if (vec)
    ::qgrad::cuda::launch_kernel(dev, fake_quantize_dynamic_rows_batch_kernel<T, kChunks, true>, blocks,
                                 kDynamicRowsThreads, 0, table, qmin, qmax, symmetric, eps);
  else
    ::qgrad::cuda::launch_kernel(dev, fake_quantize_dynamic_rows_batch_kernel<T, kChunks, false>, blocks,
                                 kDynamicRowsThreads, 0, table, qmin, qmax, symmetric, eps);
}

template <class T>
bool fake_quantize_dynamic_rows_batch_typed(const std::vector<RowsBatchItem>& items, std::int64_t row_len, int qmin,
                                            int qmax, bool symmetric, float eps) {
  auto launch_all = [&](auto chunks) {
    for (std::size_t first = 0; first < items.size(); first += kRowsBatchMax) {
      const std::size_t count = std::min<std::size_t>(kRowsBatchMax, items.size() - first);
      fake_quantize_dynamic_rows_batch_launch<T, decltype(chunks)::value>(items, first, count, row_len, qmin, qmax,
                                                                          symmetric, eps);
    }
    return true;
  };
  return with_row_chunks(row_len, launch_all);
}

template <class T, int kChunks, RowPrologue kPrologue>
void fake_quantize_dynamic_rows_launch(const Tensor& x, const Tensor& y, std::uint32_t* mask, std::int64_t rows,
                                       int qmin, int qmax, bool symmetric, float eps) {
  const T* in = static_cast<const T*>(x.data_ptr());
  T* out = static_cast<T*>(y.data_ptr());
  const bool vec = vec4_aligned<T>(in) && vec4_aligned<T>(out);
  constexpr int rows_per_block = kDynamicRowsThreads / 32;
  const auto blocks = static_cast<unsigned>((rows + rows_per_block - 1) / rows_per_block);
  if (vec)
    ::qgrad::cuda::launch_kernel(y.device().index, fake_quantize_dynamic_rows_kernel<T, kChunks, true, kPrologue>,
                                 blocks, kDynamicRowsThreads, 0, in, out, mask, rows, qmin, qmax, symmetric, eps);
  else
    ::qgrad::cuda::launch_kernel(y.device().index, fake_quantize_dynamic_rows_kernel<T, kChunks, false, kPrologue>,
                                 blocks, kDynamicRowsThreads, 0, in, out, mask, rows, qmin, qmax, symmetric, eps);
}

template <class T, RowPrologue kPrologue>
bool fake_quantize_dynamic_rows_impl(const Tensor& x, const Tensor& y, std::uint32_t* mask, std::int64_t row_len,
                                     int qmin, int qmax, bool symmetric, float eps) {
  const std::int64_t rows = x.numel() / row_len;
  auto launch = [&](auto chunks) {
    fake_quantize_dynamic_rows_launch<T, decltype(chunks)::value, kPrologue>(x, y, mask, rows, qmin, qmax, symmetric,
                                                                            eps);
    return true;
  };
  return with_row_chunks(row_len, launch);
}

template <class T>
bool fake_quantize_dynamic_rows_typed(const Tensor& x, const Tensor& y, std::uint32_t* mask, std::int64_t row_len,
                                      int qmin, int qmax, bool symmetric, float eps, RowPrologue prologue) {
  switch (prologue) {
    case RowPrologue::none:
      return fake_quantize_dynamic_rows_impl<T, RowPrologue::none>(x, y, mask, row_len, qmin, qmax, symmetric, eps);
    case RowPrologue::gelu:
      return fake_quantize_dynamic_rows_impl<T, RowPrologue::gelu>(x, y, mask, row_len, qmin, qmax, symmetric, eps);
    case RowPrologue::gelu_tanh:
      return fake_quantize_dynamic_rows_impl<T, RowPrologue::gelu_tanh>(x, y, mask, row_len, qmin, qmax, symmetric,
                                                                        eps);
  }
  return false;
}

template <class Z>
void round_zero_point_impl(const Tensor& zp, const Tensor& out, std::int64_t qmin, std::int64_t qmax) {
  const Z* z = static_cast<const Z*>(zp.data_ptr());
  std::int32_t* o = out.data<std::int32_t>();
  launch_elementwise(out.device().index, out.numel(),
                     [=] __device__(std::int64_t i) { o[i] = formulas::lsq_zero_point(z[i], qmin, qmax); });
}

}  // namespace

void quant_elementwise(const QuantLaunch& l) {
  dispatch_quant_kernel(l, [&]<class Op>() { engine<Op>(l); });
}

namespace {
// The kernels an observer may precede: fake_quantize and its relu form.
template <class Op>
constexpr bool kFollowsObserver = std::is_same_v<Op, formulas::FakeQuantOp<typename Op::In, true>> ||
                                  std::is_same_v<Op, formulas::FakeQuantOp<typename Op::In, false>> ||
                                  std::is_same_v<Op, formulas::FakeQuantReluOp<typename Op::In, true>> ||
                                  std::is_same_v<Op, formulas::FakeQuantReluOp<typename Op::In, false>>;
}  // namespace

void observe_fake_quantize(const QuantLaunch& fq, const ObserveArgs& obs) {
  dispatch_quant_kernel(fq, [&]<class Op>() {
    if constexpr (kFollowsObserver<Op>) observe_fake_quantize_impl<Op>(fq, obs);
    else throw Error("observe_fake_quantize", "kernel", "only fake_quantize (or its relu form) follows an observer");
  });
}

void observe_fake_quantize_batch(const std::vector<ObserveLaunch>& items) {
  // The tensors observe_rows takes, grouped by what its launch shares: the
  // device, the Op (dtype, kernel, product precision, qmin, qmax) and the
  // averaging constant. The others run one at a time.
  using Key = std::tuple<int, int, int, bool, std::int64_t, std::int64_t, double>;
  std::map<Key, std::vector<const ObserveLaunch*>> groups;
  for (const ObserveLaunch& it : items) {
    const QuantLaunch& a = it.fq;
    const unsigned sms = ::qgrad::cuda::fill_blocks(a.out.device().index, 2048);
    if (observe_rows_per_block(a, it.obs, sms) == 0) {
      if (a.in.numel() > 0) observe_fake_quantize(a, it.obs);
      continue;
    }
    groups[{a.out.device().index, static_cast<int>(a.in.dtype()), static_cast<int>(a.kernel), a.params.product_in_f64,
            a.params.qmin, a.params.qmax, it.obs.averaging_constant}]
        .push_back(&it);
  }
  for (const auto& [key, group] : groups) {
    dispatch_quant_kernel(group.front()->fq, [&]<class Op>() {
      if constexpr (kFollowsObserver<Op>) observe_rows_batch<Op>(group);
      else throw Error("observe_fake_quantize_batch", "kernel", "only fake_quantize (or its relu form) follows an observer");
    });
  }
}

void lsq_backward(const LsqArgs& args) {
  dispatch_floating(args.x.dtype(), "lsq_backward",
                    [&](auto tag) { lsq_backward_impl<typename decltype(tag)::type>(args); });
}

void lsq_round_zero_point(const Tensor& zp, const Tensor& out, std::int64_t qmin, std::int64_t qmax) {
  dispatch_floating(zp.dtype(), "lsq_round_zero_point",
                    [&](auto tag) { round_zero_point_impl<typename decltype(tag)::type>(zp, out, qmin, qmax); });
}

bool fake_quantize_dynamic_rows(const Tensor& x, const Tensor& y, std::uint32_t* mask, std::int64_t row_len, int qmin,
                                int qmax, bool symmetric, float eps, RowPrologue prologue) {
  if (x.numel() == 0 || row_len <= 0 || x.numel() % row_len != 0) return false;
  switch (x.dtype()) {
    case DType::f32:
      return fake_quantize_dynamic_rows_typed<float>(x, y, mask, row_len, qmin, qmax, symmetric, eps, prologue);
    case DType::bf16:
      return fake_quantize_dynamic_rows_typed<bfloat16>(x, y, mask, row_len, qmin, qmax, symmetric, eps, prologue);
    case DType::f16:
      return fake_quantize_dynamic_rows_typed<half>(x, y, mask, row_len, qmin, qmax, symmetric, eps, prologue);
    default: return false;
  }
}

bool fake_quantize_dynamic_rows_batch(const std::vector<RowsBatchItem>& items, std::int64_t row_len, int qmin,
                                      int qmax, bool symmetric, float eps) {
  if (items.empty() || row_len <= 0) return false;
  const DType dt = items[0].x.dtype();
  const Device dev = items[0].x.device();
  for (const RowsBatchItem& it : items)
    if (it.x.dtype() != dt || it.y.dtype() != dt || it.x.device() != dev || it.y.device() != dev ||
        it.x.numel() == 0 || it.x.numel() != it.y.numel() || it.x.numel() % row_len != 0 ||
        it.x.numel() / row_len > (std::int64_t{1} << 31) / 32)
      return false;
  switch (dt) {
    case DType::f32: return fake_quantize_dynamic_rows_batch_typed<float>(items, row_len, qmin, qmax, symmetric, eps);
    case DType::bf16:
      return fake_quantize_dynamic_rows_batch_typed<bfloat16>(items, row_len, qmin, qmax, symmetric, eps);
    case DType::f16: return fake_quantize_dynamic_rows_batch_typed<half>(items, row_len, qmin, qmax, symmetric, eps);
    default: return false;
  }
}

}  // namespace qgrad::kernels::cuda
