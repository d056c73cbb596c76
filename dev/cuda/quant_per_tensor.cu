// dev/cuda/quant_per_tensor.cu: launch shapes of the per-tensor quantize
// (f32 -> s8) and dequantize (s8 -> f32) over 256M elements, against the
// library's ops in the same run (llm.c style: every variant, its check and
// its benchmark in one file; not part of the library). The library's shapes
// came from H100 sweeps; this one asks whether an H200 wants others. Built as
// dev_quant_per_tensor when CUDA is on; run on the GPU machine:
//
//   build/dev/dev_quant_per_tensor
//
// Variants: U 16-byte vectors of f32 (quantize) or 4-byte vectors of s8
// (dequantize) a thread, all loads issued before any store, U in {1, 2, 4, 8};
// grids of one pass over the tensor or of W waves of resident blocks
// (W in {1, 2, 4, 8, 16}), grid-stride. The element formulas are the
// library's (formulas::QuantizeOp / DequantizeOp); every variant's output is
// compared byte for byte with the library op's before it is timed.
//
// Dequantize also: blocks of 128, 256 or 512 threads, with and without
// evict-first (st.global.cs) stores of the output, U in {2, 4}, one pass.
// "lib_kernel": the library's kernels (kernels::quantize / dequantize) into
// preallocated outputs, without the op around them. QGRAD_DEV_QUICK=1 runs
// only the library rows, the library's kernel before 2026-11-27 ("old_lib"),
// U = 4 on one pass (also with its resident blocks capped by unused shared
// memory) and the U = 2 shapes.
//
// Output: one line per check, then JSON lines {"bench":"dev_quant_per_tensor",
// "case":"quantize_per_tensor"|"dequantize_per_tensor","impl":"lib"|"lib_kernel"|"u<U>_w<W>"|"u<U>_t<T>[_cs]",...}.
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "../../bench/bench_common.h"
#include "qgrad/kernels/formulas/quantize.h"
#include "qgrad/kernels/quantize.h"
#include "qgrad/kernels/vec4.h"

using namespace qgrad;
using namespace qgrad::bench;

namespace {

using QOp = formulas::QuantizeOp<float, std::int8_t>;
using DOp = formulas::DequantizeOp<std::int8_t, float, false>;

template <int U>
__global__ void __launch_bounds__(256)
    quantize_kernel(QOp op, formulas::ChannelParams p, const float4* __restrict__ x, char4* __restrict__ q,
                    std::int64_t nv) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x * U;
  for (std::int64_t base = static_cast<std::int64_t>(blockIdx.x) * blockDim.x * U + threadIdx.x; base < nv;
       base += stride) {
    float4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const std::int64_t i = base + static_cast<std::int64_t>(u) * blockDim.x;
      if (i < nv) v[u] = x[i];
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const std::int64_t i = base + static_cast<std::int64_t>(u) * blockDim.x;
      if (i >= nv) continue;
      bool bit;
      char4 o;
      o.x = op(v[u].x, p, false, bit);
      o.y = op(v[u].y, p, false, bit);
      o.z = op(v[u].z, p, false, bit);
      o.w = op(v[u].w, p, false, bit);
      q[i] = o;
    }
  }
}

template <int U>
__global__ void __launch_bounds__(256)
    dequantize_kernel(DOp op, formulas::ChannelParams p, const char4* __restrict__ q, float4* __restrict__ y,
                      std::int64_t nv) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x * U;
  bool bit = false;
  for (std::int64_t base = static_cast<std::int64_t>(blockIdx.x) * blockDim.x * U + threadIdx.x; base < nv;
       base += stride) {
    char4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const std::int64_t i = base + static_cast<std::int64_t>(u) * blockDim.x;
      if (i < nv) v[u] = q[i];
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const std::int64_t i = base + static_cast<std::int64_t>(u) * blockDim.x;
      if (i >= nv) continue;
      y[i] = make_float4(op(v[u].x, p, false, bit), op(v[u].y, p, false, bit), op(v[u].z, p, false, bit),
                         op(v[u].w, p, false, bit));
    }
  }
}

// dequantize with kThreads a block and (kStream) evict-first stores of the
// f32 output (st.global.cs), one pass.
template <int U, int kThreads, bool kStream>
__global__ void __launch_bounds__(kThreads)
    dequantize_shape_kernel(DOp op, formulas::ChannelParams p, const char4* __restrict__ q, float4* __restrict__ y,
                            std::int64_t nv) {
  bool bit = false;
  const std::int64_t base = static_cast<std::int64_t>(blockIdx.x) * kThreads * U + threadIdx.x;
  char4 v[U];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const std::int64_t i = base + static_cast<std::int64_t>(u) * kThreads;
    if (i < nv) v[u] = q[i];
  }
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const std::int64_t i = base + static_cast<std::int64_t>(u) * kThreads;
    if (i >= nv) continue;
    const float4 o = make_float4(op(v[u].x, p, false, bit), op(v[u].y, p, false, bit), op(v[u].z, p, false, bit),
                                 op(v[u].w, p, false, bit));
    if constexpr (kStream) __stcs(y + i, o);
    else y[i] = o;
  }
}

void row(const char* kase, const char* impl, const Timing& t, double bytes, double copy_gbs) {
  memory_row("dev_quant_per_tensor", kase, impl, t, bytes, copy_gbs);
}

// Blocks of 256 threads: one pass (each thread U vectors once), or `waves`
// times the resident blocks of the kernel.
template <class K>
unsigned grid_of(K kernel, std::int64_t nv, int U, int waves) {
  if (waves == 0) return static_cast<unsigned>((nv + 256LL * U - 1) / (256LL * U));
  int per_sm = 0, sms = 0;
  QGRAD_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, 256, 0));
  QGRAD_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  return static_cast<unsigned>(per_sm * sms * waves);
}

template <int U>
void sweep(const Tensor& x, const Tensor& q_lib, const Tensor& q, const Tensor& y_lib, const Tensor& y,
           std::int64_t nv, double copy_gbs, bool& all_ok, bool one_pass_only = false) {
  const formulas::ChannelParams p = formulas::ParamSource{nullptr, nullptr, 0.02f, 3}.get(0);
  const QOp qop{-128, 127};
  const DOp dop{-128, 127};
  cudaStream_t s = qgrad::cuda::stream(0);
  const double n = static_cast<double>(nv) * 4;
  for (const int waves : {0, 1, 2, 4, 8, 16}) {
    if (one_pass_only && waves != 0) break;
    char impl[32];  // (snprintf: GCC 12 warns falsely on std::string concatenation here)
    std::snprintf(impl, sizeof impl, "u%d_w%d", U, waves);
    const unsigned gq = grid_of(quantize_kernel<U>, nv, U, waves), gd = grid_of(dequantize_kernel<U>, nv, U, waves);
    auto run_q = [&](int) {
      quantize_kernel<U><<<gq, 256, 0, s>>>(qop, p, static_cast<const float4*>(x.data_ptr()),
                                            static_cast<char4*>(q.data_ptr()), nv);
    };
    auto run_d = [&](int) {
      dequantize_kernel<U><<<gd, 256, 0, s>>>(dop, p, static_cast<const char4*>(q_lib.data_ptr()),
                                              static_cast<float4*>(y.data_ptr()), nv);
    };
    run_q(0);
    run_d(0);
    const bool ok = same_bytes(q, q_lib) && same_bytes(y, y_lib);
    all_ok = all_ok && ok;
    std::printf("check %s: %s\n", impl, ok ? "same bytes as the library ops" : "DIFFERS");
    row("quantize_per_tensor", impl, time_cuda(run_q), 5 * n, copy_gbs);
    row("dequantize_per_tensor", impl, time_cuda(run_d), 5 * n, copy_gbs);
  }
}

template <int U, int kThreads, bool kStream>
void shape_row(const Tensor& q_lib, const Tensor& y_lib, const Tensor& y, std::int64_t nv, double copy_gbs,
               bool& all_ok) {
  const formulas::ChannelParams p = formulas::ParamSource{nullptr, nullptr, 0.02f, 3}.get(0);
  const DOp dop{-128, 127};
  cudaStream_t s = qgrad::cuda::stream(0);
  const auto blocks = static_cast<unsigned>((nv + std::int64_t{kThreads} * U - 1) / (std::int64_t{kThreads} * U));
  auto run = [&](int) {
    dequantize_shape_kernel<U, kThreads, kStream><<<blocks, kThreads, 0, s>>>(
        dop, p, static_cast<const char4*>(q_lib.data_ptr()), static_cast<float4*>(y.data_ptr()), nv);
  };
  run(0);
  const bool ok = same_bytes(y, y_lib);
  all_ok = all_ok && ok;
  char impl[48];
  std::snprintf(impl, sizeof impl, "u%d_t%d%s", U, kThreads, kStream ? "_cs" : "");
  std::printf("check %s: %s\n", impl, ok ? "same bytes as the library ops" : "DIFFERS");
  row("dequantize_per_tensor", impl, time_cuda(run), 5.0 * static_cast<double>(nv) * 4, copy_gbs);
}

// The library's per-tensor kernel before 2026-11-27 (kernels/cuda/quantize.cu
// at 865c760): the op's operator() per element (float or general form chosen
// per element), the n % 4 tail after the loop. 64 registers for s8 -> f32,
// 76 for f32 -> s8; its s8 -> f32 ran 0.330-0.332 ms on H200s.
template <class Op>
__global__ void __launch_bounds__(256)
    old_lib_kernel(Op op, const typename Op::In* __restrict__ in, typename Op::Out* __restrict__ out, std::int64_t n,
                   formulas::ParamSource ps) {
  using In = typename Op::In;
  using Out = typename Op::Out;
  const formulas::ChannelParams p = ps.get(0);
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x * 4;
  const std::int64_t full = n / 4;
  bool bit = false;
  for (std::int64_t v0 = static_cast<std::int64_t>(blockIdx.x) * blockDim.x * 4 + threadIdx.x; v0 < full;
       v0 += stride) {
    kernels::Vec4<In> x[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const std::int64_t v = v0 + static_cast<std::int64_t>(u) * blockDim.x;
      if (v < full) x[u] = reinterpret_cast<const kernels::Vec4<In>*>(in)[v];
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const std::int64_t v = v0 + static_cast<std::int64_t>(u) * blockDim.x;
      if (v >= full) continue;
      kernels::Vec4<Out> y;
#pragma unroll
      for (int k = 0; k < 4; ++k) y.v[k] = op(x[u].v[k], p, false, bit);
      reinterpret_cast<kernels::Vec4<Out>*>(out)[v] = y;
    }
  }
  const std::int64_t tail = 4 * full + static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (tail < n) out[tail] = op(in[tail], p, false, bit);
}

void old_lib_rows(const Tensor& x, const Tensor& q_lib, const Tensor& q, const Tensor& y_lib, const Tensor& y,
                  std::int64_t n, double copy_gbs, bool& all_ok) {
  const formulas::ParamSource ps{nullptr, nullptr, 0.02f, 3};
  cudaStream_t s = qgrad::cuda::stream(0);
  const auto blocks = static_cast<unsigned>(((n + 3) / 4 + 1023) / 1024);
  auto run_q = [&](int) {
    old_lib_kernel<QOp><<<blocks, 256, 0, s>>>(QOp{-128, 127}, static_cast<const float*>(x.data_ptr()),
                                               static_cast<std::int8_t*>(q.data_ptr()), n, ps);
  };
  auto run_d = [&](int) {
    old_lib_kernel<DOp><<<blocks, 256, 0, s>>>(DOp{-128, 127}, static_cast<const std::int8_t*>(q_lib.data_ptr()),
                                               static_cast<float*>(y.data_ptr()), n, ps);
  };
  run_q(0);
  run_d(0);
  const bool ok = same_bytes(q, q_lib) && same_bytes(y, y_lib);
  all_ok = all_ok && ok;
  std::printf("check old_lib: %s\n", ok ? "same bytes as the library ops" : "DIFFERS");
  row("quantize_per_tensor", "old_lib", time_cuda(run_q), 5.0 * static_cast<double>(n), copy_gbs);
  row("dequantize_per_tensor", "old_lib", time_cuda(run_d), 5.0 * static_cast<double>(n), copy_gbs);
}

// dequantize_kernel<U> on one pass with `smem` bytes of dynamic shared
// memory a block, unused, to cap the resident blocks an SM (the library's
// per-tensor kernel ran s8 -> f32 faster at 64 registers, 4 blocks an SM,
// than at 48, 5 blocks: 0.332 against 0.339 ms on H200s).
template <int U>
void occupancy_row(const Tensor& q_lib, const Tensor& y_lib, const Tensor& y, std::int64_t nv, double copy_gbs,
                   int smem, bool& all_ok) {
  const formulas::ChannelParams p = formulas::ParamSource{nullptr, nullptr, 0.02f, 3}.get(0);
  const DOp dop{-128, 127};
  cudaStream_t s = qgrad::cuda::stream(0);
  QGRAD_CUDA_CHECK(cudaFuncSetAttribute(dequantize_kernel<U>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  int per_sm = 0;
  QGRAD_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, dequantize_kernel<U>, 256, smem));
  const auto blocks = static_cast<unsigned>((nv + 256LL * U - 1) / (256LL * U));
  auto run = [&](int) {
    dequantize_kernel<U><<<blocks, 256, smem, s>>>(dop, p, static_cast<const char4*>(q_lib.data_ptr()),
                                                   static_cast<float4*>(y.data_ptr()), nv);
  };
  run(0);
  const bool ok = same_bytes(y, y_lib);
  all_ok = all_ok && ok;
  char impl[48];
  std::snprintf(impl, sizeof impl, "u%d_w0_occ%d", U, per_sm);
  std::printf("check %s: %s\n", impl, ok ? "same bytes as the library ops" : "DIFFERS");
  row("dequantize_per_tensor", impl, time_cuda(run), 5.0 * static_cast<double>(nv) * 4, copy_gbs);
}

// Block sizes 128 / 256 / 512 and streaming stores, one pass, U vectors a thread.
template <int U>
void shapes(const Tensor& q_lib, const Tensor& y_lib, const Tensor& y, std::int64_t nv, double copy_gbs,
            bool& all_ok) {
  shape_row<U, 128, false>(q_lib, y_lib, y, nv, copy_gbs, all_ok);
  shape_row<U, 256, false>(q_lib, y_lib, y, nv, copy_gbs, all_ok);
  shape_row<U, 512, false>(q_lib, y_lib, y, nv, copy_gbs, all_ok);
  shape_row<U, 128, true>(q_lib, y_lib, y, nv, copy_gbs, all_ok);
  shape_row<U, 256, true>(q_lib, y_lib, y, nv, copy_gbs, all_ok);
  shape_row<U, 512, true>(q_lib, y_lib, y, nv, copy_gbs, all_ok);
}

}  // namespace

int main() {
  if (!cuda_available()) {
    std::printf("dev_quant_per_tensor: no CUDA device present; nothing measured\n");
    return 0;
  }
  constexpr std::int64_t kN = std::int64_t{4096} * 65536;  // 256M, bench_quant's size
  const double copy_gbs = copy_bandwidth_gbs(static_cast<std::size_t>(kN) * 4);
  NoGradGuard ng;
  Generator gen(0xbe);
  const TensorOptions f32 = TensorOptions{}.with_device(Device::cuda());
  const Tensor x = randn({kN}, gen, f32, 0.0, 2.0);
  const Tensor q_lib = quantize_per_tensor(x, 0.02, 3, DType::s8);
  const Tensor y_lib = dequantize_per_tensor(q_lib, 0.02, 3);
  const Tensor q = empty_like(q_lib), y = empty_like(y_lib);
  const double n = static_cast<double>(kN);
  row("quantize_per_tensor", "lib", time_cuda([&](int) { quantize_per_tensor(x, 0.02, 3, DType::s8); }), 5 * n,
      copy_gbs);
  row("dequantize_per_tensor", "lib", time_cuda([&](int) { dequantize_per_tensor(q_lib, 0.02, 3); }), 5 * n,
      copy_gbs);
  // The library's kernels alone, into the same preallocated outputs as the
  // variants (no op validation, no allocation): what separates the op's row
  // from its kernel's.
  kernels::QuantParams params;
  params.layout.outer = kN;
  params.source = formulas::ParamSource{nullptr, nullptr, 0.02f, 3};
  params.qmin = -128;
  params.qmax = 127;
  row("quantize_per_tensor", "lib_kernel", time_cuda([&](int) { kernels::quantize(x, q, params, nullptr); }), 5 * n,
      copy_gbs);
  row("dequantize_per_tensor", "lib_kernel", time_cuda([&](int) { kernels::dequantize(q_lib, y, params); }), 5 * n,
      copy_gbs);
  bool ok = same_bytes(q, q_lib) && same_bytes(y, y_lib);
  std::printf("check lib_kernel: %s\n", ok ? "same bytes as the library ops" : "DIFFERS");
  if (std::getenv("QGRAD_DEV_QUICK") != nullptr) {  // the library's rows, 4 vectors on one pass, the 2-vector shapes
    sweep<4>(x, q_lib, q, y_lib, y, kN / 4, copy_gbs, ok, true);
    shapes<2>(q_lib, y_lib, y, kN / 4, copy_gbs, ok);
    old_lib_rows(x, q_lib, q, y_lib, y, kN, copy_gbs, ok);
    for (const int smem : {44 << 10, 56 << 10, 72 << 10})
      occupancy_row<4>(q_lib, y_lib, y, kN / 4, copy_gbs, smem, ok);
    std::printf("copy bandwidth %.1f GB/s; every variant %s\n", copy_gbs, ok ? "matched" : "did NOT match");
    return ok ? 0 : 1;
  }
  sweep<1>(x, q_lib, q, y_lib, y, kN / 4, copy_gbs, ok);
  sweep<2>(x, q_lib, q, y_lib, y, kN / 4, copy_gbs, ok);
  sweep<4>(x, q_lib, q, y_lib, y, kN / 4, copy_gbs, ok);
  sweep<8>(x, q_lib, q, y_lib, y, kN / 4, copy_gbs, ok);
  shapes<2>(q_lib, y_lib, y, kN / 4, copy_gbs, ok);
  shapes<4>(q_lib, y_lib, y, kN / 4, copy_gbs, ok);
  std::printf("copy bandwidth %.1f GB/s; every variant %s\n", copy_gbs, ok ? "matched" : "did NOT match");
  return ok ? 0 : 1;
}
