// CUDA kernels of the quantization ops.
//
// The elementwise engine of fake_quantize, quantize, dequantize and their
// backward kernels: one warp per 128-element mask block, each lane four
// consecutive elements (a 16-byte load/store for f32 when the pointers are
// aligned), the channel found once per lane by a magic-number division
// when `inner` is a multiple of 4 (per element otherwise), and the mask
// word k of the block built by one __ballot_sync over the lanes' k-th
// elements: no atomics. Same formulas and mask layout as the CPU kernels.
// The engine's device pieces are quant_engine.cuh's; the kernels of observe
// + fake quantize are quantize_observe.cu's (whole tensors) and
// quantize_observe_rows.cu's (per-channel rows), LSQ's and the dynamic rows'
// quantize_rows.cu's.
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "qgrad/kernels/bitmask.h"
#include "qgrad/kernels/cuda/entries.h"
#include "qgrad/kernels/cuda/launch.cuh"
#include "qgrad/kernels/cuda/quant_engine.cuh"
#include "qgrad/kernels/formulas/lowbit.h"
#include "qgrad/kernels/quantize.h"
#include "qgrad/kernels/vec4.h"

namespace qgrad::kernels::cuda {

namespace {

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

}  // namespace

void quant_elementwise(const QuantLaunch& l) {
  dispatch_quant_kernel(l, [&]<class Op>() { engine<Op>(l); });
}

}  // namespace qgrad::kernels::cuda
