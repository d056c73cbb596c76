// Shared-memory mbarriers and asynchronous copies into shared memory (PTX ISA,
// "mbarrier", "cp.async.bulk", "cp.async.bulk.tensor"), for the kernels whose
// producer streams operand stages to consumer warps: lowbit_linear.cu's W4A16
// GEMV (bulk copies of rows) and qlinear_sm90a.cu's W8A8 GEMM (TMA tiles);
// and the per-thread copies ("cp.async") of qat_mlp.cu's operand stages.
// A stage completes on its barrier once the arrivals counted at init and the
// bytes announced by expect_tx have all landed.
#pragma once

#include <cstdint>

namespace qgrad::kernels::cuda {

__device__ __forceinline__ std::uint32_t smem_u32(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(std::uint64_t* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(std::uint64_t* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(std::uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}
__device__ __forceinline__ void mbar_wait(std::uint64_t* bar, unsigned parity) {
  const std::uint32_t a = smem_u32(bar);
  std::uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\tselp.u32 %0, 1, 0, p;\n\t}"
        : "=r"(done)
        : "r"(a), "r"(parity)
        : "memory");
  }
}
// bytes (a multiple of 16) from global src (16-byte aligned) to shared dst
// (16-byte aligned), counted on bar's transaction count.
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, unsigned bytes, std::uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   smem_u32(dst)),
               "l"(src), "r"(bytes), "r"(smem_u32(bar))
               : "memory");
}

// Asks L2 for `bytes` (a multiple of 16) at a 16-byte aligned global
// address, returning nothing to the SM. L2 is where the GPU's memory is
// coherent, so this may run before the kernel's wait for the grid before it
// even when that grid writes the bytes: a line it writes later is updated in
// L2, and the loads made after the wait read the current bytes.
__device__ __forceinline__ void bulk_prefetch_l2(const void* src, unsigned bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(bytes) : "memory");
}

// Per-thread asynchronous copies (cp.async): `bytes` of the copy's size read
// from src, the rest of dst zero-filled (bytes = 0: src is not read); they
// land once this thread's cp_async_wait_all (which commits them) returns.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int bytes) {  // both 16-byte aligned
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_u32(dst)), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_async4(void* dst, const void* src, int bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(smem_u32(dst)), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_all;" ::: "memory");
}

}  // namespace qgrad::kernels::cuda
