// The per-tensor observer + fake quantize of an activation in one launch
// (issue #16 item 2: a QAT step's node count). The library runs it as two
// kernels: the observer's partial min/max, whose last block combines the
// partials, moves the running range and writes the qparams; then the fake
// quantize with its mask. The b256 MLP step has four such pairs (8 of its 45
// nodes), the CNN and the ViT one per quantized activation.
//   library  observe_fake_quantize_per_tensor (x requires grad: the mask is written);
//   coop     one cooperative launch: each block's min/max partial, a grid barrier,
//            every block combines the partials (exact and order-free) and derives
//            the same running range and qparams from the range it read before the
//            barrier (block 0 stores them), then fake quantizes its 128-element mask
//            blocks (one warp each: a 16-byte load a lane, four ballots);
//   coop_pdl the same with the programmatic-dependent-launch attribute too.
// Checked against the library: y, run_min, run_max, scale and zero point byte
// for byte, and the mask through the library's backward of ones (dx = bit).
// Times: 20 calls captured in a qgrad::CudaGraph, median of 21 replays (the
// first dropped), µs a call. Shapes: the MLP steps' quantized activations.
// Run by hand on the GPU machine:  build-gpu/dev/dev_observe_fq_coop
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "../../bench/bench_common.h"
#include "captured_timing.cuh"
#include "qgrad/core/cuda/common.cuh"
#include "qgrad/kernels/bitmask.h"
#include "qgrad/kernels/cuda/minmax.cuh"
#include "qgrad/kernels/formulas/quantize.h"
#include "qgrad/qgrad.h"

using namespace qgrad;
using bench::same_bytes;
using kernels::cuda::QparamsArgs;

namespace {

constexpr unsigned kThreads = 256;
constexpr std::int64_t kQmin = 0, kQmax = 255;  // quint8, the default activation format
constexpr float kAveraging = 0.01f;             // MovingAverageMinMaxObserver's default

// n a multiple of 4 and x, y 16-byte aligned (the dev shapes are).
__global__ void __launch_bounds__(kThreads)
    observe_fq_coop_kernel(const float* __restrict__ x, float* __restrict__ y, std::uint32_t* __restrict__ mask,
                           std::int64_t n, float* __restrict__ partial, float* run_min, float* run_max,
                           QparamsArgs q) {
  ::qgrad::cuda::wait_for_prior_kernels();
  namespace cg = cooperative_groups;
  const cg::grid_group grid = cg::this_grid();
  float lo, hi;
  kernels::cuda::slice_minmax(x, 1, n, n, 0, std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x,
                              std::int64_t{gridDim.x} * blockDim.x, lo, hi);
  kernels::cuda::block_minmax(lo, hi);
  // The running range as it was before any block updates it.
  const float old_min = run_min[0], old_max = run_max[0];
  if (threadIdx.x == 0) {
    partial[2 * blockIdx.x] = lo;
    partial[2 * blockIdx.x + 1] = hi;
  }
  grid.sync();
  lo = INFINITY;
  hi = -INFINITY;
  for (unsigned k = threadIdx.x; k < gridDim.x; k += blockDim.x) {
    lo = formulas::min_combine(lo, __ldcg(partial + 2 * k));
    hi = formulas::max_combine(hi, __ldcg(partial + 2 * k + 1));
  }
  kernels::cuda::block_minmax(lo, hi);
  float new_min = old_min, new_max = old_max;
  formulas::observer_update(new_min, new_max, lo, hi, kAveraging, true);
  float scale = 1.0f;
  std::int32_t zp = 0;
  formulas::observer_qparams(new_min, new_max, q.qmin, q.qmax, q.symmetric, q.symmetric_zero_point, scale, zp);
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    run_min[0] = new_min;
    run_max[0] = new_max;
    q.scale[0] = scale;
    q.zero_point[0] = zp;
  }
  const formulas::FakeQuantOp<float, false> op{q.qmin, q.qmax};
  formulas::ChannelParams p;
  p.scale = scale;
  p.zp = zp;
  p.inv_scale = formulas::inv_scale_of(scale);
  const bool exact = op.float_form_exact(p);
  const unsigned lane = threadIdx.x & 31u;
  const std::int64_t warps = std::int64_t{gridDim.x} * (blockDim.x / 32);
  for (std::int64_t b = std::int64_t{blockIdx.x} * (blockDim.x / 32) + threadIdx.x / 32; b < bitmask_blocks(n);
       b += warps) {
    const std::int64_t i = b * kBitmaskBlock + 4 * lane;
    const bool in = i < n;
    float4 v = in ? *reinterpret_cast<const float4*>(x + i) : make_float4(0, 0, 0, 0);
    bool bit[4];
    v.x = op.row_value(v.x, p, exact, bit[0]);
    v.y = op.row_value(v.y, p, exact, bit[1]);
    v.z = op.row_value(v.z, p, exact, bit[2]);
    v.w = op.row_value(v.w, p, exact, bit[3]);
    if (in) *reinterpret_cast<float4*>(y + i) = v;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const unsigned word = __ballot_sync(0xffffffffu, in && bit[k]);
      if (lane == static_cast<unsigned>(k)) mask[b * kBitmaskWordsPerBlock + k] = word;
    }
  }
}

struct State {
  Tensor run_min, run_max, scale, zp;
  static State fresh() {
    State s{Tensor::from_vector(std::vector<float>{-1.5f}, {1}).to(Device::cuda()),
            Tensor::from_vector(std::vector<float>{2.0f}, {1}).to(Device::cuda()),
            Tensor::empty({1}, TensorOptions{}.with_device(Device::cuda())),
            Tensor::empty({1}, TensorOptions{}.with_device(Device::cuda()).with_dtype(DType::s32))};
    return s;
  }
};

// Blocks of the cooperative grid: one warp per 128-element mask block, at most what stays resident.
unsigned coop_blocks(std::int64_t n) {
  int per_sm = 0, sms = 0;
  DEV_CHECK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, observe_fq_coop_kernel, kThreads, 0));
  DEV_CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const std::int64_t want = (bitmask_blocks(n) + kThreads / 32 - 1) / (kThreads / 32);
  return static_cast<unsigned>(std::max<std::int64_t>(1, std::min<std::int64_t>(want, std::int64_t{per_sm} * sms)));
}

cudaError_t launch_coop(const Tensor& x, const Tensor& y, const Tensor& mask, const Tensor& partial, State& s,
                        unsigned blocks, bool pdl) {
  const std::int64_t n = x.numel();
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeCooperative;
  attr[0].val.cooperative = 1;
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = blocks;
  cfg.blockDim = kThreads;
  cfg.stream = ::qgrad::cuda::stream(0);
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 2 : 1;
  QparamsArgs q;
  q.scale = s.scale.data<float>();
  q.zero_point = s.zp.data<std::int32_t>();
  q.qmin = kQmin;
  q.qmax = kQmax;
  return cudaLaunchKernelEx(&cfg, observe_fq_coop_kernel, static_cast<const float*>(x.data_ptr()),
                            static_cast<float*>(y.data_ptr()), static_cast<std::uint32_t*>(mask.data_ptr()), n,
                            partial.data<float>(), s.run_min.data<float>(), s.run_max.data<float>(), q);
}

Tensor library_call(const Tensor& x, State& s) {
  ObserverUpdate u;
  u.run_min = s.run_min;
  u.run_max = s.run_max;
  u.averaging_constant = kAveraging;
  return observe_fake_quantize_per_tensor(x, s.scale, s.zp, kQmin, kQmax, u);
}

void run_shape(std::int64_t M, std::int64_t K) {
  Generator g(0x0b5);
  const Tensor x = (randn({M, K}, g, TensorOptions{}.with_device(Device::cuda())) * 3.0).detach();
  const std::int64_t n = x.numel();
  // The library, once, from a fresh state; its mask through the backward of ones.
  State ls = State::fresh();
  Tensor xg = x.detach();
  xg.set_requires_grad(true);
  Tensor y_lib = library_call(xg, ls);
  y_lib.backward(ones_like(y_lib));
  const std::vector<float> dx = xg.grad().cpu().to_vector<float>();
  // One cooperative launch from the same state.
  State cs = State::fresh();
  Tensor y = Tensor::empty(x.shape(), TensorOptions{}.with_device(Device::cuda()));
  Tensor mask = Tensor::empty({bitmask_words(n)}, TensorOptions{}.with_device(Device::cuda()).with_dtype(DType::s32));
  const unsigned blocks = coop_blocks(n);
  Tensor partial = Tensor::empty({2 * static_cast<std::int64_t>(blocks)},
                                 TensorOptions{}.with_device(Device::cuda()));
  DEV_CHECK_CUDA(cudaMemset(y.data_ptr(), 0xff, y.nbytes()));  // poisoned
  DEV_CHECK_CUDA(cudaMemset(mask.data_ptr(), 0xa5, mask.nbytes()));
  const cudaError_t e = launch_coop(x, y, mask, partial, cs, blocks, false);
  if (e != cudaSuccess) {
    std::printf("{\"bench\":\"observe_fq_coop\",\"M\":%lld,\"K\":%lld,\"error\":\"%s\"}\n",
                static_cast<long long>(M), static_cast<long long>(K), cudaGetErrorString(e));
    return;
  }
  DEV_CHECK_CUDA(cudaDeviceSynchronize());
  const Tensor words = mask.cpu();
  const auto* w = static_cast<const std::uint32_t*>(words.data_ptr());
  bool mask_same = true;
  for (std::int64_t i = 0; i < n; ++i)
    mask_same = mask_same && bitmask_get(w, i) == (dx[static_cast<std::size_t>(i)] != 0.0f);
  const bool state_same = same_bytes(ls.run_min, cs.run_min) && same_bytes(ls.run_max, cs.run_max) &&
                          same_bytes(ls.scale, cs.scale) && same_bytes(ls.zp, cs.zp);
  std::printf("{\"bench\":\"observe_fq_coop\",\"M\":%lld,\"K\":%lld,\"blocks\":%u,\"y\":\"%s\",\"mask\":\"%s\","
              "\"state\":\"%s\"}\n",
              static_cast<long long>(M), static_cast<long long>(K), blocks,
              same_bytes(y, y_lib) ? "same" : "DIFFERS", mask_same ? "same" : "DIFFERS",
              state_same ? "same" : "DIFFERS");
  // Times (the state keeps moving; the work per call does not depend on it).
  const double lib = captured_us([&] { (void)library_call(xg, ls); });
  double coop[2] = {0, 0};
  for (const bool pdl : {false, true}) {
    try {
      coop[pdl] = captured_us([&] {
        const cudaError_t le = launch_coop(x, y, mask, partial, cs, blocks, pdl);
        if (le != cudaSuccess) throw std::runtime_error(cudaGetErrorString(le));
      });
    } catch (const std::exception& ex) {
      std::printf("{\"bench\":\"observe_fq_coop\",\"impl\":\"coop%s\",\"capture_error\":\"%s\"}\n", pdl ? "_pdl" : "",
                  ex.what());
    }
  }
  std::printf("{\"bench\":\"observe_fq_coop\",\"M\":%lld,\"K\":%lld,\"library_us\":%.2f,\"coop_us\":%.2f,"
              "\"coop_pdl_us\":%.2f}\n",
              static_cast<long long>(M), static_cast<long long>(K), lib, coop[0], coop[1]);
}

}  // namespace

int main() {
  if (!cuda_available()) {
    std::printf("{\"bench\":\"observe_fq_coop\",\"skipped\":\"no CUDA device\"}\n");
    return 0;
  }
  // The MLP steps' quantized activations: the input and the hidden layers at b256 h256 and b4096 h1024,
  // and the logits.
  const std::int64_t shapes[][2] = {{256, 784}, {256, 256}, {256, 10}, {4096, 784}, {4096, 1024}};
  for (const auto& s : shapes) run_shape(s[0], s[1]);
  return 0;
}
