// CUDA kernels of observe + fake quantize over rows (per-channel weights on
// axis 0: observe_rows_fake_quantize, observe_fake_quantize_batch): each
// row's observer update and qparams, then the fake quantize, in one launch
// (several tensors in one for the batch). Whole tensors: quantize_observe.cu.
#include <algorithm>
#include <cstdint>
#include <map>
#include <numeric>
#include <tuple>
#include <vector>

#include "qgrad/kernels/bitmask.h"
#include "qgrad/kernels/cuda/launch.cuh"
#include "qgrad/kernels/cuda/minmax.cuh"
#include "qgrad/kernels/cuda/quant_engine.cuh"
#include "qgrad/kernels/observer.h"
#include "qgrad/kernels/quantize.h"
#include "qgrad/kernels/vec4.h"

namespace qgrad::kernels::cuda {

namespace {

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

// The rows of launch a observed and fake quantized in one launch; false,
// nothing launched, where its layout does not take the row kernel.
template <class Op>
bool observe_rows_impl(const QuantLaunch& a, const ObserveArgs& o) {
  const int dev = a.out.device().index;
  const unsigned sms = ::qgrad::cuda::fill_blocks(dev, 2048);  // one block per SM
  ObserveRows<Op> g;
  bool vec = false;
  if (!observe_rows_of(a, o, sms, g, vec)) return false;
  const Op op{a.params.qmin, a.params.qmax};
  const std::int64_t blocks = observe_rows_blocks(g);
  const float c = static_cast<float>(o.averaging_constant);
  const bool moving = o.averaging_constant >= 0.0;
  with_rows_launch_shape(blocks, sms, vec, [&]<bool kVec, unsigned kThreads>() {
    ::qgrad::cuda::launch_kernel(dev, observe_rows_kernel<Op, kVec, kThreads>, static_cast<unsigned>(blocks), kThreads,
                                 0, op, g, c, moving);
  });
  return true;
}

// observe_rows_impl of items (one Op, device, qmin, qmax and averaging
// constant, each taking observe_rows), kObserveRowsBatchMax a launch.
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
      observe_rows_impl<Op>(items[first]->fq, items[first]->obs);
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

}  // namespace

bool observe_rows_fake_quantize(const QuantLaunch& fq, const ObserveArgs& obs) {
  bool launched = false;
  dispatch_quant_kernel(fq, [&]<class Op>() {
    if constexpr (kFollowsObserver<Op>) launched = observe_rows_impl<Op>(fq, obs);
    else throw Error("observe_fake_quantize", "kernel", "only fake_quantize (or its relu form) follows an observer");
  });
  return launched;
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

}  // namespace qgrad::kernels::cuda
