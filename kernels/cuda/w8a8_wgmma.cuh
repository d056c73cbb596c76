// The Hopper int8 GEMM with the W8A8 epilogue fused (wgmma fed by TMA),
// declared once: qlinear_sm90a.cu launches the configuration the library
// takes, dev/cuda/w8a8_fused_gemm.cu every configuration that was measured.
// Include only from sources compiled for sm_90a (the *_sm90a.cu files and
// that dev program); the kernel body is empty for any other target.
//
// Shape of the kernel (persistent, one CTA per SM, 384 threads):
//   warpgroup 0, one thread: the producer. For each tile and each 128-column
//     step of K it waits for a free stage, then loads A's 128 x 128 and W's
//     BN x 128 bytes with TMA (128-byte swizzle: the layout wgmma reads
//     without bank conflicts; rows and columns past M, N, K arrive as zeros,
//     so ragged tiles need no masking in the main loop). In a cluster of two
//     CTAs along M, each loads half of the W tile for both (multicast).
//   warpgroups 1 and 2: consumers. Cooperative: both on every tile, rows
//     [64 c, 64 c + 64) each; ping-pong: each a whole tile, alternate tiles,
//     taking turns at the main loop (named barriers), so one's epilogue runs
//     under the other's wgmma. Per stage, wgmma m64nBNk32 (s8 x s8 -> s32,
//     exact; four per 64-row block), committed as one group; once the next
//     stage's group is issued, the previous group is waited for and its stage
//     released (one arrival per warp, on every CTA that wrote it). The tile's
//     end waits for all, then each thread applies the epilogue to its
//     accumulators (ThreadTile: the row and column terms read before the main
//     loop and before any store; per-element checks only on ragged tiles;
//     16-bit outputs converted two at a time in hardware) and stores y
//     directly, or (Config::kTmaStore) stages it in shared memory and stores
//     it by TMA.
//   Split K (Config::kSplitK, cooperative): a tile's steps of K shared by
//   several CTAs, the last to finish adding the others' partial sums
//   (SplitK); the dev program's only (it measured no gain at small M).
// int32 sums are exact, so y is the cuBLASLt path's (and the CPU's) bit for bit.
#pragma once

#include <cuda.h>  // CUtensorMap and its encoder's types (the encoder itself via the runtime)
#include <cudaTypedefs.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <mutex>
#include <type_traits>

#include "qgrad/core/cuda/common.cuh"
#include "qgrad/kernels/cuda/mbarrier.cuh"
#include "qgrad/kernels/cuda/qlinear_out.cuh"

namespace qgrad::kernels::cuda::hopper_w8a8 {

constexpr int kBM = 128;  // tile rows: two consumer warpgroups of 64
constexpr int kBK = 128;  // bytes of K per stage: one 128-byte swizzle row
constexpr int kThreads = 384;
constexpr int kStageBytesA = kBM * kBK;
constexpr int kGroupM = 8;  // tiles run in groups of 8 along M (A rows shared in L2)

// How the two consumer warpgroups share the work.
//   cooperative: both on each tile, rows [64 c, 64 c + 64) each; the tensor
//     cores idle while they apply the epilogue.
//   ping-pong: each a whole 128-row tile, on alternate tiles: one applies its
//     epilogue while the other's wgmma run (the stages arrive in tile order,
//     so their main loops take turns). Twice the accumulators a thread: BN 128.
enum class Schedule { cooperative, ping_pong };

// A kernel configuration: tile width BN (32, 64, 128 or 256), CTAs per cluster along
// M sharing the weight tile by multicast (1 or 2), stages in the ring, the
// consumers' schedule, and whether the kernel counts its waits (kProbe: the
// dev program's, below).
template <int BN_, int kCluster_, int kStages_, Schedule kSchedule_ = Schedule::cooperative, bool kProbe_ = false,
          bool kTmaStore_ = false, bool kSplitK_ = false>
struct Config {
  static constexpr int BN = BN_, kCluster = kCluster_, S = kStages_;
  static constexpr bool kPingPong = kSchedule_ == Schedule::ping_pong;
  static constexpr bool kProbe = kProbe_;
  // kSplitK: a tile's steps of K may be split over several CTAs (SplitK).
  static constexpr bool kSplitK = kSplitK_;
  static_assert(!kSplitK || (!kPingPong && kCluster == 1), "split K: cooperative, no clusters");
  // kTmaStore: the epilogue stages y through shared memory and stores it by
  // TMA (ThreadTile::store_tma), two 8 KiB buffers per consumer.
  static constexpr bool kTmaStore = kTmaStore_;
  static constexpr int kStageBytes = kStageBytesA + BN * kBK;
  static constexpr int kStagingBytes = kTmaStore ? 2 * 2 * 8192 : 0;
  static constexpr std::size_t kSmem =
      static_cast<std::size_t>(S) * kStageBytes + kStagingBytes + 1024 + 2 * S * sizeof(std::uint64_t);
  static_assert(kSmem <= 227 * 1024, "shared memory per block");
  static_assert(!kPingPong || BN == 128, "ping-pong holds two 64 x BN accumulator blocks a thread: BN 128");
};

// Shared-memory matrix descriptor (PTX ISA, "wgmma matrix descriptor") for a
// K-major tile of 128-byte rows, 128-byte swizzle: 8-row atoms 1024 bytes
// apart (the stride byte offset); the leading offset is unused by this layout.
__device__ __forceinline__ std::uint64_t smem_desc(std::uint32_t addr) {
  return static_cast<std::uint64_t>((addr & 0x3FFFF) >> 4) | (std::uint64_t{1} << 16) |
         (std::uint64_t{1024 >> 4} << 32) | (std::uint64_t{1} << 62);
}

__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, int col, int row, std::uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(
          smem_u32(dst)),
      "l"(reinterpret_cast<std::uint64_t>(map)), "r"(col), "r"(row), "r"(smem_u32(bar))
      : "memory");
}
// The box brought into L2 only (no shared memory, no barrier).
__device__ __forceinline__ void tma_prefetch_l2(const CUtensorMap* map, int col, int row) {
  asm volatile("cp.async.bulk.prefetch.tensor.2d.L2.global [%0, {%1, %2}];" ::"l"(reinterpret_cast<std::uint64_t>(map)),
               "r"(col), "r"(row)
               : "memory");
}
// The same box written at dst's offset in every CTA of cta_mask, each
// completing on its own barrier at bar's offset.
__device__ __forceinline__ void tma_load_2d_multicast(void* dst, const CUtensorMap* map, int col, int row,
                                                      std::uint64_t* bar, std::uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%2, "
      "%3}], [%4], %5;" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<std::uint64_t>(map)), "r"(col), "r"(row), "r"(smem_u32(bar)), "h"(cta_mask)
      : "memory");
}
// An arrival on the barrier at bar's offset in cluster CTA `rank`.
__device__ __forceinline__ void mbar_arrive_cluster(std::uint64_t* bar, unsigned rank) {
  asm volatile(
      "{\n\t.reg .b32 remote;\n\tmapa.shared::cluster.u32 remote, %0, %1;\n\tmbarrier.arrive.release.cluster."
      "shared::cluster.b64 _, [remote];\n\t}" ::"r"(smem_u32(bar)),
      "r"(rank)
      : "memory");
}
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
__device__ __forceinline__ unsigned cluster_rank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}

// d (+)= a (64 x 32 from a_desc) * b (32 x 32 from b_desc)^T, s8 in, s32
// accumulate; scale_d = 0 starts d from zero.
__device__ __forceinline__ void wgmma_s8_n32(int (&d)[16], std::uint64_t a_desc, std::uint64_t b_desc, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k32.s32.s8.s8 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
      "}, %16, %17, p;\n}\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]), "+r"(d[8]),
        "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15])
      : "l"(a_desc), "l"(b_desc), "r"(scale_d)
      : "memory");
}

// d (+)= a (64 x 32 from a_desc) * b (64 x 32 from b_desc)^T, s8 in, s32
// accumulate; scale_d = 0 starts d from zero.
__device__ __forceinline__ void wgmma_s8_n64(int (&d)[32], std::uint64_t a_desc, std::uint64_t b_desc, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.s32.s8.s8 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
      "}, %32, %33, p;\n}\n"
      :
        "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]),
        "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]),
        "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]),
        "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31])
      : "l"(a_desc), "l"(b_desc), "r"(scale_d)
      : "memory");
}

// d (+)= a (64 x 32 from a_desc) * b (128 x 32 from b_desc)^T, s8 in, s32
// accumulate; scale_d = 0 starts d from zero.
__device__ __forceinline__ void wgmma_s8_n128(int (&d)[64], std::uint64_t a_desc, std::uint64_t b_desc, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, %64, %65, p;\n}\n"
      :
        "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]),
        "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]),
        "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]),
        "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31]),
        "+r"(d[32]), "+r"(d[33]), "+r"(d[34]), "+r"(d[35]), "+r"(d[36]), "+r"(d[37]), "+r"(d[38]), "+r"(d[39]),
        "+r"(d[40]), "+r"(d[41]), "+r"(d[42]), "+r"(d[43]), "+r"(d[44]), "+r"(d[45]), "+r"(d[46]), "+r"(d[47]),
        "+r"(d[48]), "+r"(d[49]), "+r"(d[50]), "+r"(d[51]), "+r"(d[52]), "+r"(d[53]), "+r"(d[54]), "+r"(d[55]),
        "+r"(d[56]), "+r"(d[57]), "+r"(d[58]), "+r"(d[59]), "+r"(d[60]), "+r"(d[61]), "+r"(d[62]), "+r"(d[63])
      : "l"(a_desc), "l"(b_desc), "r"(scale_d)
      : "memory");
}

// d (+)= a (64 x 32 from a_desc) * b (256 x 32 from b_desc)^T, s8 in, s32
// accumulate; scale_d = 0 starts d from zero.
__device__ __forceinline__ void wgmma_s8_n256(int (&d)[128], std::uint64_t a_desc, std::uint64_t b_desc, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k32.s32.s8.s8 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
      "}, %128, %129, p;\n}\n"
      :
        "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]),
        "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]),
        "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]),
        "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31]),
        "+r"(d[32]), "+r"(d[33]), "+r"(d[34]), "+r"(d[35]), "+r"(d[36]), "+r"(d[37]), "+r"(d[38]), "+r"(d[39]),
        "+r"(d[40]), "+r"(d[41]), "+r"(d[42]), "+r"(d[43]), "+r"(d[44]), "+r"(d[45]), "+r"(d[46]), "+r"(d[47]),
        "+r"(d[48]), "+r"(d[49]), "+r"(d[50]), "+r"(d[51]), "+r"(d[52]), "+r"(d[53]), "+r"(d[54]), "+r"(d[55]),
        "+r"(d[56]), "+r"(d[57]), "+r"(d[58]), "+r"(d[59]), "+r"(d[60]), "+r"(d[61]), "+r"(d[62]), "+r"(d[63]),
        "+r"(d[64]), "+r"(d[65]), "+r"(d[66]), "+r"(d[67]), "+r"(d[68]), "+r"(d[69]), "+r"(d[70]), "+r"(d[71]),
        "+r"(d[72]), "+r"(d[73]), "+r"(d[74]), "+r"(d[75]), "+r"(d[76]), "+r"(d[77]), "+r"(d[78]), "+r"(d[79]),
        "+r"(d[80]), "+r"(d[81]), "+r"(d[82]), "+r"(d[83]), "+r"(d[84]), "+r"(d[85]), "+r"(d[86]), "+r"(d[87]),
        "+r"(d[88]), "+r"(d[89]), "+r"(d[90]), "+r"(d[91]), "+r"(d[92]), "+r"(d[93]), "+r"(d[94]), "+r"(d[95]),
        "+r"(d[96]), "+r"(d[97]), "+r"(d[98]), "+r"(d[99]), "+r"(d[100]), "+r"(d[101]), "+r"(d[102]), "+r"(d[103]),
        "+r"(d[104]), "+r"(d[105]), "+r"(d[106]), "+r"(d[107]), "+r"(d[108]), "+r"(d[109]), "+r"(d[110]), "+r"(d[111]),
        "+r"(d[112]), "+r"(d[113]), "+r"(d[114]), "+r"(d[115]), "+r"(d[116]), "+r"(d[117]), "+r"(d[118]), "+r"(d[119]),
        "+r"(d[120]), "+r"(d[121]), "+r"(d[122]), "+r"(d[123]), "+r"(d[124]), "+r"(d[125]), "+r"(d[126]), "+r"(d[127])
      : "l"(a_desc), "l"(b_desc), "r"(scale_d)
      : "memory");
}

template <int BN>
__device__ __forceinline__ void wgmma_s8(int (&d)[BN / 2], std::uint64_t a_desc, std::uint64_t b_desc, int scale_d) {
  if constexpr (BN == 256) wgmma_s8_n256(d, a_desc, b_desc, scale_d);
  else if constexpr (BN == 128) wgmma_s8_n128(d, a_desc, b_desc, scale_d);
  else if constexpr (BN == 64) wgmma_s8_n64(d, a_desc, b_desc, scale_d);
  else {
    static_assert(BN == 32, "tile widths: 32, 64, 128, 256");
    wgmma_s8_n32(d, a_desc, b_desc, scale_d);
  }
}

template <int BN>
__device__ __forceinline__ void fence_accumulators(int (&d)[BN / 2]) {
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) asm volatile("" : "+r"(d[i])::"memory");
}

// Per-CTA cycle counts of a kProbe configuration (dev/cuda/w8a8_fused_gemm.cu
// splits a step of K into waiting for data, waiting for the tensor cores and
// the epilogue): the producer thread's and the first consumer thread's.
enum ProbeSlot : int {
  kProducerWait,   // producer: waiting for a free stage
  kProducerTotal,  // producer: from its first wait to its last copy issued
  kFullWait,       // consumer: waiting for a stage's data
  kGroupWait,      // consumer: waiting for the previous wgmma group
  kEpilogue,       // consumer: applying the formula and storing
  kConsumerTotal,  // consumer: from its first wait to its last store
  // The first consumer thread's global times (ns, %globaltimer: one clock
  // for all SMs, so the CTAs' spans compare with each other and with the
  // kernel's): past the kernel's wait for the kernel before it, its first
  // stage's data in, its last wgmma group done, its last store issued.
  kEntryNs,
  kFirstDataNs,
  kMainLoopEndNs,
  kExitNs,
  kProbeSlots = 12
};
template <bool kOn>
__device__ __forceinline__ long long probe_clock() {
  if constexpr (kOn) return clock64();
  else return 0;
}
template <bool kOn>
__device__ __forceinline__ unsigned long long probe_ns() {
  unsigned long long t = 0;
  if constexpr (kOn) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Two 16-bit outputs packed lo | hi << 16, converted in hardware (cvt.rn,
// round to nearest even, two values an instruction): equal to their encoders
// (core/half.h) for every value the epilogue produces. For non-NaN values
// the conversion and the encoders round alike (subnormal results and
// overflow to infinity included). A NaN output is the result of f32
// arithmetic (the product by sa * sw, the bias add), and the GPU's f32
// arithmetic returns one NaN, 0x7FFFFFFF, whatever NaN went in; the encoders
// take it to 0x7FFF, as the conversion takes every NaN (tests/test_qlinear.cpp
// checks NaN outputs on every kernel path). No per-pair NaN branch, then: an
// epilogue runs once a tile, so its code is fetched cold, and with that
// branch (the encoders inline behind it) the executed instructions lay spread
// over four times their size; at M = 128 instruction-fetch stalls took 35% of
// the kernel's warp samples (ncu, docs/benchmarks.md, thirty-first session).
template <class T>
constexpr bool is_16bit_v = std::is_same_v<T, bfloat16> || std::is_same_v<T, half>;
template <class T>
__device__ __forceinline__ std::uint32_t pack_two(float v0, float v1) {
  static_assert(is_16bit_v<T>);
  std::uint32_t r;
  if constexpr (std::is_same_v<T, bfloat16>) asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(v1), "f"(v0));
  else asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(v1), "f"(v0));
  return r;
}

// Two outputs stored as one 2-element access, to global memory ...
template <class T, class Mt>
__device__ __forceinline__ void store_two(T* p, Mt v0, Mt v1) {
  if constexpr (is_16bit_v<T>) {
    *reinterpret_cast<std::uint32_t*>(p) = pack_two<T>(v0, v1);
  } else {
    struct alignas(2 * sizeof(T)) Two {
      T a, b;
    };
    *reinterpret_cast<Two*>(p) = Two{T(v0), T(v1)};
  }
}
// ... or to shared memory (addr: a shared-window address).
template <class T, class Mt>
__device__ __forceinline__ void st_shared_two(std::uint32_t addr, Mt v0, Mt v1) {
  if constexpr (is_16bit_v<T>)
    asm volatile("st.shared.b32 [%0], %1;" ::"r"(addr), "r"(pack_two<T>(v0, v1)) : "memory");
  else if constexpr (std::is_same_v<T, float>)
    asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(addr), "f"(v0), "f"(v1) : "memory");
  else
    asm volatile("st.shared.v2.f64 [%0], {%1, %2};" ::"r"(addr), "d"(v0), "d"(v1) : "memory");
}

// A box of shared memory stored to the global tensor `map` at (col, row)
// (elements past its extent are not written), as one bulk group.
__device__ __forceinline__ void tma_store_2d(const CUtensorMap* map, std::uint32_t src, int col, int row) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];" ::"l"(
                   reinterpret_cast<std::uint64_t>(map)),
               "r"(col), "r"(row), "r"(src)
               : "memory");
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}

// Named barriers (ids 1 and up; 0 is __syncthreads'): sync waits for
// `threads` arrivals in all, counting its own warps'.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// A consumer thread's share of a tile's outputs: kBlocks blocks of 64 rows
// (block b: rows m0 + 64 b and + 8), column pairs n0 + 8 j (+ 1); accumulator
// 4 j + 2 h (+ 1) of a block is its row + 8 h, column pair j.
template <class T, int BN, int kBlocks, int kChunk>
struct ThreadTile {
  using Out = QLinearOut<T>;
  std::int64_t m0;
  int n0;
  typename Out::Row rows[kBlocks][2];
  typename Out::Col cols[kChunk][2];

  __device__ void read_rows(const Out& ep, int M) {
#pragma unroll
    for (int b = 0; b < kBlocks; ++b)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const std::int64_t m = m0 + 64 * b + 8 * h;
        rows[b][h] = m < M ? ep.row(m) : typename Out::Row{};
      }
  }
  __device__ void read_cols(const Out& ep, int N, int j0) {
#pragma unroll
    for (int j = 0; j < kChunk; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int n = n0 + 8 * (j0 + j) + e;
        cols[j][e] = n < N ? ep.col(n) : typename Out::Col{};
      }
  }
  // kFull: every row and column in range and pair stores aligned, so nothing
  // is checked per element. Column chunk 0 is read by the caller (before the
  // tile's main loop); each later chunk's reads precede all of its stores.
  template <bool kZeroPoint, bool kFull>
  __device__ void store(const Out& ep, const int (&acc)[kBlocks][BN / 2], int M, int N, bool pair_stores) {
#pragma unroll
    for (int j0 = 0; j0 < BN / 8; j0 += kChunk) {
      if (j0 > 0) read_cols(ep, N, j0);
#pragma unroll
      for (int b = 0; b < kBlocks; ++b)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const std::int64_t m = m0 + 64 * b + 8 * h;
          if (!kFull && m >= M) continue;
          T* orow = ep.out + m * N;
#pragma unroll
          for (int j = 0; j < kChunk; ++j) {
            const int n = n0 + 8 * (j0 + j);
            const int a = 4 * (j0 + j) + 2 * h;
            const auto v0 = ep.template value<kZeroPoint>(rows[b][h], cols[j][0], acc[b][a]);
            const auto v1 = ep.template value<kZeroPoint>(rows[b][h], cols[j][1], acc[b][a + 1]);
            if (kFull || (pair_stores && n + 1 < N)) {
              store_two(orow + n, v0, v1);
            } else {
              if (n < N) orow[n] = T(v0);
              if (n + 1 < N) orow[n + 1] = T(v1);
            }
          }
        }
    }
  }
  // store() in the form the tile takes: with or without zero points, full
  // or ragged.
  __device__ __forceinline__ void store_direct(const Out& ep, const int (&acc)[kBlocks][BN / 2], int M, int N,
                                               bool pair_stores, bool full_tile) {
    if (ep.za) {
      if (full_tile) store<true, true>(ep, acc, M, N, pair_stores);
      else store<true, false>(ep, acc, M, N, pair_stores);
    } else {
      if (full_tile) store<false, true>(ep, acc, M, N, pair_stores);
      else store<false, false>(ep, acc, M, N, pair_stores);
    }
  }
  // Through shared memory and TMA: each 64-row block in boxes of 64 rows x
  // 128 bytes (kBoxCols outputs), written in the 128-byte swizzle out_map
  // names (conflict-free: a warp's 8 rows land in 8 different 16-byte chunks)
  // into one of this consumer's two 8 KiB buffers, then stored by its leader
  // thread; the TMA unit drops rows and columns past M and N, so ragged
  // tiles need no checks. A buffer is rewritten once the store from it two
  // boxes back has read it (a tile's box count is even, so this holds across
  // tiles too). Column chunk 0 is read by the caller, as for store().
  template <bool kZeroPoint>
  __device__ void store_tma(const Out& ep, const int (&acc)[kBlocks][BN / 2], int N, std::uint32_t staging,
                            const CUtensorMap* out_map, int block_row0, int tile_col0, int bar_id, bool leader) {
    constexpr int kBoxCols = 128 / static_cast<int>(sizeof(T));
    constexpr int kBoxJ = kBoxCols / 8;  // column pairs j (8 columns each) a box covers
    static_assert(kChunk % kBoxJ == 0 && (BN / kBoxCols * kBlocks) % 2 == 0);
    const int lane = threadIdx.x % 32, warp = (threadIdx.x / 32) % 4;
#pragma unroll
    for (int j0 = 0; j0 < BN / 8; j0 += kChunk) {
      if (j0 > 0) read_cols(ep, N, j0);
#pragma unroll
      for (int jb = 0; jb < kChunk; jb += kBoxJ)
#pragma unroll
        for (int b = 0; b < kBlocks; ++b) {
          const int box = (j0 + jb) / kBoxJ * kBlocks + b;
          const std::uint32_t buf = staging + (box % 2) * 8192;
          if (leader) asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");
          named_barrier_sync(bar_id, 128);
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int row = warp * 16 + lane / 4 + 8 * h;  // in the box
#pragma unroll
            for (int jj = 0; jj < kBoxJ; ++jj) {
              const int a = 4 * (j0 + jb + jj) + 2 * h;
              const auto v0 = ep.template value<kZeroPoint>(rows[b][h], cols[jb + jj][0], acc[b][a]);
              const auto v1 = ep.template value<kZeroPoint>(rows[b][h], cols[jb + jj][1], acc[b][a + 1]);
              const int byte = (8 * jj + 2 * (lane % 4)) * static_cast<int>(sizeof(T));
              st_shared_two<T>(buf + row * 128 + (((byte >> 4) ^ (row & 7)) << 4) + (byte & 15), v0, v1);
            }
          }
          asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // the writes, to the TMA unit
          named_barrier_sync(bar_id, 128);
          if (leader) tma_store_2d(out_map, buf, tile_col0 + 8 * (j0 + jb), block_row0 + 64 * b);
        }
    }
  }
};

// Split K (Config::kSplitK): each tile's steps of K in `splits` nearly equal
// ranges, one work unit each, taken by different CTAs at once. A unit writes
// its int32 partial tile to `partials` ([tile][split][int4 e][consumer
// thread], 128 x BN int32 a unit) and counts itself in semaphores[tile]; the
// unit that counts last adds the others' partials to its own accumulators
// (exact: int32 sums) and applies the epilogue, then sets the semaphore back
// to zero. Nothing waits on another CTA, so any number of units can run.
// semaphores: zero before the first launch (each launch leaves them zero).
struct SplitK {
  int splits = 1;
  int* partials = nullptr;
  int* semaphores = nullptr;
};

// One unit's end (SplitK), by the 256 consumer threads (t: 0 ... 255): its
// partial sums out, its count in; true, with the tile's whole sums in acc,
// for the unit that counted last.
template <int BN>
__device__ __forceinline__ bool split_k_reduce(int (&acc)[BN / 2], const SplitK& sk, int tile, int part, int splits,
                                               int t, int& last_flag) {
  constexpr int kVecs = BN / 8;  // int4 a thread
  auto slot = [&](int of) {  // unit `of`'s partials, this thread's first int4
    return reinterpret_cast<int4*>(sk.partials) + (static_cast<std::int64_t>(tile) * splits + of) * kVecs * 256 + t;
  };
  int4* mine = slot(part);
#pragma unroll
  for (int e = 0; e < kVecs; ++e) mine[e * 256] = make_int4(acc[4 * e], acc[4 * e + 1], acc[4 * e + 2], acc[4 * e + 3]);
  __threadfence();  // this thread's partials, device-wide before the count
  named_barrier_sync(5, 256);
  if (t == 0) last_flag = atomicAdd(sk.semaphores + tile, 1) == splits - 1;
  named_barrier_sync(5, 256);
  if (!last_flag) return false;
  __threadfence();  // the other units' partials, as they were before their counts
  for (int other = 0; other < splits; ++other) {
    if (other == part) continue;
    const int4* theirs = slot(other);
#pragma unroll
    for (int e = 0; e < kVecs; ++e) {
      const int4 v = __ldcg(theirs + e * 256);  // from L2: another SM wrote it
      acc[4 * e] += v.x;
      acc[4 * e + 1] += v.y;
      acc[4 * e + 2] += v.z;
      acc[4 * e + 3] += v.w;
    }
  }
  if (t == 0) sk.semaphores[tile] = 0;  // for the next launch
  return true;
}

// What of the weight the kernel loads before waiting for the grid before it
// (DeferredPriorWait): only where the launcher knows that grid does not
// write w (quantized_linear's own activation quantization; never a padding
// copy of w). Clusterless configurations without split K; a CTA's first
// tile only.
//   stages: its first S stages of W into shared memory;
//   l2: the rest of its W rows over all of K into L2 (where they fit with
//     room to spare: the launcher decides).
// The weight's bytes then stream from HBM while the activations are being
// quantized; the A loads wait as before.
struct EarlyWeight {
  bool stages = false;
  bool l2 = false;
};

struct TileGrid {
  int tiles_m, tiles_n;
  // Tile t's coordinates: groups of kGroupM tiles along M, N-major inside a
  // group, so the CTAs running at once share A's rows and W's rows in L2.
  __device__ void coords(int t, int& tm, int& tn) const {
    const int per_group = kGroupM * tiles_n;
    const int first_m = (t / per_group) * kGroupM;
    const int rows = min(tiles_m - first_m, kGroupM);
    const int in_group = t % per_group;
    tm = first_m + in_group % rows;
    tn = in_group / rows;
  }
};

template <class T, class C>
__global__ void __launch_bounds__(kThreads, 1)
    w8a8_wgmma_kernel(const __grid_constant__ CUtensorMap a_map, const __grid_constant__ CUtensorMap w_map,
                      const __grid_constant__ CUtensorMap out_map, int M, int N, int K, TileGrid grid, bool pair_stores,
                      bool tma_store, SplitK split_k, EarlyWeight early, QLinearOut<T> ep,
                      unsigned long long* __restrict__ probe) {
  // Until the wait: shared memory, the parameters and (early) the weight.
  const ::qgrad::cuda::DeferredPriorWait prior;
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int BN = C::BN, S = C::S, kCluster = C::kCluster;
  constexpr int kStageBytes = C::kStageBytes;
  constexpr int kPartW = BN / kCluster * kBK;  // the weight rows each CTA of a cluster loads for all
  extern __shared__ unsigned char smem_raw[];
  __shared__ int split_last;  // C::kSplitK: whether this unit counted last
  // 128-byte swizzled tiles want 1024-byte aligned stages (the same offset in both CTAs).
  unsigned char* smem = reinterpret_cast<unsigned char*>((reinterpret_cast<std::uintptr_t>(smem_raw) + 1023) &
                                                         ~std::uintptr_t{1023});
  const std::uint32_t staging = smem_u32(smem + S * kStageBytes);  // C::kTmaStore: 16 KiB per consumer
  std::uint64_t* full = reinterpret_cast<std::uint64_t*>(smem + S * kStageBytes + C::kStagingBytes);
  std::uint64_t* empty = full + S;
  const int warpgroup = threadIdx.x / 128;
  const unsigned rank = kCluster > 1 ? cluster_rank() : 0, peer = rank ^ 1;
  if (threadIdx.x == 0) {
    for (int s = 0; s < S; ++s) {
      mbar_init(full + s, 1);
      // One arrival per consumer warp reading the stage, of each CTA it is written for.
      mbar_init(empty + s, (C::kPingPong ? 4 : 8) * kCluster);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<std::uint64_t>(&a_map)) : "memory");
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<std::uint64_t>(&w_map)) : "memory");
  }
  if constexpr (kCluster > 1) cluster_sync();  // the peer's barriers exist before anything is sent to them
  else __syncthreads();
  // The early weight loads of this CTA's first unit (its cluster index, split K absent).
  constexpr bool kEarly = kCluster == 1 && !C::kSplitK;
  int early_stages = 0;
  if (kEarly && early.stages && static_cast<int>(blockIdx.x) < grid.tiles_m * grid.tiles_n) {
    const int ksteps = (K + kBK - 1) / kBK;
    early_stages = min(S, ksteps);
    if (threadIdx.x == 0) {
      int tm, tn;
      grid.coords(static_cast<int>(blockIdx.x), tm, tn);
      for (int ks = 0; ks < early_stages; ++ks) {
        mbar_expect_tx(full + ks, kStageBytes);  // A's bytes too: its load joins the same phase below
        tma_load_2d(smem + ks * kStageBytes + kStageBytesA, &w_map, ks * kBK, tn * BN, full + ks);
      }
      if (early.l2)
        for (int ks = early_stages; ks < ksteps; ++ks) tma_prefetch_l2(&w_map, ks * kBK, tn * BN);
    }
  }
  prior.wait();
  [[maybe_unused]] const unsigned long long entry_ns = probe_ns<C::kProbe>();
  // A cluster's CTAs walk the same cluster tiles: cluster tile p is M's
  // 128-row tile kCluster * (p's row) + rank, columns tn (a tile past M
  // loads zeros and stores nothing).
  const int cluster_tiles = grid.tiles_m * grid.tiles_n;
  const int cluster = blockIdx.x / kCluster, clusters = gridDim.x / kCluster;
  const int ksteps = (K + kBK - 1) / kBK;
  auto tile_of = [&](int p, int& tm, int& tn) {
    grid.coords(p, tm, tn);
    tm = kCluster * tm + static_cast<int>(rank);
  };
  // Work unit u: cluster tile u / splits, its steps of K [k_begin, k_end).
  const int splits = C::kSplitK ? split_k.splits : 1;
  const int units = cluster_tiles * splits;
  auto k_range = [&](int u, int& k_begin, int& k_end) {
    const int part = u % splits;
    k_begin = static_cast<int>(static_cast<long long>(ksteps) * part / splits);
    k_end = static_cast<int>(static_cast<long long>(ksteps) * (part + 1) / splits);
  };
  if (warpgroup == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;" ::: "memory");
    if (threadIdx.x == 0) {
      long long waited = 0;
      const long long start = probe_clock<C::kProbe>();
      int it = 0;
      for (int u = cluster; u < units; u += clusters) {
        int tm, tn, k_begin, k_end;
        tile_of(u / splits, tm, tn);
        k_range(u, k_begin, k_end);
        for (int ks = k_begin; ks < k_end; ++ks, ++it) {
          const int s = it % S;
          unsigned char* stage = smem + s * kStageBytes;
          if (it < early_stages) {  // W's part already on its way, the barrier expecting both
            tma_load_2d(stage, &a_map, ks * kBK, tm * kBM, full + s);
            continue;
          }
          const long long t = probe_clock<C::kProbe>();
          mbar_wait(empty + s, ((it / S) & 1) ^ 1);
          waited += probe_clock<C::kProbe>() - t;
          mbar_expect_tx(full + s, kStageBytes);
          tma_load_2d(stage, &a_map, ks * kBK, tm * kBM, full + s);
          if constexpr (kCluster > 1)
            tma_load_2d_multicast(stage + kStageBytesA + rank * kPartW, &w_map, ks * kBK,
                                  tn * BN + static_cast<int>(rank) * (BN / kCluster), full + s, (1u << kCluster) - 1);
          else
            tma_load_2d(stage + kStageBytesA, &w_map, ks * kBK, tn * BN, full + s);
        }
      }
      if constexpr (C::kProbe) {
        probe[blockIdx.x * kProbeSlots + kProducerWait] = static_cast<unsigned long long>(waited);
        probe[blockIdx.x * kProbeSlots + kProducerTotal] = static_cast<unsigned long long>(clock64() - start);
      }
    }
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;" ::: "memory");
    const int consumer = warpgroup - 1;
    const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
    const std::uint32_t smem_base = smem_u32(smem);
    // Cooperative: one 64-row block of each tile (this consumer's half);
    // ping-pong: both blocks of every other tile.
    constexpr int kBlocks = C::kPingPong ? 2 : 1;
    constexpr int kTileStep = C::kPingPong ? 2 : 1;
    // Column pairs whose terms one batch of reads covers: all of them (read
    // before the main loop) where the registers allow.
    constexpr int kChunk = std::min(
        BN / 8, (BN == 128 && !C::kPingPong ? 16 : 8) * 4 / static_cast<int>(sizeof(typename QLinearOut<T>::Mt)));
    ThreadTile<T, BN, kBlocks, kChunk> out;
    int acc[kBlocks][BN / 2];
    auto release = [&](int s) {
      if (lane == 0) {
        mbar_arrive(empty + s);
        if constexpr (kCluster > 1) mbar_arrive_cluster(empty + s, peer);
      }
    };
    long long full_wait = 0, group_wait = 0, epilogue = 0;
    [[maybe_unused]] unsigned long long first_data_ns = 0, main_end_ns = 0;
    const long long start = probe_clock<C::kProbe>();
    // Tile L of this CTA (its L-th, in the producer's order) fills stages
    // L * ksteps ... of the ring.
    int it_next = 0;  // cooperative: the ring position of the unit's first step
    for (int L = C::kPingPong ? consumer : 0;; L += kTileStep) {
      const int u = cluster + L * clusters;
      if (u >= units) break;
      const int p = u / splits;
      int tm, tn, k_begin, k_end;
      tile_of(p, tm, tn);
      k_range(u, k_begin, k_end);
      // The tile's row and column terms are read now, while its sums
      // accumulate, and before any store (see QLinearOut): read between
      // stores, each waited its latency out in turn.
      out.m0 = static_cast<std::int64_t>(tm) * kBM + (C::kPingPong ? 0 : 64 * consumer) + warp * 16 + lane / 4;
      out.n0 = tn * BN + (lane % 4) * 2;
      out.read_rows(ep, M);
      out.read_cols(ep, N, 0);
      // Ping-pong: tile L's main loop waits for the other consumer's tile
      // L - 1 main loop to have taken all its stages. A stage's full barrier
      // is waited on by parity, which tells apart only adjacent phases: run
      // ahead, this consumer would take a phase two behind for its own.
      if (C::kPingPong && L > 0) named_barrier_sync(1 + consumer, 256);
      int prev = -1;
      const int it_first = C::kPingPong ? L * ksteps : it_next;
      it_next = it_first + (k_end - k_begin);
      if (k_begin == k_end) {  // a split with no step of K (fewer steps than splits)
#pragma unroll
        for (int b = 0; b < kBlocks; ++b)
#pragma unroll
          for (int i = 0; i < BN / 2; ++i) acc[b][i] = 0;
      }
      for (int ks = k_begin, it = it_first; ks < k_end; ++ks, ++it) {
        const int s = it % S;
        long long t = probe_clock<C::kProbe>();
        mbar_wait(full + s, (it / S) & 1);
        full_wait += probe_clock<C::kProbe>() - t;
        if (C::kProbe && first_data_ns == 0) first_data_ns = probe_ns<C::kProbe>();
        const std::uint32_t a_addr = smem_base + s * kStageBytes + (C::kPingPong ? 0 : consumer * 64 * kBK);
        const std::uint32_t w_addr = smem_base + s * kStageBytes + kStageBytesA;
#pragma unroll
        for (int b = 0; b < kBlocks; ++b) fence_accumulators<BN>(acc[b]);
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
        for (int kk = 0; kk < kBK / 32; ++kk)
#pragma unroll
          for (int b = 0; b < kBlocks; ++b)
            wgmma_s8<BN>(acc[b], smem_desc(a_addr + b * 64 * kBK + kk * 32), smem_desc(w_addr + kk * 32),
                         ks > k_begin || kk > 0);
        asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
        t = probe_clock<C::kProbe>();
        asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
#pragma unroll
        for (int b = 0; b < kBlocks; ++b) fence_accumulators<BN>(acc[b]);
        group_wait += probe_clock<C::kProbe>() - t;
        if (prev >= 0) release(prev);
        prev = s;
      }
      if (C::kPingPong && u + clusters < units) named_barrier_arrive(2 - consumer, 256);  // the other's turn
      long long t = probe_clock<C::kProbe>();
      asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
#pragma unroll
      for (int b = 0; b < kBlocks; ++b) fence_accumulators<BN>(acc[b]);
      group_wait += probe_clock<C::kProbe>() - t;
      main_end_ns = probe_ns<C::kProbe>();
      if (prev >= 0) release(prev);
      t = probe_clock<C::kProbe>();
      if constexpr (C::kSplitK) {
        if (splits > 1 && !split_k_reduce<BN>(acc[0], split_k, p, u % splits, splits, threadIdx.x - 128, split_last)) {
          epilogue += probe_clock<C::kProbe>() - t;
          continue;  // another unit of this tile applies the epilogue
        }
      }
      const bool full_tile = (tm + 1) * kBM <= M && (tn + 1) * BN <= N && pair_stores;
      if constexpr (C::kTmaStore) {  // instantiated only there (its boxes need a BN of two 128-byte rows at least)
        if (tma_store) {
          const int block_row0 = tm * kBM + (C::kPingPong ? 0 : 64 * consumer);
          const std::uint32_t mine = staging + consumer * 16384;
          const bool leader = threadIdx.x % 128 == 0;
          if (ep.za)
            out.template store_tma<true>(ep, acc, N, mine, &out_map, block_row0, tn * BN, 3 + consumer, leader);
          else
            out.template store_tma<false>(ep, acc, N, mine, &out_map, block_row0, tn * BN, 3 + consumer, leader);
        } else {
          out.store_direct(ep, acc, M, N, pair_stores, full_tile);
        }
      } else {
        out.store_direct(ep, acc, M, N, pair_stores, full_tile);
      }
      epilogue += probe_clock<C::kProbe>() - t;
    }
    // The last stores still read shared memory and write y: the CTA stays
    // until they are done.
    if (C::kTmaStore && tma_store && threadIdx.x % 128 == 0) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
    if constexpr (C::kProbe) {
      if (threadIdx.x == 128) {
        unsigned long long* slot = probe + blockIdx.x * kProbeSlots;
        slot[kFullWait] = static_cast<unsigned long long>(full_wait);
        slot[kGroupWait] = static_cast<unsigned long long>(group_wait);
        slot[kEpilogue] = static_cast<unsigned long long>(epilogue);
        slot[kConsumerTotal] = static_cast<unsigned long long>(clock64() - start);
        slot[kEntryNs] = entry_ns;
        slot[kFirstDataNs] = first_data_ns;
        slot[kMainLoopEndNs] = main_end_ns;
        slot[kExitNs] = probe_ns<true>();
      }
    }
  }
  // Neither CTA leaves while the other may still write its stages or barriers.
  if constexpr (kCluster > 1) {
    __syncwarp();
    cluster_sync();
  }
#else
  prior.wait();
  (void)a_map, (void)w_map, (void)out_map, (void)M, (void)N, (void)K, (void)grid, (void)pair_stores, (void)tma_store,
      (void)split_k, (void)early, (void)ep, (void)probe;
#endif
}

inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      p = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

// s8 [rows, ld] (K columns used), boxes of box_rows x 128 bytes, 128-byte swizzle.
inline bool encode(CUtensorMap& map, const std::int8_t* p, std::int64_t rows, std::int64_t ld, std::int64_t K, int box_rows) {
  const auto fn = tensor_map_encoder();
  if (!fn) return false;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(K), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(ld)};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(kBK), static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t elem[2] = {1, 1};
  return fn(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<std::int8_t*>(p), dims, strides, box, elem,
            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}


// y [M, N] of T in boxes of 64 rows x 128 bytes, 128-byte swizzle (the TMA
// store's map); false where TMA cannot take it (rows not a multiple of 16
// bytes, y not 16-byte aligned).
template <class T>
bool encode_out(CUtensorMap& map, T* y, std::int64_t M, std::int64_t N) {
  const auto fn = tensor_map_encoder();
  if (!fn || (N * static_cast<std::int64_t>(sizeof(T))) % 16 != 0 || reinterpret_cast<std::uintptr_t>(y) % 16 != 0)
    return false;
  CUtensorMapDataType type = CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
  if constexpr (std::is_same_v<T, bfloat16>) type = CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  else if constexpr (std::is_same_v<T, half>) type = CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  else if constexpr (std::is_same_v<T, double>) type = CU_TENSOR_MAP_DATA_TYPE_FLOAT64;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(N), static_cast<cuuint64_t>(M)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(N) * sizeof(T)};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(128 / sizeof(T)), 64};
  const cuuint32_t elem[2] = {1, 1};
  return fn(&map, type, 2, y, dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
            CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

template <class T, class C>
bool launch(int device, const std::int8_t* a, std::int64_t lda, const std::int8_t* w, std::int64_t ldw, std::int64_t M,
            std::int64_t N, std::int64_t K, const QLinearOut<T>& ep, EarlyWeight early = {},
            unsigned long long* probe = nullptr, SplitK split_k = {}) {
  constexpr auto kernel = w8a8_wgmma_kernel<T, C>;
  if (!C::kSplitK) split_k = SplitK{};
  CUtensorMap a_map, w_map, out_map{};
  // The weight map's box is a cluster's share of a tile: each CTA loads it for all.
  if (!encode(a_map, a, M, lda, K, kBM) || !encode(w_map, w, N, ldw, K, C::BN / C::kCluster)) return false;
  const bool tma_store = C::kTmaStore && encode_out(out_map, ep.out, M, N);
  const TileGrid grid{static_cast<int>((M + C::kCluster * kBM - 1) / (C::kCluster * kBM)),
                      static_cast<int>((N + C::BN - 1) / C::BN)};
  const bool pair = N % 2 == 0 && reinterpret_cast<std::uintptr_t>(ep.out) % (2 * sizeof(T)) == 0;
  cudaLaunchAttribute attribute[2];
  attribute[0].id = cudaLaunchAttributeClusterDimension;
  attribute[0].val.clusterDim.x = C::kCluster;
  attribute[0].val.clusterDim.y = 1;
  attribute[0].val.clusterDim.z = 1;
  attribute[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[1].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.blockDim = kThreads;
  config.dynamicSmemBytes = C::kSmem;
  config.stream = ::qgrad::cuda::stream(device);
  config.attrs = attribute;
  config.numAttrs = ::qgrad::cuda::programmatic_launch(device) ? 2 : 1;
  // Once per device: the opt-in to more than 48 KiB of shared memory, and how
  // many clusters fit at once (a GPC with an odd count of free SMs leaves one
  // idle under pairs).
  static std::array<std::once_flag, 64> once;
  static std::array<int, 64> resident{};
  std::call_once(once[static_cast<std::size_t>(device)], [&] {
    ::qgrad::cuda::DeviceGuard guard(device);
    QGRAD_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(C::kSmem)));
    cudaLaunchConfig_t trial = config;
    trial.gridDim = static_cast<unsigned>(C::kCluster * ::qgrad::cuda::multiprocessor_count(device));
    trial.numAttrs = 1;
    int clusters = 0;
    QGRAD_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, kernel, &trial));
    resident[static_cast<std::size_t>(device)] = std::max(clusters, 1);
  });
  config.gridDim = static_cast<unsigned>(
      C::kCluster * std::min(grid.tiles_m * grid.tiles_n * split_k.splits, resident[static_cast<std::size_t>(device)]));
  QGRAD_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, a_map, w_map, out_map, static_cast<int>(M), static_cast<int>(N),
                                      static_cast<int>(K), grid, pair, tma_store, split_k, early, ep, probe));
  return true;
}

}  // namespace qgrad::kernels::cuda::hopper_w8a8
