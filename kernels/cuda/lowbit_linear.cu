// CUDA kernels of the int4 linear layers (kernels/lowbit_linear.h).
//
// W4A16, decode sizes (8 < M <= kW4A16GemvMaxM, bf16/f16 x): a tensor-core GEMV
// fed by bulk copies. A block of 9 warps owns 32 output channels and 8 NC
// rows of x (NC = 2, 4, 8 for M up to 16, 32, 64) over the whole of K.
// Its producer warp streams the block's 32 packed weight rows through a ring
// of 4 shared-memory stages of 1024 columns (cp.async.bulk, one row per lane,
// completing on an mbarrier; a slot is refilled once the 8 consumer warps
// have read it), so at K = 4096 the whole 64 KiB slab is requested at the
// kernel's start. Consumer warp w takes columns [128 w, 128 w + 128) of each
// stage: lane (g = lane / 4, t = lane % 4) reads 16 bytes = 32 packed weights
// at k0 = 128 w + 32 t of channels g, g + 8, g + 16, g + 24 of the tile (rows
// padded by 64 bytes: no bank conflicts), dequantizes them
// (formulas::w4a16_weight: T((q - zp) * s); per value one LOP3 that puts the
// nibble into the mantissa of a power of two, one FADD, one FMUL, half a
// pack; no int-to-float conversions) and feeds mma.sync.m16n8k16 (bf16/f16
// in, f32 accumulate) with the weight as A (16 channels) and x as B (8 rows),
// so M <= 8 runs one mma per 16 channels and k-step and a lane's B fragment
// is one 8-byte load of its row (x and the scales of the next stage are
// loaded while this one is awaited). The mma's k index is permuted the same
// way in A and B, which a dot product allows. Every weight byte is read once
// per 64 rows of x: at M = 1 the packed weight (N K / 2 bytes) once, 4x fewer
// bytes than a bf16 GEMM. Each warp accumulates its columns in stage order;
// the 8 warps' partial tiles are added in warp order in shared memory
// (deterministic).
// With scales of x's dtype T (not f32) the dequantization is packed T x 2
// arithmetic (dequant_word: per value half a LOP3, half a subtract, half a
// multiply, plus the shifts: the same bits, since (q - zp) * s is exact in f32
// for a T scale), in the kernel above and in the split-K GEMV.
// M <= 8, f32 or T scales: a split-K GEMV without a producer
// (w4a16_splitk_kernel: a block per 16 channels, 8 warps splitting K, each
// issuing its 16-byte weight loads of 4 iterations at once, two blocks per
// SM), with the same per-value math. For groups of 128 or more each block
// first asks L2 for its 16 weight rows (one bulk prefetch) before it waits for
// the kernel before it: in a chain of layers under programmatic dependent
// launch the weight starts to stream during the previous layer's tail (H200,
// M = 1, N = K = 4096, bf16 scales: a layer of a captured 24-layer chain 6.1 ->
// 5.6 us, back to back 6.3 -> 6.0; with groups of 32 it measured 6.1 -> 6.4,
// so smaller groups do without; forty-fifth session).
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

// ---------------------------------------------------------------- W4A16 mma

__device__ __forceinline__ std::uint32_t word_of(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// ------------------------------------------------------ W4A16 bulk-copy GEMV

// Decode sizes (M <= kW4A16GemvMaxM). A block owns NSUB n8 tiles (8 NSUB
// output channels) and MC chunks of 16 rows of x over the whole of K: one
// producer warp streams the block's packed weight rows through kGemvSlots
// shared-memory stages with bulk copies (cp.async.bulk, one row of one stage
// per lane, completing on an mbarrier), and kGemvWarps consumer warps split
// each stage by 128-column iterations.
constexpr int kGemvWarps = 8;                        // consumer warps
constexpr int kGemvThreads = (kGemvWarps + 1) * 32;  // + the producer warp
constexpr int kGemvSlots = 4;                        // shared-memory stages in the ring
constexpr int kStageCols = kGemvWarps * 128;         // columns of K per stage (one iteration per consumer warp)
constexpr int kStageRowBytes = kStageCols / 2;       // packed bytes of one row in one stage
// Row pitch in a stage: a quarter-warp's 16-byte reads cover rows g and g + 1
// at the same 64 columns, which the extra 64 bytes put on disjoint banks.
constexpr int kStagePitch = kStageRowBytes + 64;

// Nibble E (0..4) of word as (u - off) in f32 with one LOP3 and one FADD:
// the bits (2^(23 - 4E) as an f32) | (u << 4E) are the float 2^(23 - 4E) + u
// exactly (u lands in the mantissa's units place), and off = 2^(23 - 4E) + zp
// (8 for s4, whose sign bit the same LOP3 flips: (u ^ 8) - 8 is the value).
// Nibbles 5..7 are nibbles 2..4 of word >> 12. Inline PTX keeps the LOP3
// whole ((word & mask) ^ bits, one instruction; the compiler otherwise splits it).
template <bool kSigned, int E>
__device__ __forceinline__ float nibble_minus(std::uint32_t word, float off) {
  constexpr std::uint32_t kMask = 0xfu << (4 * E);
  constexpr std::uint32_t kBits = ((150u - 4u * E) << 23) | (kSigned ? (0x8u << (4 * E)) : 0u);
  std::uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, 0x6a;" : "=r"(r) : "r"(word), "n"(kMask), "n"(kBits));
  return __uint_as_float(r) - off;
}

// The mma computes out^T: A (16 x 16) is a 16-channel tile of the dequantized
// weight, B (16 x 8) holds 8 rows of x, so M <= 8 wastes no tensor-core rows
// on absent rows of x and a lane's B fragment is one 8-byte load of its row.
// NSUB n8 channel halves = NSUB / 2 m16 tiles; NC chunks of 8 rows of x.
// A lane's operands of one iteration besides the weight: x's B fragments
// (row g of each chunk, 4 columns per mma step j) when kX, and the scale and
// zero point of its 32 columns in each channel half.
template <int NC, int NSUB, bool kX>
struct GemvFrag {
  uint2 xb[kX ? NC : 1][8];
  float s[NSUB], z[NSUB];
};

template <class T, int NC>
__device__ __forceinline__ uint2 x_frag(int nc, int j, int k0, bool kin, const T* const (&xr)[NC]) {
  return kin ? __ldg(reinterpret_cast<const uint2*>(xr[nc] + k0 + 4 * j)) : make_uint2(0, 0);
}

template <class T> struct Packed;

template <class T, bool kSigned, int NC, int NSUB, bool kX, class S>
__device__ __forceinline__ void gemv_load(GemvFrag<NC, NSUB, kX>& f, int k0, int K, int G, int groups,
                                          const T* const (&xr)[NC], const int (&nrow)[NSUB],
                                          const S* __restrict__ scale, const std::int32_t* __restrict__ zp) {
  const bool kin = k0 < K;  // K % 32 == 0: a lane's 32 columns are all in or all out
  if constexpr (kX) {
#pragma unroll
    for (int nc = 0; nc < NC; ++nc)
#pragma unroll
      for (int j = 0; j < 8; ++j) f.xb[nc][j] = x_frag<T, NC>(nc, j, k0, kin, xr);
  }
  // Group sizes are powers of two in practice: a shift (G is loop-invariant, so
  // the test and __ffs are hoisted) instead of an integer division per call.
  const int gk = kin ? ((G & (G - 1)) == 0 ? k0 >> (__ffs(G) - 1) : k0 / G) : 0;
#pragma unroll
  for (int sub = 0; sub < NSUB; ++sub) {
    // nrow is clamped into [0, N): a channel past N computes an output nobody writes. An
    // absent column block multiplies by a zero scale and a zero x: its products are zeros.
    const I64 gi = static_cast<I64>(nrow[sub]) * groups + gk;
    if constexpr (std::is_same_v<S, float>) {
      const float s = __ldg(scale + gi);
      f.s[sub] = kin ? s : 0.0f;
      f.z[sub] = kSigned ? 8.0f : static_cast<float>(__ldg(zp + gi));
    } else {  // T scales: the packed pairs (s, s) and (magic + zp) x 2 of gemv_math_packed, as bits
      const std::uint32_t s2 = __ldg(reinterpret_cast<const std::uint16_t*>(scale) + gi) * 0x10001u;
      f.s[sub] = __uint_as_float(kin ? s2 : 0u);
      const std::uint32_t z = kSigned ? 8u : static_cast<std::uint32_t>(__ldg(zp + gi));
      f.z[sub] = __uint_as_float((Packed<T>::kMagic + z) * 0x10001u);
    }
  }
}

template <class T, bool kSigned, int NC, int NSUB, bool kX>
__device__ __forceinline__ void gemv_math(const GemvFrag<NC, NSUB, kX>& f, const uint4 (&wv)[NSUB],
                                          float (&acc)[NC][NSUB / 2][4], int k0, bool kin,
                                          const T* const (&xr)[NC]) {
  float off[NSUB][5];
#pragma unroll
  for (int sub = 0; sub < NSUB; ++sub)
#pragma unroll
    for (int e = 0; e < 5; ++e) off[sub][e] = static_cast<float>(1 << (23 - 4 * e)) + f.z[sub];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    // Step j: physical columns k0 + 4j + {0, 1} are the mma's k {2t, 2t + 1},
    // k0 + 4j + {2, 3} its k {2t + 8, 2t + 9}, in A and in B alike.
    std::uint32_t lo[NSUB], hi[NSUB];
#pragma unroll
    for (int sub = 0; sub < NSUB; ++sub) {
      const std::uint32_t word = word_of(wv[sub], j >> 1);
      const float s = f.s[sub];
      float v0, v1, v2, v3;
      if ((j & 1) == 0) {  // nibbles 0..3
        v0 = nibble_minus<kSigned, 0>(word, off[sub][0]);
        v1 = nibble_minus<kSigned, 1>(word, off[sub][1]);
        v2 = nibble_minus<kSigned, 2>(word, off[sub][2]);
        v3 = nibble_minus<kSigned, 3>(word, off[sub][3]);
      } else {  // nibbles 4..7
        const std::uint32_t w12 = word >> 12;
        v0 = nibble_minus<kSigned, 4>(word, off[sub][4]);
        v1 = nibble_minus<kSigned, 2>(w12, off[sub][2]);
        v2 = nibble_minus<kSigned, 3>(w12, off[sub][3]);
        v3 = nibble_minus<kSigned, 4>(w12, off[sub][4]);
      }
      // formulas::w4a16_weight: the f32 product (u - zp) * s, rounded once to T.
      lo[sub] = Mma<T>::pack(v0 * s, v1 * s);
      hi[sub] = Mma<T>::pack(v2 * s, v3 * s);
    }
#pragma unroll
    for (int nc = 0; nc < NC; ++nc) {
      const uint2 xb = kX ? f.xb[kX ? nc : 0][j] : x_frag<T, NC>(nc, j, k0, kin, xr);
#pragma unroll
      for (int tile = 0; tile < NSUB / 2; ++tile)
        Mma<T>::run(acc[nc][tile], lo[2 * tile], lo[2 * tile + 1], hi[2 * tile], hi[2 * tile + 1], xb.x, xb.y);
    }
  }
}

// Packed T x 2 arithmetic for scales of x's dtype T. With a T scale s,
// (q - zp) * s is exact in f32 (at most 4 + 11 significant bits), so the
// formula's T(f32 product) is the correctly rounded T product, which is what
// one packed T multiply (mul.rn.{bf16x2,f16x2}) returns: the same bits as
// formulas::w4a16_weight at about half the instructions per value of the
// f32 path.
template <> struct Packed<bfloat16> {
  using V = __nv_bfloat162;
  static constexpr std::uint32_t kMagic = 0x4300u;  // 128: the units place is the mantissa's lowest bit
};
template <> struct Packed<half> {
  using V = __half2;
  static constexpr std::uint32_t kMagic = 0x6400u;  // 1024
};
template <class T>
__device__ __forceinline__ std::uint32_t packed_sub_mul(std::uint32_t v, std::uint32_t off, std::uint32_t s) {
  using V = typename Packed<T>::V;
  const V r = __hmul2(__hsub2(*reinterpret_cast<const V*>(&v), *reinterpret_cast<const V*>(&off)),
                      *reinterpret_cast<const V*>(&s));
  return *reinterpret_cast<const std::uint32_t*>(&r);
}

// The 8 values of one packed word (columns c .. c + 7, low nibble first) of
// one channel as 4 T pairs (c, c + 4), (c + 1, c + 5), (c + 2, c + 6),
// (c + 3, c + 7): per pair one LOP3 puts nibbles i and i + 4 into the
// mantissas of two copies of the magic power of two (flipping an s4 sign bit,
// (u ^ 8) - 8 being the value), one packed subtract of (magic + zp) gives
// q - zp exactly, one packed multiply by the scale rounds once.
template <class T, bool kSigned>
__device__ __forceinline__ void dequant_word(std::uint32_t word, std::uint32_t off2, std::uint32_t s2,
                                             std::uint32_t (&o)[4]) {
  constexpr std::uint32_t kBits = Packed<T>::kMagic * 0x10001u | (kSigned ? 0x00080008u : 0u);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    std::uint32_t r;
    asm("lop3.b32 %0, %1, %2, %3, 0x6a;" : "=r"(r) : "r"(word >> (4 * i)), "n"(0x000f000fu), "n"(kBits));
    o[i] = packed_sub_mul<T>(r, off2, s2);
  }
}

// gemv_math for T scales (f.s / f.z hold the packed (s, s) and (magic + zp)
// pairs): per 16-byte word of packed weight, dequant_word's (c, c + 4) column
// pairs as A, and x's 16-byte load regrouped by PRMT into the same pairs as B.
template <class T, bool kSigned, int NC, int NSUB, bool kX>
__device__ __forceinline__ void gemv_math_packed(const GemvFrag<NC, NSUB, kX>& f, const uint4 (&wv)[NSUB],
                                                 float (&acc)[NC][NSUB / 2][4], int k0, bool kin,
                                                 const T* const (&xr)[NC]) {
#pragma unroll
  for (int word = 0; word < 4; ++word) {
    std::uint32_t d[NSUB][4];
#pragma unroll
    for (int sub = 0; sub < NSUB; ++sub)
      dequant_word<T, kSigned>(word_of(wv[sub], word), __float_as_uint(f.z[sub]), __float_as_uint(f.s[sub]), d[sub]);
#pragma unroll
    for (int nc = 0; nc < NC; ++nc) {
      const uint4 xv = kin ? __ldg(reinterpret_cast<const uint4*>(xr[nc] + k0 + word * 8)) : make_uint4(0, 0, 0, 0);
      const std::uint32_t b0 = __byte_perm(xv.x, xv.z, 0x5410), b1 = __byte_perm(xv.x, xv.z, 0x7632);
      const std::uint32_t b2 = __byte_perm(xv.y, xv.w, 0x5410), b3 = __byte_perm(xv.y, xv.w, 0x7632);
#pragma unroll
      for (int tile = 0; tile < NSUB / 2; ++tile) {
        Mma<T>::run(acc[nc][tile], d[2 * tile][0], d[2 * tile + 1][0], d[2 * tile][1], d[2 * tile + 1][1], b0, b1);
        Mma<T>::run(acc[nc][tile], d[2 * tile][2], d[2 * tile + 1][2], d[2 * tile][3], d[2 * tile + 1][3], b2, b3);
      }
    }
  }
}

template <int NC, int NSUB>
constexpr int gemv_smem_bytes() {
  constexpr int slots = kGemvSlots * NSUB * 8 * kStagePitch;
  constexpr int part = kGemvWarps * NC * (NSUB / 2) * 4 * 32 * 4;
  return 128 + (slots > part ? slots : part);
}

// NC <= 2 prefetches the next iteration's x fragments and scales into
// registers while this one's weight stage is awaited and used; NC = 4, 8
// (64, 128 fragment registers per set) prefetch the scales and load x per
// mma step.
template <class T, bool kSigned, int NC, int NSUB, class S>
__global__ void __launch_bounds__(kGemvThreads, 1)
    w4a16_gemv_kernel(const T* __restrict__ x, const std::uint8_t* __restrict__ w, const S* __restrict__ scale,
                      const std::int32_t* __restrict__ zp, const T* __restrict__ bias, T* __restrict__ out, int M,
                      int N, int K, int G) {
  ::qgrad::cuda::wait_for_prior_kernels();
  constexpr int NT = NSUB * 8;
  constexpr int kSlotBytes = NT * kStagePitch;
  constexpr bool kPacked = !std::is_same_v<S, float>;
  constexpr bool kX = NC <= 2 && !kPacked;
  extern __shared__ __align__(128) unsigned char gemv_smem[];
  std::uint64_t* full = reinterpret_cast<std::uint64_t*>(gemv_smem);
  std::uint64_t* empty = full + kGemvSlots;
  unsigned char* slots = gemv_smem + 128;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int n0 = blockIdx.x * NT, m0 = blockIdx.y * (8 * NC);
  const int stages = (K + kStageCols - 1) / kStageCols;
  if (threadIdx.x == 0) {
#pragma unroll
    for (int i = 0; i < kGemvSlots; ++i) {
      mbar_init(full + i, 1);
      mbar_init(empty + i, kGemvWarps);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (warp == kGemvWarps) {
    // Producer: lane r copies row n0 + r of each stage; a slot is refilled
    // once all consumer warps have read it (the empty barrier).
    const int rows = min(NT, N - n0);
    const std::uint8_t* wrow = w + (static_cast<I64>(n0) + lane) * (K / 2);
    for (int s = 0; s < stages; ++s) {
      const int slot = s % kGemvSlots;
      if (s >= kGemvSlots) mbar_wait(empty + slot, static_cast<unsigned>((s / kGemvSlots - 1) & 1));
      const int bytes = min(kStageCols, K - s * kStageCols) / 2;
      if (lane == 0) mbar_expect_tx(full + slot, static_cast<unsigned>(bytes * rows));
      __syncwarp();
      if (lane < rows)
        bulk_copy(slots + slot * kSlotBytes + lane * kStagePitch, wrow + static_cast<I64>(s) * kStageRowBytes,
                  static_cast<unsigned>(bytes), full + slot);
    }
  }
  float acc[NC][NSUB / 2][4];
#pragma unroll
  for (int nc = 0; nc < NC; ++nc)
#pragma unroll
    for (int tile = 0; tile < NSUB / 2; ++tile)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[nc][tile][r] = 0.0f;
  if (warp < kGemvWarps) {
    const int g = lane >> 2, t = lane & 3;
    const int groups = K / G;
    // Row g of each 8-row chunk of x, clamped into [0, M): a row past M computes
    // an output column nobody writes (and NaN in x stays in its own row's outputs).
    const T* xr[NC];
#pragma unroll
    for (int nc = 0; nc < NC; ++nc) xr[nc] = x + static_cast<I64>(min(m0 + nc * 8 + g, M - 1)) * K;
    int nrow[NSUB];
#pragma unroll
    for (int sub = 0; sub < NSUB; ++sub) nrow[sub] = min(n0 + sub * 8 + g, N - 1);
    const uint4 zero4 = make_uint4(0, 0, 0, 0);
    // One stage: this warp's iteration of it (128 columns from k0 - 32 t).
    auto step = [&](int s, GemvFrag<NC, NSUB, kX>& cur, GemvFrag<NC, NSUB, kX>& nxt) {
      const int k0 = (s * kGemvWarps + warp) * 128 + t * 32;
      if (s + 1 < stages)
        gemv_load<T, kSigned, NC, NSUB, kX, S>(nxt, k0 + kStageCols, K, G, groups, xr, nrow, scale, zp);
      const int slot = s % kGemvSlots;
      mbar_wait(full + slot, static_cast<unsigned>((s / kGemvSlots) & 1));
      __syncwarp();
      uint4 wv[NSUB];
      const unsigned char* base = slots + slot * kSlotBytes + warp * 64 + t * 16 + g * kStagePitch;
      const bool kin = k0 < K;
#pragma unroll
      for (int sub = 0; sub < NSUB; ++sub)
        wv[sub] = kin ? *reinterpret_cast<const uint4*>(base + sub * 8 * kStagePitch) : zero4;
      __syncwarp();
      if (lane == 0) mbar_arrive(empty + slot);
      if constexpr (kPacked) gemv_math_packed<T, kSigned, NC, NSUB, kX>(cur, wv, acc, k0, kin, xr);
      else gemv_math<T, kSigned, NC, NSUB, kX>(cur, wv, acc, k0, kin, xr);
    };
    GemvFrag<NC, NSUB, kX> fa, fb;
    gemv_load<T, kSigned, NC, NSUB, kX, S>(fa, warp * 128 + t * 32, K, G, groups, xr, nrow, scale, zp);
    for (int s = 0; s < stages; s += 2) {
      step(s, fa, fb);
      if (s + 1 < stages) step(s + 1, fb, fa);
    }
  }
  __syncthreads();  // every stage consumed: the slots hold the partial tiles now
  constexpr int kTile = NC * (NSUB / 2) * 4;  // accumulators per lane
  float* part = reinterpret_cast<float*>(slots);
  if (warp < kGemvWarps) {
#pragma unroll
    for (int nc = 0; nc < NC; ++nc)
#pragma unroll
      for (int tile = 0; tile < NSUB / 2; ++tile)
#pragma unroll
        for (int r = 0; r < 4; ++r)
          part[(warp * kTile + (nc * (NSUB / 2) + tile) * 4 + r) * 32 + lane] = acc[nc][tile][r];
  }
  __syncthreads();
  // One output per (idx, lane): the consumer warps' partials added in warp order.
  // C's element r of lane (g, t): channel g + 8 (r >> 1) of the tile, row 2t + (r & 1) of the chunk.
  for (int o = threadIdx.x; o < kTile * 32; o += kGemvThreads) {
    const int idx = o >> 5, ln = o & 31;
    const int nc = idx / ((NSUB / 2) * 4), tile = (idx >> 2) % (NSUB / 2), r = idx & 3;
    const int m = m0 + nc * 8 + 2 * (ln & 3) + (r & 1), n = n0 + tile * 16 + (ln >> 2) + (r >> 1) * 8;
    if (m < M && n < N) {
      float v = part[idx * 32 + ln];
#pragma unroll
      for (int wq = 1; wq < kGemvWarps; ++wq) v += part[(wq * kTile + idx) * 32 + ln];
      if (bias) v += static_cast<float>(bias[n]);
      out[static_cast<I64>(m) * N + n] = T(v);
    }
  }
}

template <class T, bool kSigned, int NC, int NSUB, class S>
void launch_w4a16_gemv(const Tensor& x, const Tensor& w, const Tensor& scale, const Tensor& zp, I64 G,
                       const Tensor& bias, const Tensor& out) {
  const I64 M = out.shape()[0], N = out.shape()[1], K = w.shape()[1];
  constexpr int kSmem = gemv_smem_bytes<NC, NSUB>();
  constexpr auto kernel = w4a16_gemv_kernel<T, kSigned, NC, NSUB, S>;
  const int dev = out.device().index;
  allow_dynamic_smem<kernel>(dev, kSmem);
  const dim3 grid(static_cast<unsigned>((N + NSUB * 8 - 1) / (NSUB * 8)),
                  static_cast<unsigned>((M + 8 * NC - 1) / (8 * NC)));
  ::qgrad::cuda::launch_kernel(dev, kernel, grid, kGemvThreads, kSmem, static_cast<const T*>(x.data_ptr()),
                               static_cast<const std::uint8_t*>(w.data_ptr()), static_cast<const S*>(scale.data_ptr()),
                               zp.defined() ? static_cast<const std::int32_t*>(zp.data_ptr()) : nullptr,
                               bias.defined() ? static_cast<const T*>(bias.data_ptr()) : nullptr,
                               static_cast<T*>(out.data_ptr()), static_cast<int>(M), static_cast<int>(N),
                               static_cast<int>(K), static_cast<int>(G));
}

// ------------------------------------------------- W4A16 split-K GEMV

// Decode sizes (M <= 8). A block owns one m16 tile of 16 output channels
// (NSUB = 2 of gemv_math / gemv_math_packed) and 8 rows of x; its WARPS warps
// split K by 128-column iterations (warp w takes w, w + WARPS, ...). Lane
// (g, t) reads 16 bytes = 32 columns at k0 = 128 it + 32 t of channels g and
// g + 8 of the tile. A warp issues the weight loads of U iterations at once
// (U KiB in flight per warp; two blocks per SM, no producer warp), then
// dequantizes and multiplies each (S = T: the packed T x 2 math; S = float: the f32 math). The warps'
// partial tiles are added in warp order (deterministic). With f32 scales it
// replaced the bulk-copy GEMV at M = 1 (kernel 7.4 us against 8.9, H200); at
// 8 < M <= 16 two 8-row chunks a block measured slower than the bulk-copy
// GEMV (f32 scales 14.1 against 11.3 us, T scales 9.5 against 9.2).
template <class T, bool kSigned, int WARPS, int U, class S>
__global__ void __launch_bounds__(WARPS * 32, 2)
    w4a16_splitk_kernel(const T* __restrict__ x, const std::uint8_t* __restrict__ w, const S* __restrict__ scale,
                        const std::int32_t* __restrict__ zp, const T* __restrict__ bias, T* __restrict__ out, int M,
                        int N, int K, int G, bool prefetch_weight) {
  ::qgrad::cuda::DeferredPriorWait prior;
  constexpr bool kPacked = !std::is_same_v<S, float>;
  // The block's 16 weight rows (contiguous) asked of L2 before the wait: in
  // a chain of layers, during the tail of the kernel before (see
  // bulk_prefetch_l2 for why a weight that kernel writes is still read right).
  if (prefetch_weight && threadIdx.x == 0) {
    const int rows = min(16, N - static_cast<int>(blockIdx.x) * 16);
    bulk_prefetch_l2(w + static_cast<I64>(blockIdx.x) * 16 * (K / 2), static_cast<unsigned>(rows * (K / 2)));
  }
  prior.wait();
  __shared__ float part[WARPS][4][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int n0 = blockIdx.x * 16;
  const int groups = K / G;
  // Rows of x and channels past the end are clamped in range: they compute
  // outputs nobody writes (and NaN in x stays in its own row's outputs).
  const T* const xr[1] = {x + static_cast<I64>(min(g, M - 1)) * K};
  const int nrow[2] = {min(n0 + g, N - 1), min(n0 + 8 + g, N - 1)};
  const std::uint8_t* w_lo = w + static_cast<I64>(nrow[0]) * (K / 2) + t * 16;
  const std::uint8_t* w_hi = w + static_cast<I64>(nrow[1]) * (K / 2) + t * 16;
  float acc[1][1][4] = {{{0.0f, 0.0f, 0.0f, 0.0f}}};
  const int iters = (K + 127) / 128;
  const uint4 zero4 = make_uint4(0, 0, 0, 0);
  for (int base = warp; base < iters; base += U * WARPS) {
    uint4 wv[U][2];
    GemvFrag<1, 2, false> f[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int it = base + u * WARPS;
      const int k0 = it * 128 + t * 32;  // K % 32 == 0: a lane's 32 columns are all in or all out
      const bool kin = k0 < K;
      wv[u][0] = kin ? ld_stream16(w_lo + static_cast<I64>(it) * 64) : zero4;
      wv[u][1] = kin ? ld_stream16(w_hi + static_cast<I64>(it) * 64) : zero4;
      gemv_load<T, kSigned, 1, 2, false, S>(f[u], k0, K, G, groups, xr, nrow, scale, zp);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int it = base + u * WARPS;
      if (it >= iters) break;  // uniform in the warp
      const int k0 = it * 128 + t * 32;
      if constexpr (kPacked) gemv_math_packed<T, kSigned, 1, 2, false>(f[u], wv[u], acc, k0, k0 < K, xr);
      else gemv_math<T, kSigned, 1, 2, false>(f[u], wv[u], acc, k0, k0 < K, xr);
    }
  }
#pragma unroll
  for (int r = 0; r < 4; ++r) part[warp][r][lane] = acc[0][0][r];
  __syncthreads();
  // C's element r of lane (g, t): channel g + 8 (r >> 1), row 2t + (r & 1).
  for (int o = threadIdx.x; o < 4 * 32; o += WARPS * 32) {
    const int r = o >> 5, ln = o & 31;
    const int m = 2 * (ln & 3) + (r & 1), n = n0 + (ln >> 2) + (r >> 1) * 8;
    if (m < M && n < N) {
      float v = part[0][r][ln];
#pragma unroll
      for (int wq = 1; wq < WARPS; ++wq) v += part[wq][r][ln];
      if (bias) v += static_cast<float>(bias[n]);
      out[static_cast<I64>(m) * N + n] = T(v);
    }
  }
}

template <class T, bool kSigned, class S>
void launch_w4a16_splitk(const Tensor& x, const Tensor& w, const Tensor& scale, const Tensor& zp, I64 G,
                         const Tensor& bias, const Tensor& out) {
  constexpr int kWarps = 8, kU = 4;
  const I64 M = out.shape()[0], N = out.shape()[1], K = w.shape()[1];
  ::qgrad::cuda::launch_kernel(
      out.device().index, w4a16_splitk_kernel<T, kSigned, kWarps, kU, S>, static_cast<unsigned>((N + 15) / 16),
      kWarps * 32, 0, static_cast<const T*>(x.data_ptr()), static_cast<const std::uint8_t*>(w.data_ptr()),
      static_cast<const S*>(scale.data_ptr()), zp.defined() ? static_cast<const std::int32_t*>(zp.data_ptr()) : nullptr,
      bias.defined() ? static_cast<const T*>(bias.data_ptr()) : nullptr, static_cast<T*>(out.data_ptr()),
      static_cast<int>(M), static_cast<int>(N), static_cast<int>(K), static_cast<int>(G),
      /*prefetch_weight=*/G >= 128);
}

template <class T>
bool w4a16_gemv(const Tensor& x, const Tensor& w, const Tensor& scale, const Tensor& zp, I64 G, const Tensor& bias,
                const Tensor& out) {
  if constexpr (std::is_same_v<T, float>) {
    return false;
  } else {
    const I64 M = out.shape()[0], N = out.shape()[1], K = w.shape()[1];
    if (M > kW4A16GemvMaxM || K % 32 != 0 || G % 32 != 0 || !aligned16(x.data_ptr()) || !aligned16(w.data_ptr()) ||
        K > (I64(1) << 30) || N > (I64(1) << 30))
      return false;
    const bool sg = w.dtype() == DType::s4;
    const bool packed = scale.dtype() != DType::f32;  // T scales (the op allows f32 or x's dtype)
    // Bulk-copy GEMV: 8 NC rows of x per block (16, 32 or 64), 32 channels (NSUB = 4).
    auto go = [&](auto nc) {
      constexpr int kNC = decltype(nc)::value;
      // M <= 8: the split-K GEMV (more warps in flight, no producer); 8 < M <= 64:
      // the bulk-copy GEMV (x fragments and mma issue shared by 32 channels).
      if constexpr (kNC == 1) {
        if (packed) {
          sg ? launch_w4a16_splitk<T, true, T>(x, w, scale, zp, G, bias, out)
             : launch_w4a16_splitk<T, false, T>(x, w, scale, zp, G, bias, out);
        } else {
          sg ? launch_w4a16_splitk<T, true, float>(x, w, scale, zp, G, bias, out)
             : launch_w4a16_splitk<T, false, float>(x, w, scale, zp, G, bias, out);
        }
      } else if (packed) {
        sg ? launch_w4a16_gemv<T, true, kNC, 4, T>(x, w, scale, zp, G, bias, out)
           : launch_w4a16_gemv<T, false, kNC, 4, T>(x, w, scale, zp, G, bias, out);
      } else {
        sg ? launch_w4a16_gemv<T, true, kNC, 4, float>(x, w, scale, zp, G, bias, out)
           : launch_w4a16_gemv<T, false, kNC, 4, float>(x, w, scale, zp, G, bias, out);
      }
    };
    if (M <= 8) go(std::integral_constant<int, 1>{});
    else if (M <= 16) go(std::integral_constant<int, 2>{});
    else if (M <= 32) go(std::integral_constant<int, 4>{});
    else go(std::integral_constant<int, 8>{});
    return true;
  }
}

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
  if (w4a16_gemv<T>(x, w, scale16, zp, G, bias, out)) return;
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
