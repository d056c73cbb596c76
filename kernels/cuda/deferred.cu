// The deferred gradient passes of one device and dtype (kernels/deferred.h)
// in one launch: a table of up to kDeferredBatchMax passes by value, each
// owning a run of 32 x 32 blocks. A column-sum finish's block is
// column_sum_kernel's block over ChunkSumsFinish (column_sum.cuh): the same
// operations in the same order, so the same bits as the finish launched on
// its own. A mask pass's block writes kMaskBlockElements of dx = dy * bit
// (FakeQuantGradOp's product, formulas::masked_grad; dy may be of a narrower
// dtype that dx's holds exactly: the cast and the mask as one); a cast pass's block
// converts kMaskBlockElements of its source (f32, f64, bf16 or f16) with
// formulas::cast_value, kernels::cast's conversion.
#include <algorithm>
#include <type_traits>

#include "qgrad/core/cuda/common.cuh"
#include "qgrad/kernels/cuda/column_sum.cuh"
#include "qgrad/kernels/cuda/entries.h"
#include "qgrad/kernels/formulas/cast.h"
#include "qgrad/kernels/formulas/transformer.h"
#include "qgrad/kernels/loop.h"

namespace qgrad::kernels::cuda {

namespace {

constexpr int kDeferredBatchMax = 80;  // the table stays under 4 KB of kernel parameters
constexpr unsigned kBatchThreads = 1024;
constexpr std::int64_t kMaskBlockElements = 4 * kBatchThreads;

enum PassKind : std::int8_t { kFinish, kMask, kCast };
// A cast's source; a mask pass's dy: kSame (dx's dtype) or a narrower one.
enum SourceType : std::int8_t { kF32, kF64, kBf16, kF16, kSame };

template <class T>
struct DeferredTable {
  const void* in[kDeferredBatchMax];  // finish: op-math partials; mask: dy; cast: the source
  T* out[kDeferredBatchMax];
  const std::uint32_t* mask[kDeferredBatchMax];  // mask passes
  std::int64_t n[kDeferredBatchMax];             // finish: columns; mask, cast: elements
  std::int32_t chunks[kDeferredBatchMax];        // finish: partial rows
  std::int32_t first_block[kDeferredBatchMax + 1];
  std::int8_t kind[kDeferredBatchMax];    // PassKind
  std::int8_t source[kDeferredBatchMax];  // cast, mask: SourceType
  int count;
};

template <class T, class S>
__device__ void cast_block(const S* in, T* out, std::int64_t n, std::int64_t base) {
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const std::int64_t i = base + std::int64_t{k} * kBatchThreads;
    if (i < n) out[i] = formulas::cast_value<T>(in[i]);
  }
}

// dx = dy * bit, dy of dtype S: T's (masked_grad), or one T holds exactly
// (masked_gradient_exact_cast): converted first (formulas::masked_grad_cast).
template <class T, class S>
__device__ void mask_block(const S* dy, const std::uint32_t* mask, T* out, std::int64_t n, std::int64_t base) {
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const std::int64_t i = base + std::int64_t{k} * kBatchThreads;
    if (i >= n) continue;
    if constexpr (std::is_same_v<S, T>) out[i] = T(formulas::masked_grad(dy, mask, i));
    else out[i] = T(formulas::masked_grad_cast<T>(dy, mask, i));
  }
}

template <class T>
__global__ void __launch_bounds__(kBatchThreads) deferred_passes_kernel(const DeferredTable<T> table) {
  ::qgrad::cuda::wait_for_prior_kernels();
  const int block = static_cast<int>(blockIdx.x);
  int p = 0;
  while (block >= table.first_block[p + 1]) ++p;  // uniform across the block
  const std::int64_t local = block - table.first_block[p];
  if (table.kind[p] == kCast) {
    const std::int64_t base = local * kMaskBlockElements + threadIdx.y * 32 + threadIdx.x;
    switch (table.source[p]) {
      case kF32: cast_block(static_cast<const float*>(table.in[p]), table.out[p], table.n[p], base); break;
      case kF64: cast_block(static_cast<const double*>(table.in[p]), table.out[p], table.n[p], base); break;
      case kBf16: cast_block(static_cast<const bfloat16*>(table.in[p]), table.out[p], table.n[p], base); break;
      default: cast_block(static_cast<const half*>(table.in[p]), table.out[p], table.n[p], base); break;
    }
    return;
  }
  if (table.kind[p] == kFinish) {
    using M = op_math_t<T>;
    const std::int64_t cols = table.n[p];
    column_sum_block(cols, ChunkSumsFinish<T>{static_cast<const M*>(table.in[p]), table.out[p], table.chunks[p], cols},
                     local);
    return;
  }
  const std::int64_t base = local * kMaskBlockElements + threadIdx.y * 32 + threadIdx.x;
  const std::uint32_t* mask = table.mask[p];
  T* out = table.out[p];
  const std::int64_t n = table.n[p];
  switch (table.source[p]) {  // dy's dtype: T's, or a narrower one (a mixed-precision weight's gradient)
    case kBf16:
      if constexpr (sizeof(T) >= 4) mask_block(static_cast<const bfloat16*>(table.in[p]), mask, out, n, base);
      break;
    case kF16:
      if constexpr (sizeof(T) >= 4) mask_block(static_cast<const half*>(table.in[p]), mask, out, n, base);
      break;
    case kF32:
      if constexpr (sizeof(T) == 8) mask_block(static_cast<const float*>(table.in[p]), mask, out, n, base);
      break;
    default: mask_block(static_cast<const T*>(table.in[p]), mask, out, n, base); break;
  }
}

template <class T>
void launch_batch(const std::vector<DeferredPass>& passes, std::size_t first, std::size_t count) {
  DeferredTable<T> table{};
  table.count = static_cast<int>(count);
  std::int64_t blocks = 0;
  for (std::size_t k = 0; k < count; ++k) {
    const DeferredPass& pass = passes[first + k];
    table.in[k] = pass.in.data_ptr();
    table.out[k] = static_cast<T*>(pass.out.data_ptr());
    table.first_block[k] = static_cast<std::int32_t>(blocks);
    table.n[k] = pass.out.numel();
    table.mask[k] = nullptr;
    table.chunks[k] = 0;
    table.source[k] = kF32;
    if (pass.kind == DeferredPass::Kind::column_sums_finish) {
      table.kind[k] = kFinish;
      table.chunks[k] = static_cast<std::int32_t>(pass.in.numel() / pass.out.numel());
      blocks += (table.n[k] + 31) / 32;
    } else {
      if (pass.kind == DeferredPass::Kind::masked_gradient) {
        table.kind[k] = kMask;
        table.mask[k] = static_cast<const std::uint32_t*>(pass.mask.data_ptr());
        // dy of dx's dtype: kSame; else its 16-bit or f32 dtype (DeferredPasses::masked_gradient checked it).
        table.source[k] = pass.in.dtype() == pass.out.dtype() ? kSame
                          : pass.in.dtype() == DType::bf16    ? kBf16
                          : pass.in.dtype() == DType::f16     ? kF16
                                                               : kF32;
      } else {
        table.kind[k] = kCast;
        switch (pass.in.dtype()) {
          case DType::f32: table.source[k] = kF32; break;
          case DType::f64: table.source[k] = kF64; break;
          case DType::bf16: table.source[k] = kBf16; break;
          case DType::f16: table.source[k] = kF16; break;
          default: throw Error("deferred_passes", "passes", "a cast from a non-floating dtype");
        }
      }
      blocks += (table.n[k] + kMaskBlockElements - 1) / kMaskBlockElements;
    }
    QGRAD_CHECK(blocks < 0x7fffffff && (pass.kind != DeferredPass::Kind::column_sums_finish ||
                                        pass.in.numel() / pass.out.numel() < 0x7fffffff),
                "deferred_passes", "passes", "a batch too large for one launch");
  }
  table.first_block[count] = static_cast<std::int32_t>(blocks);
  if (blocks == 0) return;
  ::qgrad::cuda::launch_kernel(passes[first].out.device().index, deferred_passes_kernel<T>,
                               static_cast<unsigned>(blocks), dim3(32, 32), 0, table);
}

}  // namespace

void run_deferred_passes(const std::vector<DeferredPass>& passes) {
  if (passes.empty()) return;
  dispatch_floating(passes.front().out.dtype(), "deferred_passes", [&](auto tag) {
    using T = typename decltype(tag)::type;
    for (std::size_t first = 0; first < passes.size(); first += kDeferredBatchMax)
      launch_batch<T>(passes, first, std::min<std::size_t>(kDeferredBatchMax, passes.size() - first));
  });
}

}  // namespace qgrad::kernels::cuda
