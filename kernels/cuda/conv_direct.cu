// conv2d on CUDA without cuDNN for convolutions whose groups have at most
// kDirectMaxChannels input channels: the two gradients of a network's first
// layer (1-3 channels) and of depthwise convolutions, and the forward of a
// first layer. There each output element's sum is
// short and the pass is one read of dy; cuDNN's deterministic engines take
// several times PyTorch's non-deterministic ones (the Fashion-MNIST CNN's first
// layer, 256x1x28x28 -> 32, 3x3: weight gradient 0.092 ms FFT / 0.150 TF32,
// input gradient 0.098, against PyTorch's 0.059 / 0.046; H100, 2026-11-24).
//
// Both sum in op math (f32 for f32/f16/bf16, f64 for f64; full f32 products
// even when TF32 is allowed) by fused multiply-adds (explicit: the build turns
// contraction off for the formulas the CPU shares; convolution promises a
// tolerance across devices, not bits) in a fixed order, and round once: the
// same bits on every run. Shapes beyond the limits below go to cuDNN (kernels/cuda/conv.cu).
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "qgrad/core/memory.h"
#include "qgrad/kernels/cuda/entries.h"
#include "qgrad/kernels/cuda/launch.cuh"
#include "qgrad/kernels/cuda/warp_rows.cuh"
#include "qgrad/kernels/layout.h"
#include "qgrad/kernels/reduce.h"

namespace qgrad::kernels::cuda {

namespace {

constexpr std::int64_t kDirectMaxChannels = 4;  // input channels per group
constexpr int kMaxTaps = 64;                    // taps: (C/groups)·kh·kw, or kh·kw (input gradient)
constexpr std::int64_t kMaxInputTerms = 1024;   // (O/groups)·kh·kw summed per input-gradient element
constexpr std::size_t kMaxSmem = 48 * 1024;     // the default dynamic shared memory limit
constexpr unsigned kThreads = 256;
// Weight gradient: images per block chosen so that the grid is at most this
// many blocks where the batch allows (about one wave of 4 blocks on each of
// an H100's or H200's 132 SMs): the CNN's first layer (256 images, 8 blocks
// of outputs) at 5 images a block was 416 blocks of 70 registers, 3 an SM,
// two waves: 37.8 us (H200).
constexpr std::int64_t kWeightGradBlocks = 512;
constexpr int kElementsPerThread = 2;              // input gradient: a band of at most 512 elements
constexpr std::size_t kMaxInputSmem = 32 * 1024;   // input gradient: 6 blocks of an SM's 227 KB

// The kernels read their operands from zero-padded tiles in shared memory, so
// a tap is one shared load at a fixed offset from the output's base (no bounds
// checks, no divisions): a first attempt reading global memory with both took
// 0.12 / 0.27 ms for the two gradients at the first layer above, more than
// cuDNN.

// Runs store(i, load(i)) for i = first, first + stride, ... below count,
// kStageLoads loads issued before their stores. A staging loop whose every
// iteration waited on one global load was latency-bound: 0.062 / 0.113 ms for
// the two gradients at the first layer above (ncu: compute throughput ~60%,
// most warps waiting).
constexpr int kStageLoads = 8;
template <class Load, class Store>
__device__ __forceinline__ void stage(int first, int stride, int count, Load load, Store store) {
  for (int i0 = first; i0 < count; i0 += kStageLoads * stride) {
    decltype(load(0)) v[kStageLoads] = {};
    QGRAD_UNROLL
    for (int k = 0; k < kStageLoads; ++k)
      if (i0 + k * stride < count) v[k] = load(i0 + k * stride);
    QGRAD_UNROLL
    for (int k = 0; k < kStageLoads; ++k)
      if (i0 + k * stride < count) store(i0 + k * stride, v[k]);
  }
}

// offset[r] for the patch's taps r = (c, i, j) in the weight's order: where
// tap r of an output sits in a [Cg, rows, cols] tile, relative to the
// output's window corner: c·rows·cols + i·dh·cols + j·dw.
void patch_offsets(const Conv2dShape& s, int rows, int cols, int (&offset)[kMaxTaps]) {
  const int kh = static_cast<int>(s.kh), kw = static_cast<int>(s.kw);
  for (int r = 0; r < static_cast<int>(s.patch()); ++r) {
    const int c = r / (kh * kw), i = r % (kh * kw) / kw, j = r % kw;
    offset[r] = (c * rows + i * static_cast<int>(s.dh)) * cols + j * static_cast<int>(s.dw);
  }
}

// Calls f(std::integral_constant<int, Taps>, std::bool_constant<Exact>) for a
// patch of `taps` <= kMaxTaps: the exact count for the common 3x3, 5x5 and 7x7
// kernels of one or three channels (no test per tap), else an upper bound.
template <class F>
void with_taps(std::int64_t taps, F&& f) {
  switch (taps) {
    case 9:
      return f(std::integral_constant<int, 9>{}, std::true_type{});
    case 25:
      return f(std::integral_constant<int, 25>{}, std::true_type{});
    case 27:
      return f(std::integral_constant<int, 27>{}, std::true_type{});
    case 49:
      return f(std::integral_constant<int, 49>{}, std::true_type{});
    default:
      if (taps <= 16) return f(std::integral_constant<int, 16>{}, std::false_type{});
      if (taps <= 32) return f(std::integral_constant<int, 32>{}, std::false_type{});
      return f(std::integral_constant<int, kMaxTaps>{}, std::false_type{});
  }
}

// ---- forward ----
// y[n, o, a, b] (+)= Σ_{c, i, j} W[o, c, i, j] · x[n, g·Cg + c, a·sh − ph + i·dh, b·sw − pw + j·dw]
// (accumulate: onto y, in op math, rounded once). A block per (band of up to
// 256 outputs of whole rows of one image, group); the band's input rows,
// padded by zeros, and the group's weights in shared memory. A thread per
// output position reads its taps once into registers, then writes every
// output channel of the group, each summed in the order (c, i, j). cuDNN's
// engines took 0.045 ms for the first layer (256x1x28x28 -> 32, 3x3; H100),
// a fifth of it the write of y.
struct ForwardGeometry {
  int taps = 0;                   // Cg·kh·kw
  int tap_offset[kMaxTaps] = {};  // c·rows·cols + i·dh·cols + j·dw in the band's tile
  int c = 0, h = 0, w = 0, o = 0, oh = 0, ow = 0, o_per_group = 0, c_per_group = 0, groups = 1;
  int band_rows = 1, tile_rows = 1, tile_cols = 1, sh = 1, sw = 1, ph = 0, pw = 0;
  bool accumulate = false;
  FastDiv div_plane, div_cols, div_ow;  // by tile_rows·tile_cols, tile_cols, OW
};

template <class T, int Taps, bool Exact>
__global__ void forward_kernel(const T* __restrict__ x, const T* __restrict__ weight, T* __restrict__ y,
                               ForwardGeometry g) {
  ::qgrad::cuda::wait_for_prior_kernels();
  using M = op_math_t<T>;
  extern __shared__ unsigned char smem_bytes[];
  M* wsm = reinterpret_cast<M*>(smem_bytes);  // [Og, taps] of the group: the weight's own layout
  M* tile = wsm + g.o_per_group * g.taps;     // [Cg, tile_rows, tile_cols]
  const int n = static_cast<int>(blockIdx.y) / g.groups, grp = static_cast<int>(blockIdx.y) - n * g.groups;
  const int a0 = blockIdx.x * g.band_rows, count = min(g.band_rows, g.oh - a0) * g.ow;
  const int plane = g.tile_rows * g.tile_cols;
  const T* wg = weight + static_cast<std::int64_t>(grp) * g.o_per_group * g.taps;
  const T* xg = x + (static_cast<std::int64_t>(n) * g.c + static_cast<std::int64_t>(grp) * g.c_per_group) * g.h * g.w;
  stage(
      threadIdx.x, kThreads, g.o_per_group * g.taps, [&](int t) { return M(wg[t]); }, [&](int t, M v) { wsm[t] = v; });
  stage(
      threadIdx.x, kThreads, g.c_per_group * plane,
      [&](int t) {
        const int c = static_cast<int>(g.div_plane.div(t)), uv = t - c * plane;
        const int u = static_cast<int>(g.div_cols.div(uv));
        const int ih = a0 * g.sh - g.ph + u, iw = uv - u * g.tile_cols - g.pw;
        return ih >= 0 && ih < g.h && iw >= 0 && iw < g.w ? M(xg[(static_cast<std::int64_t>(c) * g.h + ih) * g.w + iw])
                                                          : M(0);
      },
      [&](int t, M v) { tile[t] = v; });
  __syncthreads();
  const int e = threadIdx.x;
  if (e >= count) return;
  const int la = static_cast<int>(g.div_ow.div(e)), b = e - la * g.ow;
  const M* base = tile + la * g.sh * g.tile_cols + b * g.sw;
  M xv[Taps];
  QGRAD_UNROLL
  for (int r = 0; r < Taps; ++r) xv[r] = Exact || r < g.taps ? base[g.tap_offset[r]] : M(0);
  T* yp = y +
          ((static_cast<std::int64_t>(n) * g.o + static_cast<std::int64_t>(grp) * g.o_per_group) * g.oh + a0) * g.ow +
          e;
  const std::int64_t channel_stride = static_cast<std::int64_t>(g.oh) * g.ow;
  for (int ol = 0; ol < g.o_per_group; ++ol) {
    const M* wo = wsm + ol * g.taps;
    M acc = M(0);
    QGRAD_UNROLL
    for (int r = 0; r < Taps; ++r)
      if (Exact || r < g.taps) acc = fma(xv[r], wo[r], acc);
    T* out = yp + ol * channel_stride;
    *out = g.accumulate ? T(M(*out) + acc) : T(acc);
  }
}

struct ForwardLayout {
  int band_rows = 1, tile_rows = 1, tile_cols = 1;
  std::size_t smem = 0;  // 0: no direct forward for this shape
};

template <class M>
ForwardLayout forward_layout(const Conv2dShape& s) {
  ForwardLayout l;
  if (s.ow > kThreads) return l;
  l.band_rows = static_cast<int>(std::min<std::int64_t>(s.oh, kThreads / s.ow));
  l.tile_rows = static_cast<int>((l.band_rows - 1) * s.sh + (s.kh - 1) * s.dh + 1);
  l.tile_cols = static_cast<int>((s.ow - 1) * s.sw + (s.kw - 1) * s.dw + 1);
  const std::size_t bytes =
      static_cast<std::size_t>(s.o_per_group() * s.patch() + s.c_per_group() * l.tile_rows * l.tile_cols) * sizeof(M);
  if (bytes <= kMaxSmem) l.smem = bytes;
  return l;
}

// Groups of at least 4 output channels (a first layer): a depthwise
// convolution's block would write one channel per staged tile, and cuDNN was
// not measured against it.
template <class M>
bool forward_applies(const Conv2dShape& s) {
  return s.c_per_group() <= kDirectMaxChannels && s.o_per_group() >= 4 && s.patch() <= kMaxTaps &&
         s.n * s.groups <= 65535 && s.c * s.h * s.w < (std::int64_t(1) << 30) && forward_layout<M>(s).smem > 0;
}

template <class T, int Taps, bool Exact>
void forward(const Conv2dShape& s, const Tensor& x, const Tensor& weight, const Tensor& y, bool accumulate) {
  using M = op_math_t<T>;
  const ForwardLayout l = forward_layout<M>(s);
  ForwardGeometry g;
  g.taps = static_cast<int>(s.patch());
  g.c = static_cast<int>(s.c), g.h = static_cast<int>(s.h), g.w = static_cast<int>(s.w), g.o = static_cast<int>(s.o);
  g.oh = static_cast<int>(s.oh), g.ow = static_cast<int>(s.ow), g.o_per_group = static_cast<int>(s.o_per_group());
  g.c_per_group = static_cast<int>(s.c_per_group()), g.groups = static_cast<int>(s.groups);
  g.band_rows = l.band_rows, g.tile_rows = l.tile_rows, g.tile_cols = l.tile_cols;
  g.sh = static_cast<int>(s.sh), g.sw = static_cast<int>(s.sw), g.ph = static_cast<int>(s.ph);
  g.pw = static_cast<int>(s.pw), g.accumulate = accumulate;
  g.div_plane = FastDiv(static_cast<std::uint32_t>(l.tile_rows * l.tile_cols));
  g.div_cols = FastDiv(static_cast<std::uint32_t>(l.tile_cols));
  g.div_ow = FastDiv(static_cast<std::uint32_t>(s.ow));
  patch_offsets(s, l.tile_rows, l.tile_cols, g.tap_offset);
  ::qgrad::cuda::launch_kernel(
      y.device().index, forward_kernel<T, Taps, Exact>,
      dim3(static_cast<unsigned>((s.oh + l.band_rows - 1) / l.band_rows), static_cast<unsigned>(s.n * s.groups)),
      dim3(kThreads), l.smem, static_cast<const T*>(x.data_ptr()), static_cast<const T*>(weight.data_ptr()),
      static_cast<T*>(y.data_ptr()), g);
}

// ---- weight gradient ----
// dW[o, c, i, j] = Σ_{n, a, b} dy[n, o, a, b] · x[n, g·Cg + c, a·sh − ph + i·dh, b·sw − pw + j·dw].
// Level 1: a block per (o, run of images_per_block images); per image the o's
// group of x planes goes to a tile padded by (ph, pw) zeros, thread t adds
// the taps' products for outputs t, t + 256, ... of the image, images in
// order; a warp's lanes combine by warp_lane_sum's tree, the 8 warps in order.
// Level 2: a thread per weight element adds the runs' partials in order.
struct WeightGradGeometry {
  int taps = 0;                   // Cg·kh·kw
  int tap_offset[kMaxTaps] = {};  // c·Hp·Wp + i·dh·Wp + j·dw in the padded tile
  int n = 0, c = 0, h = 0, w = 0, hp = 0, wp = 0, ph = 0, pw = 0, sh = 1, sw = 1;
  int o = 0, o_per_group = 0, c_per_group = 0, ohw = 0, images_per_block = 1;
  FastDiv div_ow, div_w, div_hw;
};

// Taps: the exact tap count when Exact (the common 3x3, 5x5, 7x7 kernels of
// one or three channels: no test per tap), else an upper bound. Outs: output
// channels per block, consecutive and of one group; they share the block's x
// tile (staged once per image for all of them) and each keeps its own
// accumulators, summed in the order above (the same bits for any Outs).
// Blocks an SM must hold: 4 (at most 64 registers) where the accumulators
// are f32 and few enough (Outs x Taps <= 36) to fit without spilling.
template <class M, int Taps, int Outs>
constexpr int weight_grad_min_blocks() {
  return sizeof(M) == 4 && Taps * Outs <= 36 ? 4 : 1;
}

template <class T, int Taps, bool Exact, int Outs>
__global__ void __launch_bounds__(kThreads, (weight_grad_min_blocks<op_math_t<T>, Taps, Outs>()))
    weight_grad_partials_kernel(const T* __restrict__ x, const T* __restrict__ dy,
                                            op_math_t<T>* __restrict__ partial, WeightGradGeometry g) {
  ::qgrad::cuda::wait_for_prior_kernels();
  using M = op_math_t<T>;
  extern __shared__ unsigned char smem_bytes[];
  M* tile = reinterpret_cast<M*>(smem_bytes);  // [Cg, Hp, Wp]
  const int tile_size = g.c_per_group * g.hp * g.wp;
  M* dy_tile = tile + tile_size;  // [Outs, OH·OW]
  const int o0 = blockIdx.y * Outs;
  const int n_begin = blockIdx.x * g.images_per_block;
  const int n_end = min(n_begin + g.images_per_block, g.n);
  const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int hw = g.h * g.w;
  for (int e = threadIdx.x; e < tile_size; e += kThreads) tile[e] = M(0);  // the padding stays zero
  M acc[Outs][Taps];
  QGRAD_UNROLL
  for (int k = 0; k < Outs; ++k) {
    QGRAD_UNROLL
    for (int r = 0; r < Taps; ++r) acc[k][r] = M(0);
  }
  for (int n = n_begin; n < n_end; ++n) {
    __syncthreads();  // the previous image's reads (and the zeroing) are done
    const T* xs =
        x + (static_cast<std::int64_t>(n) * g.c + static_cast<std::int64_t>(o0 / g.o_per_group) * g.c_per_group) * hw;
    stage(
        threadIdx.x, kThreads, g.c_per_group * hw, [&](int e) { return M(xs[e]); },
        [&](int e, M v) {
          const int c = static_cast<int>(g.div_hw.div(e)), p = e - c * hw;
          const int ih = static_cast<int>(g.div_w.div(p)), iw = p - ih * g.w;
          tile[(c * g.hp + ih + g.ph) * g.wp + iw + g.pw] = v;
        });
    const T* dys = dy + (static_cast<std::int64_t>(n) * g.o + o0) * g.ohw;  // Outs consecutive planes
    stage(
        threadIdx.x, kThreads, Outs * g.ohw, [&](int p) { return M(dys[p]); }, [&](int p, M v) { dy_tile[p] = v; });
    __syncthreads();
    for (int p = threadIdx.x; p < g.ohw; p += kThreads) {
      const int a = static_cast<int>(g.div_ow.div(p)), b = p - a * static_cast<int>(g.div_ow.d);
      const M* base = tile + a * g.sh * g.wp + b * g.sw;
      QGRAD_UNROLL
      for (int k = 0; k < Outs; ++k) {
        const M d = dy_tile[k * g.ohw + p];
        QGRAD_UNROLL
        for (int r = 0; r < Taps; ++r)
          if (Exact || r < g.taps) acc[k][r] = fma(d, base[g.tap_offset[r]], acc[k][r]);
      }
    }
  }
  __shared__ M warp_sums[kThreads / 32][Outs * Taps];
  QGRAD_UNROLL
  for (int k = 0; k < Outs; ++k) {
    QGRAD_UNROLL
    for (int r = 0; r < Taps; ++r) {
      if (Exact || r < g.taps) {
        const M s = warp_lane_sum(acc[k][r]);
        if (lane == 0) warp_sums[warp][k * Taps + r] = s;
      }
    }
  }
  __syncthreads();
  for (int t = threadIdx.x; t < Outs * g.taps; t += kThreads) {
    const int k = t / g.taps, r = t - k * g.taps;
    M s = warp_sums[0][k * Taps + r];
    for (unsigned v = 1; v < kThreads / 32; ++v) s += warp_sums[v][k * Taps + r];
    partial[(static_cast<std::int64_t>(blockIdx.x) * g.o + o0 + k) * g.taps + r] = s;
  }
}

// dweight[e] = Σ_run partial[run, e] in order (e = o·taps + r: the weight's
// own layout [O, Cg, kh, kw]).
template <class T>
__global__ void weight_grad_runs_kernel(const op_math_t<T>* __restrict__ partial, T* __restrict__ dweight,
                                        std::int64_t elements, std::int64_t runs) {
  ::qgrad::cuda::wait_for_prior_kernels();
  using M = op_math_t<T>;
  const std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= elements) return;
  dweight[e] = T(sum_strided(partial + e, runs, elements));  // loads issued 8 at a time
}

// The padded x planes of a group and dy's plane.
template <class M>
std::size_t weight_grad_tile_bytes(const Conv2dShape& s, std::int64_t outs = 1) {
  return static_cast<std::size_t>(s.c_per_group() * (s.h + 2 * s.ph) * (s.w + 2 * s.pw) + outs * s.oh * s.ow) *
         sizeof(M);
}

// Output channels per weight-gradient block: 4 where they fit (a group of a
// multiple of 4 outputs, their accumulators within registers: up to 9 taps,
// their dy planes within shared memory), else 1.
template <class M, int Taps>
int weight_grad_outs(const Conv2dShape& s) {
  constexpr int kOuts = 4;
  if (Taps > 9 || s.o_per_group() % kOuts != 0 || weight_grad_tile_bytes<M>(s, kOuts) > kMaxSmem) return 1;
  return kOuts;
}

template <class M>
bool weight_grad_applies(const Conv2dShape& s) {
  return s.c_per_group() <= kDirectMaxChannels && s.patch() <= kMaxTaps && s.o <= 65535 &&
         s.n < (std::int64_t(1) << 30) && s.c * s.h * s.w < (std::int64_t(1) << 30) &&
         weight_grad_tile_bytes<M>(s) <= kMaxSmem;
}

template <class T, int Taps, bool Exact>
void weight_grad(const Conv2dShape& s, const Tensor& x, const Tensor& dy, const Tensor& dweight) {
  using M = op_math_t<T>;
  WeightGradGeometry g;
  g.taps = static_cast<int>(s.patch());
  g.n = static_cast<int>(s.n), g.c = static_cast<int>(s.c), g.h = static_cast<int>(s.h), g.w = static_cast<int>(s.w);
  g.ph = static_cast<int>(s.ph), g.pw = static_cast<int>(s.pw), g.hp = g.h + 2 * g.ph, g.wp = g.w + 2 * g.pw;
  g.sh = static_cast<int>(s.sh), g.sw = static_cast<int>(s.sw);
  g.o = static_cast<int>(s.o), g.o_per_group = static_cast<int>(s.o_per_group());
  g.c_per_group = static_cast<int>(s.c_per_group()), g.ohw = static_cast<int>(s.oh * s.ow);
  const std::int64_t output_blocks = s.o / weight_grad_outs<M, Taps>(s);
  g.images_per_block = static_cast<int>(
      std::max<std::int64_t>(1, (s.n * output_blocks + kWeightGradBlocks - 1) / kWeightGradBlocks));
  g.div_ow = FastDiv(static_cast<std::uint32_t>(s.ow));
  g.div_w = FastDiv(static_cast<std::uint32_t>(s.w));
  g.div_hw = FastDiv(static_cast<std::uint32_t>(s.h * s.w));
  patch_offsets(s, g.hp, g.wp, g.tap_offset);
  const int dev = dweight.device().index;
  const std::int64_t runs = (s.n + g.images_per_block - 1) / g.images_per_block, elements = s.o * g.taps;
  M* partial =
      static_cast<M*>(memory::allocate(static_cast<std::size_t>(runs * elements) * sizeof(M), dweight.device()));
  const auto launch = [&](auto outs) {
    constexpr int kOuts = decltype(outs)::value;
    ::qgrad::cuda::launch_kernel(dev, weight_grad_partials_kernel<T, Taps, Exact, kOuts>,
                                 dim3(static_cast<unsigned>(runs), static_cast<unsigned>(s.o / kOuts)), dim3(kThreads),
                                 weight_grad_tile_bytes<M>(s, kOuts), static_cast<const T*>(x.data_ptr()),
                                 static_cast<const T*>(dy.data_ptr()), partial, g);
  };
  if (weight_grad_outs<M, Taps>(s) == 4) launch(std::integral_constant<int, 4>{});
  else launch(std::integral_constant<int, 1>{});
  ::qgrad::cuda::launch_kernel(dev, weight_grad_runs_kernel<T>, dim3(::qgrad::cuda::blocks_for(elements, kThreads)),
                               dim3(kThreads), 0, static_cast<const M*>(partial), static_cast<T*>(dweight.data_ptr()),
                               elements, runs);
  // The next user of the block is queued after these kernels on the same stream.
  memory::release(partial, dweight.device());
}

// ---- input gradient ----
// dx[n, c, ih, iw] = Σ_{o in c's group, i, j} dy[n, o, a, b] · W[o, c − g·Cg, i, j]
// over a·sh = ih + ph − i·dh, b·sw = iw + pw − j·dw in range. A block per
// (band of up to 512 elements of rows of one (n, c) plane); the band's dy
// planes go, a stage of planes_per_stage at a time, to tiles where element
// (u, v) holds dy at a·sh = r0 + u + ph − (kh − 1)·dh, b·sw = v + pw − (kw −
// 1)·dw (zero where that is no output: outside, or between strides), so tap
// (i, j) of element (li, iw) is the tile's (li + (kh−1−i)·dh, iw + (kw−1−j)·dw).
// Each element sums in the order (o, i, j); the weights of channel c in shared
// memory.
struct InputGradGeometry {
  int taps = 0;                   // kh·kw
  int tap_offset[kMaxTaps] = {};  // (kh−1−i)·dh·V + (kw−1−j)·dw
  int c = 0, h = 0, w = 0, o = 0, oh = 0, ow = 0, o_per_group = 0, c_per_group = 0;
  int band_rows = 1, tile_rows = 1, tile_cols = 1, top = 0, left = 0, sh = 1, sw = 1;
  int planes_per_stage = 1;
  FastDiv div_tile, div_cols;  // by tile_rows·tile_cols, tile_cols
};

// Input channel cl of `group`: its weights [o_per_group, taps] into shared
// memory in op math, for the input-gradient kernels (a thread per value).
template <class T, class M>
__device__ __forceinline__ void stage_channel_weights(const T* __restrict__ weight, M* wsm, int group, int cl,
                                                      int o_per_group, int c_per_group, int taps) {
  for (int t = threadIdx.x; t < o_per_group * taps; t += kThreads) {
    const int ol = t / taps, r = t % taps;
    wsm[t] = M(weight[(static_cast<std::int64_t>(group * o_per_group + ol) * c_per_group + cl) * taps + r]);
  }
}

template <class T>
__global__ void input_grad_kernel(const T* __restrict__ dy, const T* __restrict__ weight, T* __restrict__ dx,
                                  InputGradGeometry g) {
  ::qgrad::cuda::wait_for_prior_kernels();
  using M = op_math_t<T>;
  extern __shared__ unsigned char smem_bytes[];
  M* wsm = reinterpret_cast<M*>(smem_bytes);  // [Og, kh·kw] of channel c
  M* tile = wsm + g.o_per_group * g.taps;     // [planes_per_stage, tile_rows, tile_cols]
  const std::int64_t plane = blockIdx.y;      // n·C + c
  const int n = static_cast<int>(plane / g.c), c = static_cast<int>(plane % g.c);
  const int group = c / g.c_per_group, cl = c % g.c_per_group;
  const int r0 = blockIdx.x * g.band_rows, rows = min(g.band_rows, g.h - r0), band = rows * g.w;
  stage_channel_weights(weight, wsm, group, cl, g.o_per_group, g.c_per_group, g.taps);
  int base[kElementsPerThread];
  QGRAD_UNROLL
  for (int k = 0; k < kElementsPerThread; ++k) {
    const int e = threadIdx.x + k * kThreads, li = e / g.w;
    base[k] = li * g.tile_cols + (e - li * g.w);
  }
  M acc[kElementsPerThread];
  QGRAD_UNROLL
  for (int k = 0; k < kElementsPerThread; ++k) acc[k] = M(0);
  const int tile_size = g.tile_rows * g.tile_cols;
  const T* dyn =
      dy + (static_cast<std::int64_t>(n) * g.o + static_cast<std::int64_t>(group) * g.o_per_group) * g.oh * g.ow;
  for (int o0 = 0; o0 < g.o_per_group; o0 += g.planes_per_stage) {
    const int planes = min(g.planes_per_stage, g.o_per_group - o0);
    __syncthreads();  // the weights are in; the previous stage's reads are done
    stage(
        threadIdx.x, kThreads, planes * tile_size,
        [&](int t) {
          const int pl = static_cast<int>(g.div_tile.div(t)), rem = t - pl * tile_size;
          const int u = static_cast<int>(g.div_cols.div(rem));
          const int th = r0 + u + g.top, tw = rem - u * g.tile_cols + g.left;
          const int a = g.sh == 1 ? th : th / g.sh, b = g.sw == 1 ? tw : tw / g.sw;
          const bool in = th >= 0 && tw >= 0 && a < g.oh && b < g.ow && (g.sh == 1 || th % g.sh == 0) &&
                          (g.sw == 1 || tw % g.sw == 0);
          return in ? M(dyn[(static_cast<std::int64_t>(o0 + pl) * g.oh + a) * g.ow + b]) : M(0);
        },
        [&](int t, M v) { tile[t] = v; });
    __syncthreads();
    for (int pl = 0; pl < planes; ++pl) {
      const M* tp = tile + pl * tile_size;
      const M* wp = wsm + (o0 + pl) * g.taps;
      for (int r = 0; r < g.taps; ++r) {
        const M wv = wp[r];
        const int off = g.tap_offset[r];
        QGRAD_UNROLL
        for (int k = 0; k < kElementsPerThread; ++k)
          if (static_cast<int>(threadIdx.x) + k * static_cast<int>(kThreads) < band)
            acc[k] = fma(tp[base[k] + off], wv, acc[k]);
      }
    }
  }
  T* dxp = dx + plane * g.h * g.w + static_cast<std::int64_t>(r0) * g.w;
  QGRAD_UNROLL
  for (int k = 0; k < kElementsPerThread; ++k) {
    const int e = threadIdx.x + k * kThreads;
    if (e < band) dxp[e] = T(acc[k]);
  }
}

// Stride 1 (kh·kw of 9 or 25, at least 4 output channels a group): no staging. A thread per dx element reads
// its taps of each dy plane straight from global memory (neighbouring
// threads share them through L1), every load of a plane issued before the
// multiply-adds that use it: the addresses clamped into the plane and the
// taps outside it selected to 0 after their loads (a load under a branch
// would wait for the one before). The same terms in the same order (o, i, j)
// as input_grad_kernel, so the same bits. The staged kernel took 0.064 ms
// for the CNN's first layer (256x1x28x28 -> 32, 3x3) against PyTorch's
// non-deterministic 0.046 (H200), this one 0.040.
struct InputGradStride1 {
  int c = 0, h = 0, w = 0, o = 0, oh = 0, ow = 0, o_per_group = 0, c_per_group = 0, ph = 0, pw = 0;
  int tap_row[kMaxTaps] = {}, tap_col[kMaxTaps] = {};  // i·dh, j·dw of tap r = i·kw + j
  FastDiv div_w;
};

template <class T, int Taps>
__global__ void __launch_bounds__(kThreads) input_grad_stride1_kernel(const T* __restrict__ dy,
                                                                      const T* __restrict__ weight,
                                                                      T* __restrict__ dx, InputGradStride1 g) {
  ::qgrad::cuda::wait_for_prior_kernels();
  using M = op_math_t<T>;
  extern __shared__ unsigned char smem_bytes[];
  M* wsm = reinterpret_cast<M*>(smem_bytes);  // [Og, Taps] of channel c
  const std::int64_t plane = blockIdx.y;      // n·C + c
  const int n = static_cast<int>(plane / g.c), c = static_cast<int>(plane % g.c);
  const int group = c / g.c_per_group, cl = c % g.c_per_group;
  stage_channel_weights(weight, wsm, group, cl, g.o_per_group, g.c_per_group, Taps);
  __syncthreads();
  const int e = static_cast<int>(blockIdx.x * kThreads + threadIdx.x);
  if (e >= g.h * g.w) return;
  const int ih = static_cast<int>(g.div_w.div(static_cast<std::uint32_t>(e))), iw = e - ih * g.w;
  int off[Taps];
  bool inside[Taps];
  QGRAD_UNROLL
  for (int r = 0; r < Taps; ++r) {
    const int a = ih + g.ph - g.tap_row[r], b = iw + g.pw - g.tap_col[r];
    inside[r] = a >= 0 && a < g.oh && b >= 0 && b < g.ow;
    off[r] = inside[r] ? a * g.ow + b : 0;
  }
  const std::int64_t plane_size = static_cast<std::int64_t>(g.oh) * g.ow;
  const T* p = dy + (static_cast<std::int64_t>(n) * g.o + static_cast<std::int64_t>(group) * g.o_per_group) * plane_size;
  M acc = M(0);
#pragma unroll 2
  for (int ol = 0; ol < g.o_per_group; ++ol) {
    const T* q = p + ol * plane_size;
    T v[Taps];
    QGRAD_UNROLL
    for (int r = 0; r < Taps; ++r) v[r] = q[off[r]];
    const M* wp = wsm + ol * Taps;
    QGRAD_UNROLL
    for (int r = 0; r < Taps; ++r) acc = fma(inside[r] ? M(v[r]) : M(0), wp[r], acc);
  }
  dx[plane * g.h * g.w + e] = T(acc);
}

struct InputGradLayout {
  int band_rows = 1, tile_rows = 1, tile_cols = 1, planes_per_stage = 0;
  std::size_t smem = 0;
};

template <class M>
InputGradLayout input_grad_layout(const Conv2dShape& s) {
  InputGradLayout l;
  if (s.w > kThreads * kElementsPerThread) return l;
  l.band_rows = static_cast<int>(std::min<std::int64_t>(s.h, kThreads * kElementsPerThread / s.w));
  l.tile_rows = static_cast<int>(l.band_rows + (s.kh - 1) * s.dh);
  l.tile_cols = static_cast<int>(s.w + (s.kw - 1) * s.dw);
  const std::size_t weights = static_cast<std::size_t>(s.o_per_group() * s.kh * s.kw) * sizeof(M);
  const std::size_t plane = static_cast<std::size_t>(l.tile_rows) * static_cast<std::size_t>(l.tile_cols) * sizeof(M);
  if (weights + plane > kMaxInputSmem) return l;
  l.planes_per_stage = static_cast<int>(std::min<std::int64_t>(s.o_per_group(), (kMaxInputSmem - weights) / plane));
  l.smem = weights + plane * static_cast<std::size_t>(l.planes_per_stage);
  return l;
}

template <class M>
bool input_grad_applies(const Conv2dShape& s) {
  return s.c_per_group() <= kDirectMaxChannels && s.o_per_group() * s.kh * s.kw <= kMaxInputTerms &&
         s.kh * s.kw <= kMaxTaps && s.n * s.c <= 65535 && s.o * s.oh * s.ow < (std::int64_t(1) << 30) &&
         s.h * s.w < (std::int64_t(1) << 30) && input_grad_layout<M>(s).planes_per_stage > 0;
}

template <class T, int Taps>
void input_grad_stride1(const Conv2dShape& s, const Tensor& dy, const Tensor& weight, const Tensor& dx) {
  using M = op_math_t<T>;
  InputGradStride1 g;
  g.c = static_cast<int>(s.c), g.h = static_cast<int>(s.h), g.w = static_cast<int>(s.w), g.o = static_cast<int>(s.o);
  g.oh = static_cast<int>(s.oh), g.ow = static_cast<int>(s.ow), g.o_per_group = static_cast<int>(s.o_per_group());
  g.c_per_group = static_cast<int>(s.c_per_group()), g.ph = static_cast<int>(s.ph), g.pw = static_cast<int>(s.pw);
  for (int r = 0; r < Taps; ++r) {
    g.tap_row[r] = static_cast<int>(r / s.kw * s.dh);
    g.tap_col[r] = static_cast<int>(r % s.kw * s.dw);
  }
  g.div_w = FastDiv(static_cast<std::uint32_t>(s.w));
  ::qgrad::cuda::launch_kernel(
      dx.device().index, input_grad_stride1_kernel<T, Taps>,
      dim3(static_cast<unsigned>((s.h * s.w + kThreads - 1) / kThreads), static_cast<unsigned>(s.n * s.c)),
      dim3(kThreads), static_cast<std::size_t>(s.o_per_group()) * Taps * sizeof(M),
      static_cast<const T*>(dy.data_ptr()), static_cast<const T*>(weight.data_ptr()), static_cast<T*>(dx.data_ptr()),
      g);
}

template <class T>
void input_grad(const Conv2dShape& s, const Tensor& dy, const Tensor& weight, const Tensor& dx) {
  using M = op_math_t<T>;
  // Several dy planes an element (a first layer: 32): the staged kernel's
  // per-plane tile costs dominate there. A depthwise convolution (one plane)
  // stays staged: 0.247 ms staged against 0.283 at 64x96x56x56 (H200).
  if (s.sh == 1 && s.sw == 1 && s.o_per_group() >= 4) {
    if (s.kh * s.kw == 9) return input_grad_stride1<T, 9>(s, dy, weight, dx);
    if (s.kh * s.kw == 25) return input_grad_stride1<T, 25>(s, dy, weight, dx);
  }
  const InputGradLayout l = input_grad_layout<M>(s);
  InputGradGeometry g;
  g.taps = static_cast<int>(s.kh * s.kw);
  g.c = static_cast<int>(s.c), g.h = static_cast<int>(s.h), g.w = static_cast<int>(s.w), g.o = static_cast<int>(s.o);
  g.oh = static_cast<int>(s.oh), g.ow = static_cast<int>(s.ow), g.o_per_group = static_cast<int>(s.o_per_group());
  g.c_per_group = static_cast<int>(s.c_per_group());
  g.band_rows = l.band_rows, g.tile_rows = l.tile_rows, g.tile_cols = l.tile_cols;
  g.planes_per_stage = l.planes_per_stage;
  g.div_tile = FastDiv(static_cast<std::uint32_t>(l.tile_rows * l.tile_cols));
  g.div_cols = FastDiv(static_cast<std::uint32_t>(l.tile_cols));
  g.top = static_cast<int>(s.ph - (s.kh - 1) * s.dh), g.left = static_cast<int>(s.pw - (s.kw - 1) * s.dw);
  g.sh = static_cast<int>(s.sh), g.sw = static_cast<int>(s.sw);
  for (int r = 0; r < g.taps; ++r) {
    const int i = r / static_cast<int>(s.kw), j = r % static_cast<int>(s.kw);
    g.tap_offset[r] = static_cast<int>((s.kh - 1 - i) * s.dh) * g.tile_cols + static_cast<int>((s.kw - 1 - j) * s.dw);
  }
  ::qgrad::cuda::launch_kernel(
      dx.device().index, input_grad_kernel<T>,
      dim3(static_cast<unsigned>((s.h + l.band_rows - 1) / l.band_rows), static_cast<unsigned>(s.n * s.c)),
      dim3(kThreads), l.smem, static_cast<const T*>(dy.data_ptr()), static_cast<const T*>(weight.data_ptr()),
      static_cast<T*>(dx.data_ptr()), g);
}

}  // namespace

bool conv2d_forward_direct(const Conv2dShape& s, const Tensor& x, const Tensor& weight, const Tensor& y,
                           bool accumulate) {
  if (s.n == 0) return false;
  bool ran = false;
  dispatch_floating(y.dtype(), "conv2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (!forward_applies<op_math_t<T>>(s)) return;
    with_taps(s.patch(), [&](auto taps, auto exact) {
      forward<T, decltype(taps)::value, decltype(exact)::value>(s, x, weight, y, accumulate);
    });
    ran = true;
  });
  return ran;
}

bool conv2d_backward_weight_direct(const Conv2dShape& s, const Tensor& x, const Tensor& dy, const Tensor& dweight) {
  if (s.n == 0) return false;
  bool ran = false;
  dispatch_floating(dweight.dtype(), "conv2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (!weight_grad_applies<op_math_t<T>>(s)) return;
    with_taps(s.patch(), [&](auto taps, auto exact) {
      weight_grad<T, decltype(taps)::value, decltype(exact)::value>(s, x, dy, dweight);
    });
    ran = true;
  });
  return ran;
}

bool conv2d_backward_input_direct(const Conv2dShape& s, const Tensor& dy, const Tensor& weight, const Tensor& dx) {
  if (s.n == 0) return false;
  bool ran = false;
  dispatch_floating(dx.dtype(), "conv2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (!input_grad_applies<op_math_t<T>>(s)) return;
    input_grad<T>(s, dy, weight, dx);
    ran = true;
  });
  return ran;
}

}  // namespace qgrad::kernels::cuda
