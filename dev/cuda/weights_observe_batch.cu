// The QAT step's weight observers + fake quantizes in one launch (issue #16
// item 2: at b256 the MLP step runs three `observe_rows_kernel` launches, one
// per layer's weight, 3 x 10.5 us under ncu, the largest kernels of the
// step). The weights do not depend on the batch, so one launch could serve
// them all, as fake_quantize_dynamic_batch does for the ViT's 8da8w weights.
//   library  observe_fake_quantize_per_channel once per weight (axis 0,
//            symmetric s8, moving average 0.01: the default QAT qconfig's
//            weight fake quant), three launches;
//   batch    one launch over a table of segments (a weight each): block b
//            finds its segment, reduces its rows (4 warps a row on blocks of
//            1024 threads, as the library's wide blocks), lane 0 of each row
//            updates the channel and writes its qparams, then the block fake
//            quantizes its rows and writes their mask words (the fewest rows
//            a block whose words are its own, the library's rule).
// Checked byte for byte against the library: y, the running ranges, scale,
// zero point, and the mask (through the library's gradient of sum(y * g)).
// Times: each captured on the library's stream in a qgrad::CudaGraph (20
// calls, median of 21 replays), µs a step's worth (all the weights).
// Run by hand on the GPU machine:  build-gpu/dev/dev_weights_observe_batch
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <vector>

#include "captured_timing.cuh"
#include "qgrad/kernels/bitmask.h"
#include "qgrad/kernels/cuda/minmax.cuh"
#include "qgrad/kernels/formulas/quantize.h"
#include "qgrad/ops/factory.h"
#include "qgrad/ops/quantize.h"
#include "qgrad/ops/reduce.h"
#include "qgrad/ops/elementwise.h"

namespace {

using qgrad::Tensor;
namespace kc = qgrad::kernels::cuda;
namespace fm = qgrad::formulas;

constexpr int kMaxSegments = 4;
constexpr unsigned kThreads = 1024;
constexpr std::int64_t kQmin = -128, kQmax = 127;
constexpr float kAveraging = 0.01f;

struct Segment {
  const float* in;
  float* out;
  std::uint32_t* mask;
  float *run_min, *run_max, *scale;
  std::int32_t* zp;
  std::int64_t channels, inner, rows, first_block;  // first_block: the segment's first block of the grid
};
struct Segments {
  Segment s[kMaxSegments];
  int count;
};

__global__ void __launch_bounds__(kThreads) batch_kernel(Segments table) {
  int si = 0;
  while (si + 1 < table.count && blockIdx.x >= table.s[si + 1].first_block) ++si;
  const Segment& g = table.s[si];
  const std::int64_t n = g.channels * g.inner;
  const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const std::int64_t r0 = (std::int64_t{blockIdx.x} - g.first_block) * g.rows;
  const std::int64_t r1 = std::min(r0 + g.rows, g.channels);
  const auto nrows = static_cast<unsigned>(r1 - r0);
  const kc::QparamsArgs q{g.scale, g.zp, kQmin, kQmax, /*symmetric=*/true, /*symmetric_zero_point=*/0};
  // Rows: wpr warps a row, partials combined in shared memory (exact, order-free).
  __shared__ float s_lo[kThreads / 32], s_hi[kThreads / 32];
  const unsigned wpr = std::max(1u, nwarps / nrows);
  for (unsigned k0 = 0; k0 < nrows; k0 += nwarps / wpr) {
    const unsigned k = k0 + warp / wpr, part = warp % wpr;
    float lo = INFINITY, hi = -INFINITY;
    if (k < nrows && warp / wpr < nwarps / wpr) {
      const float* row = g.in + (r0 + k) * g.inner;
      kc::strided_minmax(lane + 32 * part, g.inner, 32 * wpr, [&](std::int64_t e) { return row[e]; }, lo, hi);
      kc::warp_minmax(lo, hi);
    }
    if (lane == 0) s_lo[warp] = lo, s_hi[warp] = hi;
    __syncthreads();
    if (threadIdx.x < nwarps / wpr && k0 + threadIdx.x < nrows) {
      float a = s_lo[threadIdx.x * wpr], b = s_hi[threadIdx.x * wpr];
      for (unsigned w = 1; w < wpr; ++w) {
        a = fm::min_combine(a, s_lo[threadIdx.x * wpr + w]);
        b = fm::max_combine(b, s_hi[threadIdx.x * wpr + w]);
      }
      kc::update_channel(r0 + k0 + threadIdx.x, a, b, g.run_min, g.run_max, kAveraging, true, q);
    }
    __syncthreads();
  }
  // Fake quantize: a warp per 128-element mask block, each lane four consecutive elements.
  const fm::FakeQuantOp<float, true> op{kQmin, kQmax};
  const std::int64_t first = r0 * g.inner / qgrad::kBitmaskBlock;
  const std::int64_t last = r1 == g.channels ? qgrad::bitmask_blocks(n) : r1 * g.inner / qgrad::kBitmaskBlock;
  for (std::int64_t b = first + warp; b < last; b += nwarps) {
    const std::int64_t i0 = b * qgrad::kBitmaskBlock + 4 * lane;
    bool bit[4] = {false, false, false, false};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const std::int64_t i = i0 + e;
      if (i < n) {
        const std::int64_t ch = i / g.inner;
        const fm::ChannelParams p{g.scale[ch], fm::inv_scale_of(g.scale[ch]), g.zp[ch]};
        g.out[i] = op(g.in[i], p, false, bit[e]);
      }
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const unsigned word = __ballot_sync(0xffffffffu, bit[e]);
      if (lane == 0) g.mask[b * qgrad::kBitmaskWordsPerBlock + e] = word;
    }
  }
}

// The library's rule: the fewest whole rows that end on a mask block.
std::int64_t fewest_rows(std::int64_t inner) {
  return qgrad::kBitmaskBlock / std::gcd(inner, std::int64_t(qgrad::kBitmaskBlock));
}

void compare(const char* what, const Tensor& a, const Tensor& b) {
  const Tensor x = a.cpu(), y = b.cpu();
  const bool same = x.nbytes() == y.nbytes() && std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
  std::printf(",\"%s\":\"%s\"", what, same ? "same bits" : "DIFFERENT");
}

void run_step(const std::vector<std::pair<std::int64_t, std::int64_t>>& shapes, const char* name) {
  using namespace qgrad;
  const auto gpu = TensorOptions{}.with_device(Device::cuda(0));
  Generator gen(7);
  struct W {
    Tensor w, run_min, run_max, scale, zp;
  };
  auto fresh = [&](const Tensor& w) {
    const std::int64_t c = w.size(0);
    return W{w, full({c}, -0.05, gpu), full({c}, 0.05, gpu), Tensor::empty({c}, gpu),
             Tensor::empty({c}, TensorOptions{gpu}.with_dtype(DType::s32))};
  };
  std::vector<W> lib, dev;
  for (const auto& [c, k] : shapes) {
    Tensor w = mul(randn({c, k}, gen), 0.08).cuda();
    lib.push_back(fresh(w));
    dev.push_back(fresh(w));
  }
  // Library: y, state, and the mask through the gradient of sum(y * g).
  std::vector<Tensor> lib_y, lib_dx, gs;
  for (auto& l : lib) {
    Tensor leaf = l.w.detach();
    leaf.set_requires_grad(true);
    Tensor y = observe_fake_quantize_per_channel(leaf, l.scale, l.zp, 0, kQmin, kQmax,
                                                 ObserverUpdate{l.run_min, l.run_max, kAveraging, true, 0});
    Tensor g = randn(l.w.shape(), gen).cuda();
    sum(mul(y, g)).backward();
    lib_y.push_back(y.detach());
    lib_dx.push_back(leaf.grad());
    gs.push_back(g);
  }
  // Batch: the table, one launch.
  Segments table{};
  table.count = static_cast<int>(dev.size());
  std::int64_t blocks = 0;
  std::vector<Tensor> outs, masks;
  for (std::size_t i = 0; i < dev.size(); ++i) {
    const std::int64_t c = dev[i].w.size(0), inner = dev[i].w.size(1);
    outs.push_back(Tensor::empty(dev[i].w.shape(), gpu));
    masks.push_back(Tensor::empty({bitmask_words(c * inner)}, TensorOptions{gpu}.with_dtype(DType::s32)));
    const std::int64_t rows = fewest_rows(inner);
    table.s[i] = {dev[i].w.data<float>(), outs[i].data<float>(), static_cast<std::uint32_t*>(masks[i].data_ptr()),
                  dev[i].run_min.data<float>(), dev[i].run_max.data<float>(), dev[i].scale.data<float>(),
                  dev[i].zp.data<std::int32_t>(), c, inner, rows, blocks};
    blocks += (c + rows - 1) / rows;
  }
  cudaStream_t s = ::qgrad::cuda::stream(0);
  auto launch = [&] { batch_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(table); };
  launch();
  DEV_CHECK_CUDA(cudaStreamSynchronize(s));
  DEV_CHECK_CUDA(cudaGetLastError());
  std::printf("{\"bench\":\"weights_observe_batch\",\"step\":\"%s\",\"blocks\":%lld", name,
              static_cast<long long>(blocks));
  for (std::size_t i = 0; i < dev.size(); ++i) {
    std::printf(",\"w%zu\":\"[%lld, %lld]\"", i, static_cast<long long>(dev[i].w.size(0)),
                static_cast<long long>(dev[i].w.size(1)));
    compare("y", outs[i], lib_y[i]);
    compare("run_min", dev[i].run_min, lib[i].run_min);
    compare("run_max", dev[i].run_max, lib[i].run_max);
    compare("scale", dev[i].scale, lib[i].scale);
    compare("zero_point", dev[i].zp, lib[i].zp);
    // The mask through the library's straight-through rule: dx = g * bit.
    const std::vector<std::int32_t> words = masks[i].cpu().to_vector<std::int32_t>();
    const std::vector<float> g = gs[i].cpu().to_vector<float>(), dx = lib_dx[i].cpu().to_vector<float>();
    bool same = true;
    for (std::size_t e = 0; e < g.size(); ++e) {
      const bool bit = bitmask_get(reinterpret_cast<const std::uint32_t*>(words.data()), static_cast<std::int64_t>(e));
      const float want = g[e] * (bit ? 1.0f : 0.0f);
      same = same && std::memcmp(&want, &dx[e], sizeof want) == 0;
    }
    std::printf(",\"mask\":\"%s\"", same ? "same bits" : "DIFFERENT");
  }
  // Times: the library's three ops, the one launch.
  const double lib_us = captured_us([&] {
    for (auto& l : lib)
      observe_fake_quantize_per_channel(l.w, l.scale, l.zp, 0, kQmin, kQmax,
                                        ObserverUpdate{l.run_min, l.run_max, kAveraging, true, 0});
  });
  const double batch_us = captured_us(launch);
  std::printf(",\"library_us\":%.2f,\"batch_us\":%.2f}\n", lib_us, batch_us);
}

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("{\"bench\":\"weights_observe_batch\",\"skipped\":\"no CUDA device\"}\n");
    return 0;
  }
  // The MLP steps' weights: b256 (784-256-256-10) and b4096 (784-1024-1024-10).
  run_step({{256, 784}, {256, 256}, {10, 256}}, "mlp_h256");
  run_step({{1024, 784}, {1024, 1024}, {10, 1024}}, "mlp_h1024");
  return 0;
}
