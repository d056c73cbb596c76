// The W4A16 decode GEMVs of kernels/cuda/lowbit_linear.cu on raw pointers:
// their kernels, launchers and the route between them. A header whose
// contents have internal linkage, so that dev/cuda/w4a16_ab can compile two
// versions of it side by side without the library; lowbit_linear.cu is its
// one includer in the library.
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
// (w4a16_splitk_kernel: a block per 16 channels, 8 warps splitting K into
// contiguous runs of 4 iterations, each warp keeping the 16-byte weight loads
// of 2-3 iterations in flight ahead of its math, two blocks per SM), with the
// same per-value math; 8 < M <= 16 with K a multiple of 4096 (T or f32
// scales): the same kernel with two 8-row chunks of x and two m16 tiles (32
// channels) a warp, 8 warps a block of 4 iterations each (a lane's x
// fragments serve twice the channels). For groups of 128 or more each block
// first asks L2 for its weight rows (one bulk prefetch) before it waits for
// the kernel before it: in a chain of layers under programmatic dependent
// launch the weight starts to stream during the previous layer's tail (H200,
// M = 1, N = K = 4096, bf16 scales: a layer of a captured 24-layer chain 6.1 ->
// 5.6 us, back to back 6.3 -> 6.0; with groups of 32 it measured 6.1 -> 6.4,
// so smaller groups do without; forty-fifth session).
// A weight in pack_w4a16's fragment order (W4a16GemvArgs::w_fragments: 512
// contiguous bytes a warp load, x's pairs unshuffled, immutable) takes the
// split-K GEMV at every M <= 16, its first loads issued before the wait.
// Both GEMVs are bound by instruction issue more than by memory, so each has a
// kFull instantiation for whole runs / stages of K and power-of-two groups
// (no bounds tests, the group index a shift): the split-K GEMV always, the
// bulk-copy one with f32 scales, where each measured faster.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "qgrad/core/cuda/common.cuh"
#include "qgrad/core/half.h"
#include "qgrad/kernels/cuda/launch.cuh"
#include "qgrad/kernels/cuda/mbarrier.cuh"
#include "qgrad/kernels/cuda/mma.cuh"

namespace qgrad::kernels::cuda {

// One decode-size W4A16 product: out [M, N] = x [M, K] W^T (+ bias), W packed
// s4 (w_signed) or u4 (with zp s32 [N, K / G]) [N, K], K / 2 bytes a row;
// scale [N, K / G] f32 or (scale_in_t) T; all on `device`.
template <class T>
struct W4a16GemvArgs {
  const T* x;
  const std::uint8_t* w;
  const void* scale;
  const std::int32_t* zp;  // u4 only
  const T* bias;           // may be null
  T* out;
  int M, N, K, G;
  bool w_signed, scale_in_t;
  int device;
  // w in pack_w4a16's fragment order (formulas::w4a16_frag_*; M <= 16 only),
  // and with scale and zp immutable: no running grid writes them, so the
  // split-K GEMV issues its first loads of them before it waits.
  bool w_fragments = false;
};

namespace {  // a copy per includer (see above)

using I64 = std::int64_t;

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

// One channel's scale and zero point of one group as GemvFrag holds them
// (zp is not read for s4): f32 scales as floats, T scales as the packed pairs
// (s, s) and (magic + zp) x 2 of gemv_math_packed, in bits. kin false: a zero
// scale (an absent column block's products are zeros).
template <class T, bool kSigned, class S>
__device__ __forceinline__ void gemv_scale(float& s, float& z, const S* scale, const std::int32_t* zp, bool kin) {
  if constexpr (std::is_same_v<S, float>) {
    const float v = __ldg(scale);
    s = kin ? v : 0.0f;
    z = kSigned ? 8.0f : static_cast<float>(__ldg(zp));
  } else {
    const std::uint32_t s2 = __ldg(reinterpret_cast<const std::uint16_t*>(scale)) * 0x10001u;
    s = __uint_as_float(kin ? s2 : 0u);
    const std::uint32_t zq = kSigned ? 8u : static_cast<std::uint32_t>(__ldg(zp));
    z = __uint_as_float((Packed<T>::kMagic + zq) * 0x10001u);
  }
}

// x's 16-byte words of a lane's 32 columns from k0, for each chunk: mma steps
// 2w and 2w + 1 (gemv_math) or word w (gemv_math_packed); zeros where !kin.
template <class T, int NC, int NSUB>
__device__ __forceinline__ void gemv_load_x(GemvFrag<NC, NSUB, true>& f, int k0, bool kin, const T* const (&xr)[NC]) {
#pragma unroll
  for (int nc = 0; nc < NC; ++nc)
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const uint4 v = kin ? __ldg(reinterpret_cast<const uint4*>(xr[nc] + k0 + 8 * w)) : make_uint4(0, 0, 0, 0);
      f.xb[nc][2 * w] = make_uint2(v.x, v.y);
      f.xb[nc][2 * w + 1] = make_uint2(v.z, v.w);
    }
}

template <class T, bool kSigned, int NC, int NSUB, bool kX, class S, bool kFull = false>
__device__ __forceinline__ void gemv_load(GemvFrag<NC, NSUB, kX>& f, int k0, int K, int G, int groups,
                                          const T* const (&xr)[NC], const int (&nrow)[NSUB],
                                          const S* __restrict__ scale, const std::int32_t* __restrict__ zp) {
  const bool kin = kFull || k0 < K;  // K % 32 == 0: a lane's 32 columns are all in or all out
  if constexpr (kX) gemv_load_x<T>(f, k0, kin, xr);
  // Group sizes are powers of two in practice: a shift (G is loop-invariant, so
  // the test and __ffs are hoisted) instead of an integer division per call.
  const int gk = kFull ? k0 >> (__ffs(G) - 1) : kin ? ((G & (G - 1)) == 0 ? k0 >> (__ffs(G) - 1) : k0 / G) : 0;
#pragma unroll
  for (int sub = 0; sub < NSUB; ++sub) {
    // nrow is clamped into [0, N): a channel past N computes an output nobody writes. An
    // absent column block multiplies by a zero scale and a zero x: its products are zeros.
    const I64 gi = static_cast<I64>(nrow[sub]) * groups + gk;
    gemv_scale<T, kSigned>(f.s[sub], f.z[sub], scale + gi, zp + (kSigned ? 0 : gi), kin);
  }
}

template <class T, bool kSigned, int NC, int NSUB, bool kX, bool kFrag = false>
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
      if constexpr (kFrag) {  // columns c + 4 (j & 1) + {0, 1, 2, 3}: nibbles 0, 4, 1, 5 or 2, 6, 3, 7
        const std::uint32_t w12 = word >> 12;
        if ((j & 1) == 0) {
          v0 = nibble_minus<kSigned, 0>(word, off[sub][0]);
          v1 = nibble_minus<kSigned, 4>(word, off[sub][4]);
          v2 = nibble_minus<kSigned, 1>(word, off[sub][1]);
          v3 = nibble_minus<kSigned, 2>(w12, off[sub][2]);
        } else {
          v0 = nibble_minus<kSigned, 2>(word, off[sub][2]);
          v1 = nibble_minus<kSigned, 3>(w12, off[sub][3]);
          v2 = nibble_minus<kSigned, 3>(word, off[sub][3]);
          v3 = nibble_minus<kSigned, 4>(w12, off[sub][4]);
        }
      } else if ((j & 1) == 0) {  // nibbles 0..3
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
// kFrag (the fragment order): the pairs are (c + 2i, c + 2i + 1), x's own
// order: no PRMT, and the mma steps are those of gemv_math (same bits as the
// f32-scale path for scales of T's values).
template <class T, bool kSigned, int NC, int NSUB, bool kX, bool kFrag = false>
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
      uint4 xv;
      if constexpr (kX) {
        xv = make_uint4(f.xb[nc][2 * word].x, f.xb[nc][2 * word].y, f.xb[nc][2 * word + 1].x, f.xb[nc][2 * word + 1].y);
      } else {
        xv = kin ? __ldg(reinterpret_cast<const uint4*>(xr[nc] + k0 + word * 8)) : make_uint4(0, 0, 0, 0);
      }
      const std::uint32_t b0 = kFrag ? xv.x : __byte_perm(xv.x, xv.z, 0x5410);
      const std::uint32_t b1 = kFrag ? xv.y : __byte_perm(xv.x, xv.z, 0x7632);
      const std::uint32_t b2 = kFrag ? xv.z : __byte_perm(xv.y, xv.w, 0x5410);
      const std::uint32_t b3 = kFrag ? xv.w : __byte_perm(xv.y, xv.w, 0x7632);
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
// registers while this one's weight stage is awaited and used, with f32 and
// with T scales alike (before the forty-sixth session T scales loaded x in
// the math, after the wait: M = 16, H200, a layer of the captured chain
// 8.67 -> 8.02 us, same bits); NC = 4, 8 (64, 128 fragment registers per
// set) prefetch the scales and load x per mma step.
template <class T, bool kSigned, int NC, int NSUB, class S, bool kFull>
__global__ void __launch_bounds__(kGemvThreads, 1)
    w4a16_gemv_kernel(const T* __restrict__ x, const std::uint8_t* __restrict__ w, const S* __restrict__ scale,
                      const std::int32_t* __restrict__ zp, const T* __restrict__ bias, T* __restrict__ out, int M,
                      int N, int K, int G) {
  ::qgrad::cuda::wait_for_prior_kernels();
  constexpr int NT = NSUB * 8;
  constexpr int kSlotBytes = NT * kStagePitch;
  constexpr bool kPacked = !std::is_same_v<S, float>;
  constexpr bool kX = NC <= 2;
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
        gemv_load<T, kSigned, NC, NSUB, kX, S, kFull>(nxt, k0 + kStageCols, K, G, groups, xr, nrow, scale, zp);
      const int slot = s % kGemvSlots;
      mbar_wait(full + slot, static_cast<unsigned>((s / kGemvSlots) & 1));
      __syncwarp();
      uint4 wv[NSUB];
      const unsigned char* base = slots + slot * kSlotBytes + warp * 64 + t * 16 + g * kStagePitch;
      const bool kin = kFull || k0 < K;
#pragma unroll
      for (int sub = 0; sub < NSUB; ++sub)
        wv[sub] = kin ? *reinterpret_cast<const uint4*>(base + sub * 8 * kStagePitch) : zero4;
      __syncwarp();
      if (lane == 0) mbar_arrive(empty + slot);
      if constexpr (kPacked) gemv_math_packed<T, kSigned, NC, NSUB, kX>(cur, wv, acc, k0, kin, xr);
      else gemv_math<T, kSigned, NC, NSUB, kX>(cur, wv, acc, k0, kin, xr);
    };
    GemvFrag<NC, NSUB, kX> fa, fb;
    gemv_load<T, kSigned, NC, NSUB, kX, S, kFull>(fa, warp * 128 + t * 32, K, G, groups, xr, nrow, scale, zp);
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
void launch_w4a16_gemv(const W4a16GemvArgs<T>& a) {
  constexpr int kSmem = gemv_smem_bytes<NC, NSUB>();
  // f32 scales, K a whole number of stages and G a power of two: the kernel
  // without bounds tests or divisions (H200, M = 16, chain 10.35 -> 9.33 us a
  // layer, same bits). T scales keep the general one (8.06 -> 8.11, and 7.58 ->
  // 8.02 with the weight in L2), NC = 8 too (the fast one spills more there).
  constexpr bool kMayFull = std::is_same_v<S, float> && NC <= 4;
  const bool full = kMayFull && a.K % kStageCols == 0 && (a.G & (a.G - 1)) == 0;
  constexpr auto kernel_part = w4a16_gemv_kernel<T, kSigned, NC, NSUB, S, false>;
  constexpr auto kernel_full = w4a16_gemv_kernel<T, kSigned, NC, NSUB, S, kMayFull>;
  allow_dynamic_smem<kernel_part>(a.device, kSmem);
  if (full) allow_dynamic_smem<kernel_full>(a.device, kSmem);
  const auto kernel = full ? kernel_full : kernel_part;
  const dim3 grid(static_cast<unsigned>((a.N + NSUB * 8 - 1) / (NSUB * 8)),
                  static_cast<unsigned>((a.M + 8 * NC - 1) / (8 * NC)));
  ::qgrad::cuda::launch_kernel(a.device, kernel, grid, kGemvThreads, kSmem, a.x, a.w, static_cast<const S*>(a.scale),
                               a.zp, a.bias, a.out, a.M, a.N, a.K, a.G);
}

// ------------------------------------------------- W4A16 split-K GEMV

// Decode sizes (M <= 16: NC = 1 or 2 chunks of x, TILES = 1 or 2; the
// route's launcher below picks them by M). A block owns TILES m16 tiles of
// 16 output channels (NSUB = 2 TILES of gemv_math / gemv_math_packed) and NC
// chunks of 8 rows of x; its WARPS warps
// split K by 128-column iterations, warp w taking the U iterations from U w
// on, then from U (w + WARPS) on, ... (contiguous: H200, M = 1, a layer of the
// chain 5.74 -> 5.61 us against warp w taking w, w + WARPS, ...). Lane (g, t)
// reads 16 bytes = 32 columns at k0 = 128 it + 32 t of channels g and g + 8
// of each tile. A warp keeps the loads of D of its U iterations in flight
// (no producer warp), dequantizing and multiplying each
// as it arrives (S = T: the packed T x 2 math; S = float: the f32 math). The warps'
// partial tiles are added in warp order (deterministic). With f32 scales it
// replaced the bulk-copy GEMV at M = 1 (kernel 7.4 us against 8.9, H200). At
// 8 < M <= 16 (NC = 2) with T scales, kFull: one tile and 8 warps of 4
// iterations a block measured 8.07 -> 7.95 us a layer of the chain against
// the bulk-copy GEMV, two tiles and 16 warps of 2 iterations 6.75 (the x
// fragments' loads and PRMTs shared by 32 channels; H200, M = 16, N = K =
// 4096, groups of 128; forty-eighth session), two tiles and 8 warps of 4
// iterations 6.35 (room for the next layer's block on the SM; forty-ninth
// session; the route's launcher below).
// kFrag: w in pack_w4a16's fragment order (a.w_fragments): a warp's 16-byte
// loads of one channel half read 512 contiguous bytes, the math needs no
// shuffle of x, and since no running grid writes such a weight or its scales
// (see W4a16GemvArgs), each warp's first D iterations of them are loaded
// before the wait for the kernel before (H200, N = K = 4096, groups of 128,
// bf16 scales, a layer of the captured chain: M = 1 4.8 -> 4.6 us, M = 16
// 6.4 -> 5.8; fifty-first session).
template <class T, bool kSigned, int NC, int TILES, int WARPS, int U, int D, class S, bool kFull, bool kFrag>
__global__ void __launch_bounds__(WARPS * 32, 512 / (WARPS * 32))
    w4a16_splitk_kernel(const T* __restrict__ x, const std::uint8_t* __restrict__ w, const S* __restrict__ scale,
                        const std::int32_t* __restrict__ zp, const T* __restrict__ bias, T* __restrict__ out, int M,
                        int N, int K, int G, bool prefetch_weight, unsigned opaque_zero) {
  ::qgrad::cuda::DeferredPriorWait prior;
  constexpr bool kPacked = !std::is_same_v<S, float>;
  constexpr int NSUB = 2 * TILES, NT = 16 * TILES;  // 8-channel halves, channels of the block
  // The block's weight (contiguous: NT rows, or TILES units of each column
  // block in the fragment order) asked of L2 before the wait: in a chain of
  // layers, during the tail of the kernel before (see bulk_prefetch_l2 for
  // why a weight that kernel writes is still read right).
  if (prefetch_weight && threadIdx.x == 0) {
    if constexpr (kFrag) {
      const I64 unit_bytes = static_cast<I64>((K + 127) / 128) * 1024;  // a 16-channel block's
      bulk_prefetch_l2(w + static_cast<I64>(blockIdx.x) * TILES * unit_bytes, static_cast<unsigned>(TILES * unit_bytes));
    } else {
      const int rows = min(NT, N - static_cast<int>(blockIdx.x) * NT);
      bulk_prefetch_l2(w + static_cast<I64>(blockIdx.x) * NT * (K / 2), static_cast<unsigned>(rows * (K / 2)));
    }
  }
  // Early loads: see above (one tile a warp: with two, the loads held across
  // the wait spill).
  constexpr bool kEarly = kFrag && TILES == 1;
  if constexpr (!kEarly) prior.wait();
  __shared__ float part[WARPS][NC * TILES * 4][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int n0 = blockIdx.x * NT;
  const int groups = K / G;
  // Rows of x and channels past the end are clamped in range: they compute
  // outputs nobody writes (and NaN in x stays in its own row's outputs). The
  // fragment order has zero rows there (N padded to a multiple of 32).
  const T* xr[NC];
#pragma unroll
  for (int nc = 0; nc < NC; ++nc) xr[nc] = x + static_cast<I64>(min(nc * 8 + g, M - 1)) * K;
  constexpr I64 kWStep = kFrag ? 1024 : 64;  // bytes from one iteration's 16 bytes to the next's
  int nrow[NSUB];
  const std::uint8_t* wrow[NSUB];
  const S* srow[NSUB];
  const std::int32_t* zrow[NSUB];
#pragma unroll
  for (int sub = 0; sub < NSUB; ++sub) {
    nrow[sub] = min(n0 + sub * 8 + g, N - 1);
    wrow[sub] = kFrag ? w + ((static_cast<I64>(blockIdx.x) * TILES + sub / 2) * ((K + 127) / 128) * 2 + (sub & 1)) * 512 + lane * 16
                      : w + static_cast<I64>(nrow[sub]) * (K / 2) + t * 16;
    srow[sub] = scale + static_cast<I64>(nrow[sub]) * groups;
    zrow[sub] = kSigned ? zp : zp + static_cast<I64>(nrow[sub]) * groups;
  }
  float acc[NC][TILES][4];
#pragma unroll
  for (int nc = 0; nc < NC; ++nc)
#pragma unroll
    for (int tile = 0; tile < TILES; ++tile)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[nc][tile][r] = 0.0f;
  const int iters = (K + 127) / 128;  // 128-column iterations (the fragment order's column blocks)
  const uint4 zero4 = make_uint4(0, 0, 0, 0);
  const int gshift = __ffs(G) - 1;
  // kXEarly: x's fragments of an iteration loaded with its weight (16
  // registers an iteration) rather than in the math after the weight has
  // arrived. Two tiles a warp, one chunk of x (4 <= M <= 8): same bits,
  // H200, N = K = 4096, groups of 128, chain, bf16 / f32 scales: M = 8
  // 5.34 -> 5.13 / 6.37 -> 6.09 us, M = 4 5.16 -> 5.04 / 6.23 -> 6.09; one
  // tile (M = 1) no faster (4.82 -> 4.87), two chunks would take 32
  // registers an iteration (fiftieth session).
  constexpr bool kXEarly = kFull && NC == 1 && TILES == 2;
  uint4 wv[U][NSUB];
  GemvFrag<NC, NSUB, kXEarly> f[U];
  // Iteration u's weight and scales (and zero points); `dep` is 0 at run time
  // but depends on data already loaded, so they cannot be issued before that
  // data has arrived.
  auto issue_w = [&](int base, int u, unsigned dep) {
    const int it = base + u + static_cast<int>(dep);
    if constexpr (kFull) {
#pragma unroll
      for (int sub = 0; sub < NSUB; ++sub) wv[u][sub] = ld_stream16(wrow[sub] + static_cast<I64>(it) * kWStep);
      const int gk = (it * 128 + t * 32) >> gshift;
#pragma unroll
      for (int sub = 0; sub < NSUB; ++sub)
        gemv_scale<T, kSigned>(f[u].s[sub], f[u].z[sub], srow[sub] + gk, zrow[sub] + (kSigned ? 0 : gk), true);
    } else {
      const int k0 = it * 128 + t * 32;  // K % 32 == 0: a lane's 32 columns are all in or all out
      const bool kin = k0 < K;
#pragma unroll
      for (int sub = 0; sub < NSUB; ++sub)
        wv[u][sub] = kin ? ld_stream16(wrow[sub] + static_cast<I64>(it) * kWStep) : zero4;
      gemv_load<T, kSigned, NC, NSUB, kXEarly, S>(f[u], k0, K, G, groups, xr, nrow, scale, zp);  // scales only
    }
  };
  // Iteration u's x fragments (kXEarly), after the wait.
  auto issue_x = [&](int base, int u, unsigned dep) {
    if constexpr (kXEarly) gemv_load_x<T>(f[u], (base + u + static_cast<int>(dep)) * 128 + t * 32, true, xr);
    else (void)base, (void)u, (void)dep;
  };
  constexpr int kFirst = D < U ? D : U;
  if constexpr (kEarly) {
    if (warp * U < iters) {
#pragma unroll
      for (int u = 0; u < kFirst; ++u) issue_w(warp * U, u, 0u);
    }
    prior.wait();
    // x is the kernel before's output: its loads must follow the wait, whose
    // memory clobber does not hold back ld.global.nc (__ldg) loads (ptxas
    // may hoist them), so their addresses take a zero made after it.
    unsigned after_wait;
    asm volatile("mov.u32 %0, 0;" : "=r"(after_wait)::"memory");
#pragma unroll
    for (int nc = 0; nc < NC; ++nc) xr[nc] += after_wait;
  }
  for (int base = warp * U; base < iters; base += U * WARPS) {
#pragma unroll
    for (int u = 0; u < kFirst; ++u) {
      if (!kEarly || base != warp * U) issue_w(base, u, 0u);
      issue_x(base, u, 0u);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      // The loads of iteration u + D once iteration u's weight is here. The
      // kernel parameter opaque_zero (always 0) keeps ptxas, which would
      // otherwise hoist every load to the top, from seeing through `dep`.
      if (u + D < U) {
        const unsigned dep = (wv[u][0].x | wv[u][NSUB - 1].x) & opaque_zero;
        issue_w(base, u + D, dep);
        issue_x(base, u + D, dep);
      }
      const int it = base + u;
      if (!kFull && it >= iters) break;  // uniform in the warp
      const int k0 = it * 128 + t * 32;
      const bool kin = kFull || k0 < K;
      if constexpr (kPacked) gemv_math_packed<T, kSigned, NC, NSUB, kXEarly, kFrag>(f[u], wv[u], acc, k0, kin, xr);
      else gemv_math<T, kSigned, NC, NSUB, kXEarly, kFrag>(f[u], wv[u], acc, k0, kin, xr);
    }
  }
#pragma unroll
  for (int nc = 0; nc < NC; ++nc)
#pragma unroll
    for (int tile = 0; tile < TILES; ++tile)
#pragma unroll
      for (int r = 0; r < 4; ++r) part[warp][(nc * TILES + tile) * 4 + r][lane] = acc[nc][tile][r];
  __syncthreads();
  // C's element r of lane (g, t) in chunk nc and tile: channel 16 tile + g +
  // 8 (r >> 1), row 8 nc + 2t + (r & 1).
  for (int o = threadIdx.x; o < NC * TILES * 4 * 32; o += WARPS * 32) {
    const int idx = o >> 5, ln = o & 31, r = idx & 3, tile = (idx >> 2) % TILES, nc = (idx >> 2) / TILES;
    const int m = nc * 8 + 2 * (ln & 3) + (r & 1), n = n0 + tile * 16 + (ln >> 2) + (r >> 1) * 8;
    if (m < M && n < N) {
      float v = part[0][idx][ln];
#pragma unroll
      for (int wq = 1; wq < WARPS; ++wq) v += part[wq][idx][ln];
      if (bias) v += static_cast<float>(bias[n]);
      out[static_cast<I64>(m) * N + n] = T(v);
    }
  }
}

// ------------------------------------------- W4A16 resident-slab GEMV

// M <= 2, 16-bit scales, a weight in pack_w4a16's fragment order (immutable:
// see W4a16GemvArgs::w_fragments), K = 4096 (w4a16_resident_fits). The
// split-K GEMV's warps, runs, math and order (so the same bits), but every
// warp asks for its whole share of the weight with bulk copies into shared
// memory before the wait for the kernel before, and a block is small enough
// (16 channels, 8 warps of <= 64 registers, 52 KiB of shared memory) that
// four fit an SM: in a chain of layers under programmatic dependent launch,
// layer i + 1's blocks sit beside layer i's and stream their weight from HBM
// while layer i computes. (The split-K GEMV's blocks fill the SMs, 256 of 2
// an SM at N = 4096, so the next layer's early loads cannot start before
// this layer's blocks leave.) After the wait the block copies x's rows into
// shared memory with 16-byte loads and the warps run their math from there.
// H200, N = K = 4096, groups of 128, s4, bf16 scales, bit-identical, µs a
// layer of the captured decode chain against the split-K GEMV (sixty-fifth
// session, dev/cuda/w4a16_ab): M = 1 4.59 -> 3.95 (L2-resident weight 4.08 ->
// 3.70), M = 2 4.76 -> 4.01; bench_lowbit M = 1 4.0 against bf16 cuBLAS's
// 12.5. With f32 scales it was slower (chain 5.55 -> 6.2: the longer math on
// a quarter of an SM's threads), so they keep the split-K GEMV.
constexpr int kResidentRun = 4;                   // iterations a warp's run (the split-K GEMV's U)
constexpr int kResidentK = 4096;                  // the K it is built for: a 32 KiB slab a block
constexpr int kResidentMaxM = 2;
constexpr int kResidentHeadBytes = 256 + 8 * 4 * 32 * 4;  // the warps' barriers, then their partial tiles
constexpr int kResidentSmem = kResidentHeadBytes + kResidentK / 128 * 1024 + kResidentMaxM * kResidentK * 2;
template <class T, bool kSigned>  // scales of T (f32 scales keep the split-K GEMV)
__global__ void __launch_bounds__(256, 4)
    w4a16_resident_kernel(const T* __restrict__ x, const std::uint8_t* __restrict__ w, const T* __restrict__ scale,
                          const std::int32_t* __restrict__ zp, const T* __restrict__ bias, T* __restrict__ out, int M,
                          int N, int G) {
  ::qgrad::cuda::DeferredPriorWait prior;
  constexpr int U = kResidentRun, TW = 8, K = kResidentK;  // iterations a run, warps a block
  constexpr int iters = K / 128, runs = iters / (U * TW);
  extern __shared__ __align__(128) unsigned char resident_smem[];
  std::uint64_t* bar = reinterpret_cast<std::uint64_t*>(resident_smem);  // [TW]
  float* part = reinterpret_cast<float*>(resident_smem + 256);
  unsigned char* wsm = resident_smem + kResidentHeadBytes;
  T* xs = reinterpret_cast<T*>(wsm + iters * 1024);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  if (threadIdx.x == 0) {
    for (int i = 0; i < TW; ++i) mbar_init(bar + i, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  // A block's 16 channels are one contiguous column block of the fragment
  // order: in shared memory as in global. Warp w copies the units of its runs.
  if (lane == 0) {
    const std::uint8_t* wg = w + static_cast<I64>(blockIdx.x) * iters * 1024;
    mbar_expect_tx(bar + warp, static_cast<unsigned>(runs * U * 1024));
    for (int r = 0; r < runs; ++r) {
      const int at = (r * TW + warp) * U * 1024;
      bulk_copy(wsm + at, wg + at, U * 1024, bar + warp);
    }
  }
  const int n = min(static_cast<int>(blockIdx.x) * 16 + g, N - 1);  // past N: a zero row (the order pads N to 32)
  const int groups = K / G, gshift = __ffs(G) - 1;
  const T* srow[2] = {scale + static_cast<I64>(n) * groups, scale + static_cast<I64>(min(n + 8, N - 1)) * groups};
  const std::int32_t* zrow[2] = {kSigned ? zp : zp + static_cast<I64>(n) * groups,
                                 kSigned ? zp : zp + static_cast<I64>(min(n + 8, N - 1)) * groups};
  GemvFrag<1, 2, false> sc[U];  // the scales (and zero points) of a run, immutable like the weight
  auto load_scales = [&](int base) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int gk = ((base + u) * 128 + t * 32) >> gshift;
#pragma unroll
      for (int sub = 0; sub < 2; ++sub)
        gemv_scale<T, kSigned>(sc[u].s[sub], sc[u].z[sub], srow[sub] + gk, zrow[sub] + (kSigned ? 0 : gk), true);
    }
  };
  load_scales(warp * U);
  prior.wait();
  // x is the kernel before's output: its loads take a zero made after the
  // wait in their addresses (ptxas may hoist ld.global.nc loads across the
  // wait's memory clobber).
  unsigned after_wait;
  asm volatile("mov.u32 %0, 0;" : "=r"(after_wait)::"memory");
  const uint4* xg = reinterpret_cast<const uint4*>(x) + after_wait;
  for (int i = threadIdx.x; i < M * K / 8; i += TW * 32) reinterpret_cast<uint4*>(xs)[i] = __ldg(xg + i);
  __syncthreads();
  const T* xrow = xs + static_cast<I64>(min(g, M - 1)) * K;
  const T* const xunused[1] = {nullptr};  // x is staged: the math reads no global x
  float acc[1][1][4] = {{{0.0f, 0.0f, 0.0f, 0.0f}}};
  mbar_wait(bar + warp, 0);
  for (int run = 0; run < runs; ++run) {
    const int base = (run * TW + warp) * U;
    if (run > 0) load_scales(base);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int it = base + u, k0 = it * 128 + t * 32;
      GemvFrag<1, 2, true> f;
#pragma unroll
      for (int sub = 0; sub < 2; ++sub) f.s[sub] = sc[u].s[sub], f.z[sub] = sc[u].z[sub];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const uint4 v = *reinterpret_cast<const uint4*>(xrow + k0 + 8 * q);
        f.xb[0][2 * q] = make_uint2(v.x, v.y);
        f.xb[0][2 * q + 1] = make_uint2(v.z, v.w);
      }
      uint4 wv[2];
#pragma unroll
      for (int sub = 0; sub < 2; ++sub)
        wv[sub] = *reinterpret_cast<const uint4*>(wsm + it * 1024 + sub * 512 + lane * 16);
      gemv_math_packed<T, kSigned, 1, 2, true, true>(f, wv, acc, k0, true, xunused);
    }
  }
#pragma unroll
  for (int r = 0; r < 4; ++r) part[(warp * 4 + r) * 32 + lane] = acc[0][0][r];
  __syncthreads();
  // As the split-K GEMV: C's element r of lane (g, t) is channel g + 8 (r >> 1)
  // of the tile, row 2t + (r & 1); the warps' partials summed in warp order.
  if (threadIdx.x < 4 * 32) {
    const int r = threadIdx.x >> 5, ln = threadIdx.x & 31;
    const int m = 2 * (ln & 3) + (r & 1);
    const int nn = static_cast<int>(blockIdx.x) * 16 + (ln >> 2) + (r >> 1) * 8;
    if (m < M && nn < N) {
      float v = part[r * 32 + ln];
#pragma unroll
      for (int wq = 1; wq < TW; ++wq) v += part[(wq * 4 + r) * 32 + ln];
      if (bias) v += static_cast<float>(bias[nn]);
      out[static_cast<I64>(m) * N + nn] = T(v);
    }
  }
}
template <class T>
bool w4a16_resident_fits(const W4a16GemvArgs<T>& a) {
  return a.w_fragments && a.scale_in_t && a.M <= kResidentMaxM && a.K == kResidentK && (a.G & (a.G - 1)) == 0;
}
template <class T, bool kSigned>
void launch_w4a16_resident(const W4a16GemvArgs<T>& a) {
  constexpr auto kernel = w4a16_resident_kernel<T, kSigned>;
  allow_dynamic_smem<kernel>(a.device, kResidentSmem);
  ::qgrad::cuda::launch_kernel(a.device, kernel, static_cast<unsigned>((a.N + 15) / 16), 256,
                               static_cast<std::size_t>(kResidentSmem), a.x, a.w, static_cast<const T*>(a.scale), a.zp,
                               a.bias, a.out, a.M, a.N, a.G);
}

// D: iterations whose loads are in flight ahead of the math (of U); the
// f32 math is longer, so its warps keep fewer ahead (H200, M = 1, chain:
// T scales D = 3 5.61 -> 5.56 us a layer against all four at once, f32
// scales D = 2 6.66 -> 6.39; forty-seventh session).
// kFull (K a whole number of the warps' runs, G a power of two): the loads
// and the math without bounds tests, the group index a shift off each
// channel's scale row. Issue-bound as this GEMV is, the instructions that
// saves are time (H200, M = 1, bf16 scales, bit-identical: a layer of the
// chain 5.55 -> 4.87 us, back to back 5.80 -> 5.11, f32 scales 6.41 -> 5.98;
// forty-seventh session).
// kFullOnly: the caller has checked kFull's conditions (no general kernel
// compiled).
template <class T>
bool w4a16_splitk_full(const W4a16GemvArgs<T>& a, int iterations_a_block) {
  return a.K % (128 * iterations_a_block) == 0 && (a.G & (a.G - 1)) == 0;
}
template <class T, bool kSigned, class S, int NC, int TILES, int WARPS, int U, int D, bool kFrag,
          bool kFullOnly = false>
void launch_w4a16_splitk(const W4a16GemvArgs<T>& a) {
  auto go = [&](auto full) {
    ::qgrad::cuda::launch_kernel(
        a.device, w4a16_splitk_kernel<T, kSigned, NC, TILES, WARPS, U, D, S, decltype(full)::value, kFrag>,
        static_cast<unsigned>((a.N + 16 * TILES - 1) / (16 * TILES)), WARPS * 32, 0, a.x, a.w,
        static_cast<const S*>(a.scale), a.zp, a.bias, a.out, a.M, a.N, a.K, a.G,
        /*prefetch_weight=*/a.G >= 128, /*opaque_zero=*/0u);
  };
  if constexpr (kFullOnly) go(std::true_type{});
  else if (w4a16_splitk_full(a, U * WARPS)) go(std::true_type{});
  else go(std::false_type{});
}
// The route's split-K GEMVs: 8 warps a block, runs of 4 iterations, 3 (T
// scales) or 2 (f32) of them in flight. M <= 8: one chunk of x and one m16
// tile a warp (two blocks an SM), two tiles at 4 <= M with kFull shapes (see
// below). 8 < M <= 16 (w4a16_splitk16_fits: kFull
// shapes, K a whole number of the warps' runs, 4096 columns): two 8-row chunks
// of x and two tiles a warp, a block of 32 channels; its 256 threads leave
// room on the SM for the next layer's block, which asks L2 for its weight
// while this one runs (H200, N = K = 4096, groups of 128, M = 16, a layer of
// the captured chain: 16 warps of 2 iterations 6.60 -> 6.35 us with bf16
// scales, f32 scales 9.03 -> 8.39 and 9.33 on the bulk-copy GEMV;
// forty-ninth session).
constexpr int kSplitKWarps = 8, kSplitKRun = 4;
template <class T>
bool w4a16_splitk16_fits(const W4a16GemvArgs<T>& a) {
  return a.M > 8 && a.M <= 16 && w4a16_splitk_full(a, kSplitKRun * kSplitKWarps);
}
template <class T, bool kSigned, class S, bool kFrag>
void launch_w4a16_splitk(const W4a16GemvArgs<T>& a) {
  constexpr int kAhead = std::is_same_v<S, float> ? 2 : 3;
  // 4 <= M <= 8 with kFull shapes: two tiles a warp (128 blocks of 32 channels,
  // room for the next layer's block; the same warps' runs, so the same bits;
  // H200, N = K = 4096, groups of 128, chain, bf16 / f32 scales: M = 8 5.69 ->
  // 5.37 / 8.45 -> 6.40 us, M = 4 5.27 -> 5.21 / 6.82 -> 6.28; slower at M = 1,
  // 2; forty-ninth session).
  const bool full = w4a16_splitk_full(a, kSplitKRun * kSplitKWarps);
  if (a.M <= 8 && a.M >= 4 && full)
    launch_w4a16_splitk<T, kSigned, S, 1, 2, kSplitKWarps, kSplitKRun, kAhead, kFrag, /*kFullOnly=*/true>(a);
  else if (a.M <= 8)
    launch_w4a16_splitk<T, kSigned, S, 1, 1, kSplitKWarps, kSplitKRun, kAhead, kFrag>(a);
  else if constexpr (kFrag) {  // 8 < M <= 16: the fragment order has no other GEMV
    if (full) launch_w4a16_splitk<T, kSigned, S, 2, 2, kSplitKWarps, kSplitKRun, kAhead, kFrag, true>(a);
    else launch_w4a16_splitk<T, kSigned, S, 2, 1, kSplitKWarps, kSplitKRun, kAhead, kFrag>(a);  // one tile: no spills
  }
  else  // w4a16_splitk16_fits
    launch_w4a16_splitk<T, kSigned, S, 2, 2, kSplitKWarps, kSplitKRun, kAhead, kFrag, /*kFullOnly=*/true>(a);
}
template <class T, bool kSigned, class S>
void launch_w4a16_splitk(const W4a16GemvArgs<T>& a) {
  if constexpr (!std::is_same_v<S, float>) {
    if (w4a16_resident_fits(a)) return launch_w4a16_resident<T, kSigned>(a);
  }
  if (a.w_fragments) launch_w4a16_splitk<T, kSigned, S, true>(a);
  else launch_w4a16_splitk<T, kSigned, S, false>(a);
}

// The route at decode sizes (the caller has checked the GEMVs' conditions:
// 16-bit T, 1 <= M <= 64, K and G multiples of 32, 16-byte aligned x and w,
// N and K below 2^30). M <= 8: the split-K GEMV (more warps in flight, no
// producer); 8 < M <= 16 with K a multiple of 4096 and G a power of two: the
// split-K GEMV with two chunks of x and two tiles a warp; otherwise
// 8 < M <= 64: the bulk-copy GEMV with 8 NC rows of x a block (16,
// 32 or 64) and 32 channels (NSUB = 4: x fragments and mma issue shared by
// 32 channels). A weight in the fragment order (M <= 16) always takes the
// split-K GEMV, at 8 < M <= 16 also for other K and G.
template <class T>
void launch_w4a16_decode(const W4a16GemvArgs<T>& a) {
  if (a.M <= 8 || w4a16_splitk16_fits(a) || a.w_fragments) {  // w_fragments: M <= 16 (the caller's check)
    if (a.scale_in_t) {
      a.w_signed ? launch_w4a16_splitk<T, true, T>(a) : launch_w4a16_splitk<T, false, T>(a);
    } else {
      a.w_signed ? launch_w4a16_splitk<T, true, float>(a) : launch_w4a16_splitk<T, false, float>(a);
    }
    return;
  }
  auto go = [&](auto nc) {
    constexpr int kNC = decltype(nc)::value;
    if (a.scale_in_t) {
      a.w_signed ? launch_w4a16_gemv<T, true, kNC, 4, T>(a) : launch_w4a16_gemv<T, false, kNC, 4, T>(a);
    } else {
      a.w_signed ? launch_w4a16_gemv<T, true, kNC, 4, float>(a) : launch_w4a16_gemv<T, false, kNC, 4, float>(a);
    }
  };
  if (a.M <= 16) go(std::integral_constant<int, 2>{});
  else if (a.M <= 32) go(std::integral_constant<int, 4>{});
  else go(std::integral_constant<int, 8>{});
}

}  // namespace

}  // namespace qgrad::kernels::cuda
