// conv2d's three passes on TF32 tensor cores for small planes, NCHW, against
// the library's cuDNN passes (issue #12 item 5: the CNN step's second
// convolution, 256x32x14x14 -> 64, 3x3, padding 1).
//
// The library stages that convolution channels-last (kernels/conv.h): x and
// the weight copied to NHWC in the forward, dy in the backward, cuDNN graph
// engines writing NCHW. These kernels instead read NCHW in place: each pass
// an implicit GEMM of one image's zero-padded planes in shared memory (a tap
// is a shared load at coff[q] + poff[p] from the output's window corner, as
// in conv_direct.cu), mma.sync m16n8k8 .tf32 (the operands' f32 bits: the
// tensor cores read their TF32 part), f32 accumulation, sums in a fixed order:
//   forward         y[n, o, p]  = Σ_q W[o, q] · X_n[q, p],  q = (c, i, j)
//   input gradient  dx[n, c, p] = Σ_q W'[c, q] · DY_n[q, p], q = (o, i, j),
//                   W'[c, (o, i, j)] = W[o, c, kh-1-i, kw-1-j], dy padded by kh-1-ph
//   weight          dW[o, q]    = Σ_n Σ_p dy[n, o, p] · X_n[q, p]
// (per-block partials over images, summed over blocks in a fixed order).
// Operands reach shared memory by cp.async; the input channels go in phases
// where all at once would leave room for one block an SM.
//
// Measured in the sixty-second session (H200, the library build carrying
// these kernels behind conv2d's dispatch; docs/benchmarks.md): bench_conv's
// TF32 rows fwd / dx / dW 0.0511 / 0.0437 / 0.0382 ms (the library's NCHW
// cuDNN rows 0.047 / 0.056 / 0.082, PyTorch's 0.073 / 0.092 / 0.122), but the
// captured CNN step 0.4383-0.4394 ms against 0.4344-0.4363 with the staged
// cuDNN passes: not taken into the library. The first versions lost far more
// (step 0.683 ms: a TF32 rounding applied to each staged load made the
// compiler finish each load before the next; 0.465: a branch per tile between
// a step's shared loads and its products).
//
// This program checks the three passes against f32 cuDNN (FMA math; within
// TF32's bound, every output written over a poisoned buffer, the same bits on
// a second run) and times, captured in a CUDA graph (captured_timing.cuh), µs
// a pass: the tensor-core passes, the library's staged passes with their
// copies (fwd: x and weight copies + pass; dx: dy copy + pass; dW: pass),
// and the library's NCHW TF32 cuDNN passes.
//
// The kernels here are the ones measured above (the library build's, moved
// here unchanged but for the weight gradient's images a block, now an
// argument); this harness around them was compiled (nvcc 13.0, -Werror) but
// not yet run: the session's device time was spent.
//
// Run by hand on the GPU machine:
//   build-gpu/dev/dev_conv_tensor_core [N C H W O K PAD [IMAGES_PER_BLOCK]]
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

#include "../../bench/bench_common.h"
#include "captured_timing.cuh"
#include "qgrad/core/memory.h"
#include "qgrad/kernels/conv.h"
#include "qgrad/kernels/cuda/launch.cuh"
#include "qgrad/kernels/cuda/mbarrier.cuh"
#include "qgrad/kernels/layout.h"
#include "qgrad/kernels/reduce.h"

using namespace qgrad;
using qgrad::kernels::Conv2dShape;
using qgrad::kernels::FastDiv;
using qgrad::kernels::sum_strided;
using qgrad::kernels::cuda::allow_dynamic_smem;
using qgrad::kernels::cuda::cp_async16;
using qgrad::kernels::cuda::cp_async4;
using qgrad::kernels::cuda::cp_async_wait_all;

namespace {

constexpr int kPlaneWarps = 8;   // forward / input gradient: the warps split an image's position tiles
constexpr int kWeightWarps = 8;  // weight gradient: 2 (output channels) x 4 (patch columns)
constexpr int kMaxPositions = 256;                 // output positions of an image (one block holds them all)
constexpr std::size_t kSmemLimit = 220 * 1024;     // of an H100's / H200's 227 KB a block
constexpr int kMaxPlaneMTiles = 4;                 // forward / input gradient: at most 64 output channels
constexpr int kMaxWeightMTiles = 2;                // weight gradient: 32 or 64 output channels
constexpr int kMaxWeightNTiles = 16;               // weight gradient: patch columns a warp, in tiles of 8

// c += a · b, m16n8k8, TF32 operands (f32 bits, the low 13 mantissa bits ignored).
// Fragments (PTX ISA "mma.m16n8k8", .tf32), g = lane / 4, t = lane % 4:
//   A 16 x 8: a0 (g, t), a1 (g + 8, t), a2 (g, t + 4), a3 (g + 8, t + 4)
//   B 8 x 8:  b0 (k = t, n = g), b1 (k = t + 4, n = g)
//   C 16 x 8: c0 (g, 2t), c1 (g, 2t + 1), c2 (g + 8, 2t), c3 (g + 8, 2t + 1)
__device__ __forceinline__ void mma_tf32(float (&c)[4], const float (&a)[4], float b0, float b1) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(__float_as_uint(a[0])), "r"(__float_as_uint(a[1])), "r"(__float_as_uint(a[2])),
        "r"(__float_as_uint(a[3])), "r"(__float_as_uint(b0)), "r"(__float_as_uint(b1)));
}

// Loads the A fragment at rows row, row + 8 and columns col, col + 4 of a
// row-major shared matrix of row stride `stride` (≡ 4 mod 8 floats: the 32
// lanes hit 32 banks).
__device__ __forceinline__ void load_a(float (&a)[4], const float* m, int stride, int row, int col) {
  const float* p = m + row * stride + col;
  a[0] = p[0], a[1] = p[8 * stride], a[2] = p[4], a[3] = p[8 * stride + 4];
}

// The zero-padded planes of one image: tile[c][u][v] = in[c][u - pad_h][v -
// pad_w] (zero outside the input), u < tile_h, v < tile_w.
struct TileGeometry {
  int channels = 0, in_h = 0, in_w = 0, pad_h = 0, pad_w = 0, tile_w = 0, plane = 0;  // plane = tile_h · tile_w
  FastDiv div_plane, div_tile_w;
};

// Issues the asynchronous copies of one image's planes into the tile (zeros
// stored directly); they land at this thread's cp_async_wait_all. Loads
// through registers, eight in flight a thread, made staging most of each
// pass's time (H200, the CNN's second convolution: the forward 51 us, each
// batch of eight a round trip to memory).
__device__ __forceinline__ void copy_tile_async(const float* __restrict__ in, float* tile, const TileGeometry& t) {
  for (int e = static_cast<int>(threadIdx.x); e < t.channels * t.plane; e += static_cast<int>(blockDim.x)) {
    const int c = static_cast<int>(t.div_plane.div(static_cast<std::uint32_t>(e))), uv = e - c * t.plane;
    const int u = static_cast<int>(t.div_tile_w.div(static_cast<std::uint32_t>(uv)));
    const int ih = u - t.pad_h, iw = uv - u * t.tile_w - t.pad_w;
    if (ih >= 0 && ih < t.in_h && iw >= 0 && iw < t.in_w) cp_async4(tile + e, in + (c * t.in_h + ih) * t.in_w + iw, 4);
    else tile[e] = 0.0f;
  }
}

// coff[q] for q = (c, i, j) of a kh x kw patch: c·plane + i·tile_w + j.
__device__ __forceinline__ int patch_offset(int q, int taps, int kw, const TileGeometry& t) {
  const int c = q / taps, r = q - c * taps, i = r / kw;
  return c * t.plane + i * t.tile_w + (r - i * kw);
}

// ---- forward and input gradient ----
// The input channels go through shared memory in `phases` equal parts where
// all at once would not leave room for two blocks an SM (the CNN's input
// gradient: 64 dy planes and the whole weight, 144 KB, one block an SM and
// two waves). A phase's A sits there as the weight's own rows: forward
// W[o, q] for the phase's columns q, in rows of a_row_stride (padded, ≡ 4 mod
// 8: conflict-free fragments); input gradient W[o, c, r] for the phase's o as
// it is in memory, row c at c·taps and column (o, r) at aoff = o·C·taps +
// taps - 1 - r. Either way 16-byte copies, A's column offsets aoff[q] in a
// table.
struct PlanesGeometry {
  TileGeometry tile;      // a phase's input planes: x (forward) or dy (input gradient)
  int m = 0;              // output channels of the pass: O (forward) or C (input gradient)
  int k = 0;              // patch length: input channels · taps
  int phases = 1;         // the input channels in equal parts
  int phase_k = 0;        // a phase's patch length, a multiple of 8
  int a_row_stride = 0;   // forward: phase_k rounded to ≡ 4 mod 8; input gradient: taps
  int a_floats = 0;       // a phase's A in shared floats: m · a_row_stride, or m · phase_k
  int taps = 0, kw = 0;   // kh · kw, kw
  int out_w = 0, positions = 0, position_tiles = 0;
  bool input_grad = false;
  bool vector = true;     // the weight 16-byte aligned: copied 4 floats a load
  FastDiv div_phase_k, div_out_w;
};

std::size_t planes_smem(const PlanesGeometry& g) {
  return static_cast<std::size_t>(g.a_floats + g.tile.channels * g.tile.plane + 2 * g.phase_k) * 4;
}

template <int MT, int NT>
__global__ void __launch_bounds__(kPlaneWarps * 32) planes_kernel(const float* __restrict__ in,
                                                                  const float* __restrict__ weight,
                                                                  float* __restrict__ out, PlanesGeometry g) {
  ::qgrad::cuda::wait_for_prior_kernels();
  extern __shared__ float4 smem4[];
  float* a_s = reinterpret_cast<float*>(smem4);  // a phase's A (layout above)
  float* tile = a_s + g.a_floats;                // [channels, plane]: a phase's padded planes of the image
  int* coff = reinterpret_cast<int*>(tile + g.tile.channels * g.tile.plane);  // [phase_k]: B's row offsets
  int* aoff = coff + g.phase_k;                                                 // [phase_k]: A's column offsets
  const int n = static_cast<int>(blockIdx.x), threads = kPlaneWarps * 32;
  for (int q = static_cast<int>(threadIdx.x); q < g.phase_k; q += threads) {
    coff[q] = patch_offset(q, g.taps, g.kw, g.tile);
    const int o = q / g.taps;
    aoff[q] = g.input_grad ? o * g.m * g.taps + g.taps - 1 - (q - o * g.taps) : q;
  }
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int gq = lane >> 2, tq = lane & 3;
  // Position tiles warp, warp + kPlaneWarps, ...: this lane's B column (position) in each.
  int poff[NT];
  QGRAD_UNROLL
  for (int j = 0; j < NT; ++j) {
    const int p = (warp + j * kPlaneWarps) * 8 + gq;
    const int a = static_cast<int>(g.div_out_w.div(static_cast<std::uint32_t>(p)));
    poff[j] = p < g.positions ? a * g.tile.tile_w + (p - a * g.out_w) : 0;
  }
  float acc[MT][NT][4] = {};
  const float* a_lane = a_s + gq * g.a_row_stride;
  const int a_tile = 16 * g.a_row_stride, a_half = 8 * g.a_row_stride;
  const int phase_floats = g.m * g.phase_k;
  for (int h = 0; h < g.phases; ++h) {
    if (h > 0) __syncthreads();  // the previous phase's reads are done
    // Forward: element e of the phase's columns is W[row, h · phase_k + e %
    // phase_k], row e / phase_k (phase_k a multiple of 8: a 4-float copy stays
    // in its row); input gradient: the phase's rows of W as they are.
    const auto a_from = [&](int e, int& at) {
      if (g.input_grad) {
        at = e;
        return h * phase_floats + e;
      }
      const int row = static_cast<int>(g.div_phase_k.div(static_cast<std::uint32_t>(e))), q = e - row * g.phase_k;
      at = row * g.a_row_stride + q;
      return row * g.k + h * g.phase_k + q;
    };
    if (g.vector) {
      for (int e = 4 * static_cast<int>(threadIdx.x); e < phase_floats; e += 4 * threads) {
        int at = 0;
        const int from = a_from(e, at);
        cp_async16(a_s + at, weight + from, 16);
      }
    } else {
      for (int e = static_cast<int>(threadIdx.x); e < phase_floats; e += threads) {
        int at = 0;
        const int from = a_from(e, at);
        cp_async4(a_s + at, weight + from, 4);
      }
    }
    const std::int64_t first_plane = static_cast<std::int64_t>(n) * g.tile.channels * g.phases +
                                     static_cast<std::int64_t>(h) * g.tile.channels;
    copy_tile_async(in + first_plane * g.tile.in_h * g.tile.in_w, tile, g.tile);
    cp_async_wait_all();
    __syncthreads();
#pragma unroll 2
    for (int q0 = tq; q0 < g.phase_k; q0 += 8) {
      const int c0 = coff[q0], c1 = coff[q0 + 4], a0 = aoff[q0], a1 = aoff[q0 + 4];
      float a[MT][4];
      QGRAD_UNROLL
      for (int mt = 0; mt < MT; ++mt) {
        const float* r = a_lane + mt * a_tile;
        a[mt][0] = r[a0], a[mt][1] = r[a_half + a0], a[mt][2] = r[a1], a[mt][3] = r[a_half + a1];
      }
      // Every tile, past the positions too (poff 0: their sums are never
      // stored): no branch between the loads and the products, so all of a
      // step's loads are issued before its first product (a test per tile
      // made each tile's loads wait for the previous tile's products).
      float b[NT][2];
      QGRAD_UNROLL
      for (int j = 0; j < NT; ++j) b[j][0] = tile[c0 + poff[j]], b[j][1] = tile[c1 + poff[j]];
      QGRAD_UNROLL
      for (int j = 0; j < NT; ++j) {
        QGRAD_UNROLL
        for (int mt = 0; mt < MT; ++mt) mma_tf32(acc[mt][j], a[mt], b[j][0], b[j][1]);
      }
    }
  }
  float* on = out + static_cast<std::int64_t>(n) * g.m * g.positions;
  QGRAD_UNROLL
  for (int j = 0; j < NT; ++j) {
    const int p = (warp + j * kPlaneWarps) * 8 + 2 * tq;
    QGRAD_UNROLL
    for (int mt = 0; mt < MT; ++mt) {
      float* row = on + (mt * 16 + gq) * g.positions + p;
      const float* c = acc[mt][j];
      if (p < g.positions) row[0] = c[0], row[8 * g.positions] = c[2];
      if (p + 1 < g.positions) row[1] = c[1], row[8 * g.positions + 1] = c[3];
    }
  }
}

// A's row stride: at least k, ≡ 4 mod 8 (conflict-free fragment loads).
int fragment_stride(int k) { return (k + 3) / 8 * 8 + 4; }

TileGeometry tile_geometry(int channels, int in_h, int in_w, int pad_h, int pad_w, int tile_h, int tile_w) {
  TileGeometry t;
  t.channels = channels, t.in_h = in_h, t.in_w = in_w, t.pad_h = pad_h, t.pad_w = pad_w, t.tile_w = tile_w;
  t.plane = tile_h * tile_w;
  t.div_plane = FastDiv(static_cast<std::uint32_t>(t.plane));
  t.div_tile_w = FastDiv(static_cast<std::uint32_t>(tile_w));
  return t;
}

// forward: in = x [n, C, H, W], out = y [n, O, OH, OW]; input gradient: in =
// dy [n, O, OH, OW], out = dx [n, C, H, W]. Output planes of OH x OW (resp.
// H x W); the tile covers them plus kh - 1 rows and kw - 1 columns.
// Two blocks an SM where a block's shared memory stays within this.
constexpr std::size_t kTwoBlocksSmem = 112 * 1024;

PlanesGeometry planes_geometry(const Conv2dShape& s, bool input_grad) {
  PlanesGeometry g;
  const int kh = static_cast<int>(s.kh), kw = static_cast<int>(s.kw);
  const int out_h = static_cast<int>(input_grad ? s.h : s.oh), out_w = static_cast<int>(input_grad ? s.w : s.ow);
  const int in_c = static_cast<int>(input_grad ? s.o : s.c);
  const int in_h = static_cast<int>(input_grad ? s.oh : s.h), in_w = static_cast<int>(input_grad ? s.ow : s.w);
  const int pad_h = static_cast<int>(input_grad ? s.kh - 1 - s.ph : s.ph);
  const int pad_w = static_cast<int>(input_grad ? s.kw - 1 - s.pw : s.pw);
  g.m = static_cast<int>(input_grad ? s.c : s.o);
  g.taps = kh * kw, g.kw = kw;
  g.k = in_c * g.taps;
  g.out_w = out_w, g.positions = out_h * out_w, g.position_tiles = (g.positions + 7) / 8;
  g.input_grad = input_grad;
  g.div_out_w = FastDiv(static_cast<std::uint32_t>(out_w));
  // The fewest phases (1, 2 or 4, their patch lengths multiples of 8) that
  // leave room for two blocks an SM; failing that the most.
  for (int phases : {1, 2, 4}) {
    if (in_c % phases != 0 || in_c / phases * g.taps % 8 != 0) continue;
    g.phases = phases;
    g.phase_k = in_c / phases * g.taps;
    g.tile = tile_geometry(in_c / phases, in_h, in_w, pad_h, pad_w, out_h + kh - 1, out_w + kw - 1);
    g.a_row_stride = input_grad ? g.taps : fragment_stride(g.phase_k);
    g.a_floats = input_grad ? g.m * g.phase_k : g.m * g.a_row_stride;
    if (planes_smem(g) <= kTwoBlocksSmem) break;
  }
  g.div_phase_k = FastDiv(static_cast<std::uint32_t>(std::max(1, g.phase_k)));
  return g;
}

bool planes_fit(const PlanesGeometry& g) {
  return g.m % 16 == 0 && g.m / 16 <= kMaxPlaneMTiles && g.phase_k > 0 && g.phase_k % 8 == 0 &&
         g.positions <= kMaxPositions && planes_smem(g) <= kSmemLimit;
}

void run_planes(const Conv2dShape& s, bool input_grad, const Tensor& in, const Tensor& weight, const Tensor& out) {
  PlanesGeometry g = planes_geometry(s, input_grad);
  g.vector = reinterpret_cast<std::uintptr_t>(weight.data_ptr()) % 16 == 0;
  const int dev = out.device().index;
  const auto launch = [&](auto mt, auto nt) {
    constexpr auto kernel = planes_kernel<decltype(mt)::value, decltype(nt)::value>;
    const std::size_t smem = planes_smem(g);
    allow_dynamic_smem<kernel>(dev, static_cast<int>(smem));
    ::qgrad::cuda::launch_kernel(dev, kernel, dim3(static_cast<unsigned>(s.n)), dim3(kPlaneWarps * 32), smem,
                                 static_cast<const float*>(in.data_ptr()), static_cast<const float*>(weight.data_ptr()),
                                 static_cast<float*>(out.data_ptr()), g);
  };
  // Position tiles a warp: at most kMaxPositions / 8 / kPlaneWarps.
  constexpr std::integral_constant<int, kMaxPositions / 8 / kPlaneWarps> nt;
  switch (g.m / 16) {
    case 1: return launch(std::integral_constant<int, 1>{}, nt);
    case 2: return launch(std::integral_constant<int, 2>{}, nt);
    case 3: return launch(std::integral_constant<int, 3>{}, nt);
    default: return launch(std::integral_constant<int, 4>{}, nt);
  }
}

// ---- weight gradient ----
struct WeightGeometry {
  TileGeometry tile;   // x's padded planes
  int o = 0;           // output channels (the rows: 32 or 64)
  int q = 0;           // patch length C · taps (the columns), a multiple of 8
  int taps = 0, kw = 0;
  int out_w = 0, positions = 0, positions8 = 0;  // OH · OW, rounded up to 8
  int dy_stride = 0;   // dy's row stride in shared memory, ≡ 4 mod 8
  int images = 0, images_per_block = 1;
  bool vector = true;  // positions a multiple of 4 and dy 16-byte aligned: 4 floats a copy
  FastDiv div_positions, div_quads;
};

std::size_t weight_smem(const WeightGeometry& g) {
  return static_cast<std::size_t>(g.o * g.dy_stride + g.tile.channels * g.tile.plane + g.positions8) * 4;
}

// Block b: the partial dW of images [b · ipb, (b + 1) · ipb), in
// partial[b][o][q]; dW = the partials summed over blocks in order.
template <int MT, int NT>
__global__ void __launch_bounds__(kWeightWarps * 32) weight_kernel(const float* __restrict__ x,
                                                                   const float* __restrict__ dy,
                                                                   float* __restrict__ partial, WeightGeometry g) {
  ::qgrad::cuda::wait_for_prior_kernels();
  extern __shared__ float4 smem4[];
  float* dy_s = reinterpret_cast<float*>(smem4);  // [o, dy_stride]: dy[n], zero past the positions
  float* tile = dy_s + g.o * g.dy_stride;         // [C, plane]: x[n], padded
  int* poff = reinterpret_cast<int*>(tile + g.tile.channels * g.tile.plane);  // [positions8]
  for (int p = static_cast<int>(threadIdx.x); p < g.positions8; p += kWeightWarps * 32) {
    const int a = p / g.out_w;
    poff[p] = p < g.positions ? a * g.tile.tile_w + (p - a * g.out_w) : 0;
  }
  // dy's columns past the positions: zero for every image (the copies leave them).
  const int pad_columns = g.positions8 - g.positions;
  for (int e = static_cast<int>(threadIdx.x); e < g.o * pad_columns; e += kWeightWarps * 32)
    dy_s[e / pad_columns * g.dy_stride + g.positions + e % pad_columns] = 0.0f;
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int gq = lane >> 2, tq = lane & 3;
  const int wm = warp >> 2, wn = warp & 3;  // rows [wm · 16 · MT, ...), column tiles wn, wn + 4, ...
  const int column_tiles = g.q / 8;
  int coff[NT];
  QGRAD_UNROLL
  for (int j = 0; j < NT; ++j) {
    const int q = (wn + 4 * j) * 8 + gq;
    coff[j] = q < g.q ? patch_offset(q, g.taps, g.kw, g.tile) : 0;
  }
  float acc[MT][NT][4] = {};
  const int first = static_cast<int>(blockIdx.x) * g.images_per_block;
  const int last = min(g.images, first + g.images_per_block);
  const std::int64_t x_image = static_cast<std::int64_t>(g.tile.channels) * g.tile.in_h * g.tile.in_w;
  const std::int64_t dy_image = static_cast<std::int64_t>(g.o) * g.positions;
  for (int n = first; n < last; ++n) {
    __syncthreads();  // the previous image's reads are done
    const float* dyn = dy + n * dy_image;
    if (g.vector) {  // rows of a multiple of 4 positions, 16-byte aligned
      const int quads = g.positions / 4;
      for (int e = static_cast<int>(threadIdx.x); e < g.o * quads; e += kWeightWarps * 32) {
        const int o = static_cast<int>(g.div_quads.div(static_cast<std::uint32_t>(e))), p = 4 * (e - o * quads);
        cp_async16(dy_s + o * g.dy_stride + p, dyn + o * g.positions + p, 16);
      }
    } else {
      for (int e = static_cast<int>(threadIdx.x); e < g.o * g.positions; e += kWeightWarps * 32) {
        const int o = static_cast<int>(g.div_positions.div(static_cast<std::uint32_t>(e))), p = e - o * g.positions;
        cp_async4(dy_s + o * g.dy_stride + p, dyn + e, 4);
      }
    }
    copy_tile_async(x + n * x_image, tile, g.tile);
    cp_async_wait_all();
    __syncthreads();
    // Steps of 8 positions; the last, partial one selects zero for B past the
    // positions (A is zero there too). Every column tile, past the patch too
    // (coff 0, never stored): no branch between a step's loads and products.
    const auto k_step = [&](int p0, auto tail) {
      const int pa = poff[p0], pb = poff[p0 + 4];
      float a[MT][4];
      QGRAD_UNROLL
      for (int mt = 0; mt < MT; ++mt) load_a(a[mt], dy_s, g.dy_stride, (wm * MT + mt) * 16 + gq, p0);
      float b[NT][2];
      QGRAD_UNROLL
      for (int j = 0; j < NT; ++j) {
        if constexpr (decltype(tail)::value) {
          b[j][0] = p0 < g.positions ? tile[coff[j] + pa] : 0.0f;
          b[j][1] = p0 + 4 < g.positions ? tile[coff[j] + pb] : 0.0f;
        } else {
          b[j][0] = tile[coff[j] + pa], b[j][1] = tile[coff[j] + pb];
        }
      }
      QGRAD_UNROLL
      for (int j = 0; j < NT; ++j) {
        QGRAD_UNROLL
        for (int mt = 0; mt < MT; ++mt) mma_tf32(acc[mt][j], a[mt], b[j][0], b[j][1]);
      }
    };
    const int whole = g.positions / 8 * 8;
#pragma unroll 2
    for (int p0 = tq; p0 < whole; p0 += 8) k_step(p0, std::false_type{});
    if (whole < g.positions8) k_step(whole + tq, std::true_type{});
  }
  float* pb = partial + static_cast<std::int64_t>(blockIdx.x) * g.o * g.q;
  QGRAD_UNROLL
  for (int j = 0; j < NT; ++j) {
    if (wn + 4 * j >= column_tiles) continue;
    const int q = (wn + 4 * j) * 8 + 2 * tq;
    QGRAD_UNROLL
    for (int mt = 0; mt < MT; ++mt) {
      float* row = pb + ((wm * MT + mt) * 16 + gq) * g.q + q;
      const float* c = acc[mt][j];
      row[0] = c[0], row[1] = c[1], row[8 * g.q] = c[2], row[8 * g.q + 1] = c[3];
    }
  }
}

// dweight[e] = the blocks' partials of e summed in a fixed order: slice s of
// kSumSlices sums blocks [s · B / kSumSlices, (s + 1) · B / kSumSlices) in
// order, then the slices' sums in order. A block: 32 elements x kSumSlices
// slices (one thread summing all 256 partials of the CNN's step in order was
// 32 round trips to memory in a row).
constexpr int kSumSlices = 8;
__global__ void weight_sum_kernel(const float* __restrict__ partial, float* __restrict__ dweight, int elements,
                                  int blocks) {
  ::qgrad::cuda::wait_for_prior_kernels();
  __shared__ float slice_sum[kSumSlices][32];
  const int e = static_cast<int>(blockIdx.x) * 32 + static_cast<int>(threadIdx.x);
  const int s = static_cast<int>(threadIdx.y);
  const int first = s * blocks / kSumSlices, last = (s + 1) * blocks / kSumSlices;
  slice_sum[s][threadIdx.x] = e < elements ? sum_strided(partial + static_cast<std::int64_t>(first) * elements + e,
                                                         last - first, elements)
                                           : 0.0f;
  __syncthreads();
  if (s != 0 || e >= elements) return;
  float total = slice_sum[0][threadIdx.x];
  QGRAD_UNROLL
  for (int k = 1; k < kSumSlices; ++k) total += slice_sum[k][threadIdx.x];
  dweight[e] = total;
}

WeightGeometry weight_geometry(const Conv2dShape& s) {
  WeightGeometry g;
  const int kh = static_cast<int>(s.kh), kw = static_cast<int>(s.kw);
  const int oh = static_cast<int>(s.oh), ow = static_cast<int>(s.ow);
  g.tile = tile_geometry(static_cast<int>(s.c), static_cast<int>(s.h), static_cast<int>(s.w), static_cast<int>(s.ph),
                         static_cast<int>(s.pw), oh + kh - 1, ow + kw - 1);
  g.o = static_cast<int>(s.o);
  g.taps = kh * kw, g.kw = kw;
  g.q = static_cast<int>(s.c) * g.taps;
  g.out_w = ow, g.positions = oh * ow, g.positions8 = (g.positions + 7) / 8 * 8;
  g.dy_stride = fragment_stride(g.positions8);
  g.images = static_cast<int>(s.n);
  g.div_positions = FastDiv(static_cast<std::uint32_t>(g.positions));
  g.div_quads = FastDiv(static_cast<std::uint32_t>(std::max(1, g.positions / 4)));
  return g;
}

int weight_column_tiles_a_warp(const WeightGeometry& g) { return (g.q / 8 + 3) / 4; }

bool weight_fits(const WeightGeometry& g) {
  const int mt = g.o / (16 * (kWeightWarps / 4));
  return g.o % 32 == 0 && mt <= kMaxWeightMTiles && g.q % 8 == 0 &&
         weight_column_tiles_a_warp(g) <= kMaxWeightNTiles && g.positions <= kMaxPositions &&
         weight_smem(g) <= kSmemLimit;
}

// Images a block: enough blocks for every SM to hold blocks_per_sm of them
// (by shared memory, at most 2), each image's partial summed over fewer
// blocks where the batch is larger.
int weight_images_per_block(const WeightGeometry& g, int device) {
  const int by_smem = static_cast<int>(227 * 1024 / (weight_smem(g) + 1024));
  const int resident = ::qgrad::cuda::multiprocessor_count(device) * std::clamp(by_smem, 1, 2);
  return std::max(1, (g.images + resident - 1) / resident);
}

void run_weight(const Conv2dShape& s, const Tensor& x, const Tensor& dy, const Tensor& dweight, int images_per_block) {
  WeightGeometry g = weight_geometry(s);
  const int dev = dweight.device().index;
  g.images_per_block = images_per_block > 0 ? images_per_block : weight_images_per_block(g, dev);
  g.vector = g.positions % 4 == 0 && reinterpret_cast<std::uintptr_t>(dy.data_ptr()) % 16 == 0;
  const int blocks = (g.images + g.images_per_block - 1) / g.images_per_block;
  const int elements = g.o * g.q;
  float* partial =
      static_cast<float*>(memory::allocate(static_cast<std::size_t>(blocks) * elements * 4, dweight.device()));
  const auto launch = [&](auto mt, auto nt) {
    constexpr auto kernel = weight_kernel<decltype(mt)::value, decltype(nt)::value>;
    const std::size_t smem = weight_smem(g);
    allow_dynamic_smem<kernel>(dev, static_cast<int>(smem));
    ::qgrad::cuda::launch_kernel(dev, kernel, dim3(static_cast<unsigned>(blocks)), dim3(kWeightWarps * 32), smem,
                                 static_cast<const float*>(x.data_ptr()), static_cast<const float*>(dy.data_ptr()),
                                 partial, g);
  };
  const auto with_nt = [&](auto mt) {
    const int nt = weight_column_tiles_a_warp(g);
    if (nt <= 4) return launch(mt, std::integral_constant<int, 4>{});
    if (nt <= 9) return launch(mt, std::integral_constant<int, 9>{});
    return launch(mt, std::integral_constant<int, kMaxWeightNTiles>{});
  };
  if (g.o == 32) with_nt(std::integral_constant<int, 1>{});
  else with_nt(std::integral_constant<int, 2>{});
  ::qgrad::cuda::launch_kernel(dev, weight_sum_kernel, dim3(static_cast<unsigned>((elements + 31) / 32)),
                               dim3(32, kSumSlices), 0,
                               static_cast<const float*>(partial), static_cast<float*>(dweight.data_ptr()), elements,
                               blocks);
  // The next user of the block is queued after these kernels on the same stream.
  memory::release(partial, dweight.device());
}


bool tensor_core_applies(const Conv2dShape& s) {
  if (s.groups != 1 || s.n < 1 || s.sh != 1 || s.sw != 1 || s.dh != 1 || s.dw != 1 || s.ph > s.kh - 1 ||
      s.pw > s.kw - 1 || s.n > 65535)
    return false;
  return planes_fit(planes_geometry(s, false)) && planes_fit(planes_geometry(s, true)) &&
         weight_fits(weight_geometry(s));
}

std::vector<float> host(const Tensor& t) { return t.cpu().to_vector<float>(); }

// max |a - b| / max(1, max |b|), and whether a and b are the same bits.
struct Diff {
  double rel = 0;
  bool same = true;
};
Diff compare(const Tensor& a, const Tensor& b) {
  const std::vector<float> va = host(a), vb = host(b);
  Diff d;
  double scale = 1;
  for (float v : vb) scale = std::max(scale, double(std::fabs(v)));
  bool nan = false;  // poison left or a wrong product (std::max would skip a NaN difference)
  for (std::size_t i = 0; i < va.size(); ++i) {
    const double diff = std::fabs(double(va[i]) - double(vb[i])) / scale;
    if (diff != diff) nan = true;
    else d.rel = std::max(d.rel, diff);
    if (std::memcmp(&va[i], &vb[i], 4) != 0) d.same = false;
  }
  if (nan) d.rel = 1e30;
  return d;
}

}  // namespace

int main(int argc, char** argv) {
  if (cuda_device_count() == 0) {
    std::printf("dev_conv_tensor_core: no CUDA device\n");
    return 0;
  }
  std::int64_t a[8] = {256, 32, 14, 14, 64, 3, 1, 0};
  for (int i = 1; i < argc && i <= 8; ++i) a[i - 1] = std::atoll(argv[i]);
  Conv2dShape s;
  s.n = a[0], s.c = a[1], s.h = a[2], s.w = a[3], s.o = a[4], s.kh = s.kw = a[5], s.ph = s.pw = a[6];
  s.oh = s.h + 2 * s.ph - s.kh + 1, s.ow = s.w + 2 * s.pw - s.kw + 1;
  const int images_per_block = static_cast<int>(a[7]);
  if (!tensor_core_applies(s)) {
    std::printf("dev_conv_tensor_core: the tensor-core passes do not take this shape\n");
    return 1;
  }
  Generator g(7);
  const TensorOptions f32 = TensorOptions{}.with_dtype(DType::f32).with_device(Device::cuda());
  Tensor x = randn({s.n, s.c, s.h, s.w}, g, f32), w = randn({s.o, s.c, s.kh, s.kw}, g, f32, 0.0, 0.1);
  Tensor dy = randn({s.n, s.o, s.oh, s.ow}, g, f32);
  Tensor y = Tensor::empty(dy.shape(), f32), dx = Tensor::empty(x.shape(), f32), dw = Tensor::empty(w.shape(), f32);
  const auto tc_forward = [&] { run_planes(s, false, x, w, y); };
  const auto tc_input = [&] { run_planes(s, true, dy, w, dx); };
  const auto tc_weight = [&] { run_weight(s, x, dy, dw, images_per_block); };

  // Check: against f32 cuDNN (FMA math), over NaN-poisoned outputs, twice.
  Conv2dShape exact = s;
  exact.allow_tf32 = false;
  Tensor y_ref = empty_like(y), dx_ref = empty_like(dx), dw_ref = empty_like(dw);
  kernels::conv2d_forward(exact, x, w, y_ref);
  kernels::conv2d_backward_input(exact, dy, w, dx_ref);
  kernels::conv2d_backward_weight(exact, x, dy, dw_ref);
  bool ok = true;
  const Tensor* outs[] = {&y, &dx, &dw};
  const Tensor* refs[] = {&y_ref, &dx_ref, &dw_ref};
  const char* names[] = {"forward", "input_grad", "weight_grad"};
  std::vector<Tensor> first;
  for (int run = 0; run < 2; ++run) {
    for (const Tensor* t : outs) const_cast<Tensor*>(t)->copy_(full(t->shape(), NAN, f32));
    tc_forward(), tc_input(), tc_weight();
    for (int i = 0; i < 3; ++i) {
      if (run == 0) {
        first.push_back(outs[i]->clone());
        const Diff d = compare(*outs[i], *refs[i]);
        std::printf("{\"check\":\"%s\",\"rel_to_fma_cudnn\":%.3g}\n", names[i], d.rel);
        ok = ok && d.rel <= 4e-3;  // TF32: 10 mantissa bits, sums of 144-50176 terms
      } else {
        const bool same = compare(*outs[i], first[static_cast<std::size_t>(i)]).same;
        std::printf("{\"check\":\"%s\",\"same_bits_twice\":%s}\n", names[i], same ? "true" : "false");
        ok = ok && same;
      }
    }
  }
  if (!ok) {
    std::printf("dev_conv_tensor_core: check FAILED\n");
    return 1;
  }

  // Times, captured: the tensor-core passes; the library's staged passes
  // with their copies; the library's NCHW TF32 cuDNN passes.
  Conv2dShape tf32 = s;
  tf32.allow_tf32 = true;
  Tensor x_cl = Tensor::empty({s.n, s.h, s.w, s.c}, f32), w_cl = Tensor::empty({s.o, s.kh, s.kw, s.c}, f32);
  Tensor dy_cl = Tensor::empty({s.n, s.oh, s.ow, s.o}, f32);
  const bool staged = kernels::conv2d_stages_channels_last(tf32, DType::f32, Device::cuda());
  struct Row {
    const char* impl;
    double fwd, dx, dw;
  };
  std::vector<Row> rows;
  rows.push_back({"tensor_core", captured_us(tc_forward), captured_us(tc_input), captured_us(tc_weight)});
  if (staged) {
    kernels::to_channels_last(x, x_cl), kernels::to_channels_last(w, w_cl), kernels::to_channels_last(dy, dy_cl);
    rows.push_back({"library_staged",
                    captured_us([&] {
                      kernels::to_channels_last(x, x_cl);
                      kernels::to_channels_last(w, w_cl);
                      kernels::conv2d_forward_channels_last(tf32, x_cl, w_cl, y);
                    }),
                    captured_us([&] {
                      kernels::to_channels_last(dy, dy_cl);
                      kernels::conv2d_backward_input_channels_last(tf32, dy_cl, w_cl, dx);
                    }),
                    captured_us([&] { kernels::conv2d_backward_weight_channels_last(tf32, x_cl, dy_cl, dw); })});
  }
  rows.push_back({"library_nchw_cudnn", captured_us([&] { kernels::conv2d_forward(tf32, x, w, y); }),
                  captured_us([&] { kernels::conv2d_backward_input(tf32, dy, w, dx); }),
                  captured_us([&] { kernels::conv2d_backward_weight(tf32, x, dy, dw); })});
  for (const Row& r : rows)
    std::printf("{\"bench\":\"conv_tensor_core\",\"shape\":\"%lldx%lldx%lldx%lld_o%lld_k%lld\",\"impl\":\"%s\","
                "\"fwd_us\":%.1f,\"dx_us\":%.1f,\"dw_us\":%.1f,\"sum_us\":%.1f}\n",
                static_cast<long long>(s.n), static_cast<long long>(s.c), static_cast<long long>(s.h),
                static_cast<long long>(s.w), static_cast<long long>(s.o), static_cast<long long>(s.kh), r.impl, r.fwd,
                r.dx, r.dw, r.fwd + r.dx + r.dw);
  return 0;
}
