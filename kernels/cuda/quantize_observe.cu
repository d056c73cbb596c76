// CUDA kernels of observe + fake quantize (observe_fake_quantize): an
// observer's running range, its qparams and the fake quantize of the tensor
// with them. Rows of per-channel weights take the row kernel
// (quantize_observe_rows.cu); a whole tensor one cooperative launch where it
// pays, otherwise the observer's reduction and then the elementwise engine
// (quantize.cu).
#include <cooperative_groups.h>

#include <algorithm>
#include <cstdint>

#include "qgrad/kernels/bitmask.h"
#include "qgrad/kernels/cuda/launch.cuh"
#include "qgrad/kernels/cuda/minmax.cuh"
#include "qgrad/kernels/cuda/quant_engine.cuh"
#include "qgrad/kernels/observer.h"
#include "qgrad/kernels/quantize.h"
#include "qgrad/kernels/vec4.h"

namespace qgrad::kernels::cuda {

namespace {

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

template <class Op>
void observe_tensor_impl(const QuantLaunch& a, const ObserveArgs& o) {
  const ObserverQparams qparams{o.scale, o.zero_point, a.params.qmin, a.params.qmax, o.symmetric,
                                o.symmetric_zero_point};
  if (observe_tensor_one_launch<Op>(a, o, qparams_args(&qparams))) return;
  cuda::observer_minmax(a.in, o.run_min, o.run_max, o.axis, o.averaging_constant, &qparams);
  quant_elementwise(a);  // the engine for this Op (its kernels are quantize.cu's)
}

}  // namespace

void observe_fake_quantize(const QuantLaunch& fq, const ObserveArgs& obs) {
  if (observe_rows_fake_quantize(fq, obs)) return;
  dispatch_quant_kernel(fq, [&]<class Op>() {
    if constexpr (kFollowsObserver<Op>) observe_tensor_impl<Op>(fq, obs);
    else throw Error("observe_fake_quantize", "kernel", "only fake_quantize (or its relu form) follows an observer");
  });
}

}  // namespace qgrad::kernels::cuda
