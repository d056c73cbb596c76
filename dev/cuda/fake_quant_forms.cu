// Two forms of the f32 fake quantize formula: the library's
// formulas::FakeQuantOp (kernels/formulas/quantize.h: q = int64(nearbyint(x /
// s)) + zp, clamped in int64, then dequant_value) and a candidate float form
// (q, its clamp and qc - zp in float, exact while qmin, qmax, zp and
// qmin/qmax - zp lie inside +-2^24, as QuantizeOp's float form argues). The
// program checks that both give the same bits (value and mask bit) on 256M
// elements (values over the int8 range and past it, ties, +-0, +-inf, NaN,
// huge values), per tensor and per channel (4096 channels, the f64 product
// of fake_quantize_per_channel), then times each in the same elementwise
// kernel (16-byte loads and stores, one store per 32 mask bits) against a
// device-to-device copy of the same bytes. Measured on an H200 (2026-11-26):
// the same bits, and the float form no faster (per tensor 0.93x, per
// channel 1.02x), so the library keeps the int64 form. Run by hand on the
// GPU machine:
//   build-gpu/dev/dev_fake_quant_forms
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "qgrad/core/cuda/common.cuh"
#include "qgrad/kernels/formulas/quantize.h"

namespace {

using qgrad::formulas::ChannelParams;

constexpr std::int64_t kChannels = 4096, kInner = 65536, kN = kChannels * kInner;  // 256M f32, 1 GiB

// The library's FakeQuantOp (the int64 form).
template <bool kDoubleProduct>
struct LibraryForm {
  std::int64_t qmin, qmax;
  __device__ float operator()(float x, const ChannelParams& p, bool& bit) const {
    return qgrad::formulas::FakeQuantOp<float, kDoubleProduct>{qmin, qmax}(x, p, false, bit);
  }
};

// The candidate float form (the qparams below are inside its bounds).
struct FloatForm {
  std::int64_t qmin, qmax;
  __device__ float operator()(float x, const ChannelParams& p, bool& bit) const {
    const float lo = static_cast<float>(qmin), hi = static_cast<float>(qmax), z = static_cast<float>(p.zp);
    const float r = qgrad::formulas::round_half_even(x * p.inv_scale) + z;
    bit = r >= lo && r <= hi;
    if (r != r) return x;
    return (fminf(fmaxf(r, lo), hi) - z) * p.scale;
  }
};

// Per tensor: channels == 1 (every element uses params[0]).
struct Params {
  const float* scale;
  const std::int32_t* zp;
  std::int64_t inner, channels;
  __device__ ChannelParams at(std::int64_t i) const {
    const std::int64_t c = channels == 1 ? 0 : (i / inner) % channels;
    ChannelParams p;
    p.scale = scale[c];
    p.zp = zp[c];
    p.inv_scale = qgrad::formulas::inv_scale_of(p.scale);
    return p;
  }
};

// Four elements per thread (one float4); the mask's words gathered by
// shuffles from the eight lanes that share each.
template <class Op>
__global__ void fake_quant_kernel(const float4* x, float4* y, std::uint32_t* mask, std::int64_t nv, Params prm,
                                  Op op) {
  const std::int64_t v = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (v >= nv) return;  // nv is a multiple of the block size here
  const float4 in = x[v];
  bool b[4];
  float4 out;
  const std::int64_t i = 4 * v;
  out.x = op(in.x, prm.at(i), b[0]);
  out.y = op(in.y, prm.at(i + 1), b[1]);
  out.z = op(in.z, prm.at(i + 2), b[2]);
  out.w = op(in.w, prm.at(i + 3), b[3]);
  y[v] = out;
  // Element 4 * v + k is bit (4 * lane + k) % 32 of word v / 8 (blocks of
  // 256 threads: lanes 8j .. 8j + 7 share a word).
  const unsigned lane = threadIdx.x % 32;
  std::uint32_t bits = 0;
  for (int k = 0; k < 4; ++k) bits |= std::uint32_t{b[k]} << ((4 * lane + k) % 32);
  // 8 lanes share a word: OR them together.
  for (int s = 1; s < 8; s <<= 1) bits |= __shfl_xor_sync(0xffffffffu, bits, s);
  if (lane % 8 == 0) mask[i / 32] = bits;
}

__global__ void count_mismatch(const std::uint32_t* a, const std::uint32_t* b, std::int64_t n,
                               unsigned long long* bad) {
  const std::int64_t i = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i < n && a[i] != b[i]) atomicAdd(bad, 1ull);
}

// Median of 20 event timings of work() after 3 warm-up runs, ms.
template <class Work>
float median_ms(Work work) {
  cudaEvent_t a, b;
  QGRAD_CUDA_CHECK(cudaEventCreate(&a));
  QGRAD_CUDA_CHECK(cudaEventCreate(&b));
  std::vector<float> ms;
  for (int r = 0; r < 23; ++r) {
    QGRAD_CUDA_CHECK(cudaEventRecord(a));
    work();
    QGRAD_CUDA_CHECK(cudaEventRecord(b));
    QGRAD_CUDA_CHECK(cudaEventSynchronize(b));
    float t = 0;
    QGRAD_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    if (r >= 3) ms.push_back(t);
  }
  QGRAD_CUDA_CHECK(cudaEventDestroy(a));
  QGRAD_CUDA_CHECK(cudaEventDestroy(b));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

template <class Op>
float time_kernel(const float* x, float* y, std::uint32_t* mask, Params prm, Op op) {
  const std::int64_t nv = kN / 4;
  const unsigned blocks = static_cast<unsigned>(nv / 256);
  return median_ms([&] {
    fake_quant_kernel<<<blocks, 256>>>(reinterpret_cast<const float4*>(x), reinterpret_cast<float4*>(y), mask, nv,
                                       prm, op);
    QGRAD_CUDA_CHECK(cudaGetLastError());
  });
}

unsigned long long mismatches(const void* a, const void* b, std::int64_t words, unsigned long long* bad) {
  QGRAD_CUDA_CHECK(cudaMemset(bad, 0, sizeof *bad));
  count_mismatch<<<static_cast<unsigned>((words + 255) / 256), 256>>>(static_cast<const std::uint32_t*>(a),
                                                                      static_cast<const std::uint32_t*>(b), words, bad);
  QGRAD_CUDA_CHECK(cudaGetLastError());
  unsigned long long h = 0;
  QGRAD_CUDA_CHECK(cudaMemcpy(&h, bad, sizeof h, cudaMemcpyDeviceToHost));
  return h;
}

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("dev_fake_quant_forms: no CUDA device\n");
    return 0;
  }
  // Inputs on the host: a fixed LCG's uniform values over the int8 range of
  // the scales below and past it, plus the edges.
  std::vector<float> hx(static_cast<std::size_t>(kN));
  std::uint64_t s = 0x9e3779b97f4a7c15ull;
  for (auto& v : hx) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    const double u = static_cast<double>(s >> 11) * (1.0 / 9007199254740992.0);
    v = static_cast<float>((u - 0.5) * 80.0);
  }
  const float edges[] = {0.0625f, 0.1875f, -0.0625f, -0.3125f, 0.0f, -0.0f, 1e30f, -1e30f, INFINITY, -INFINITY, NAN,
                         16.0f,   -16.5f,  15.875f,  -16.0f};
  for (std::size_t k = 0; k < hx.size(); k += 997) hx[k] = edges[(k / 997) % (sizeof edges / sizeof edges[0])];
  std::vector<float> hs(kChannels);
  std::vector<std::int32_t> hz(kChannels);
  for (std::int64_t c = 0; c < kChannels; ++c) {
    hs[static_cast<std::size_t>(c)] = 0.125f * static_cast<float>(1 + c % 7) / 3.0f;
    hz[static_cast<std::size_t>(c)] = static_cast<std::int32_t>(c % 19) - 9;
  }
  float *x, *y0, *y1, *copy, *scale;
  std::int32_t* zp;
  std::uint32_t *m0, *m1;
  unsigned long long* bad;
  const std::size_t bytes = sizeof(float) * static_cast<std::size_t>(kN), mbytes = static_cast<std::size_t>(kN) / 8;
  QGRAD_CUDA_CHECK(cudaMalloc(&x, bytes));
  QGRAD_CUDA_CHECK(cudaMalloc(&y0, bytes));
  QGRAD_CUDA_CHECK(cudaMalloc(&y1, bytes));
  QGRAD_CUDA_CHECK(cudaMalloc(&copy, bytes));
  QGRAD_CUDA_CHECK(cudaMalloc(&m0, mbytes));
  QGRAD_CUDA_CHECK(cudaMalloc(&m1, mbytes));
  QGRAD_CUDA_CHECK(cudaMalloc(&scale, sizeof(float) * kChannels));
  QGRAD_CUDA_CHECK(cudaMalloc(&zp, sizeof(std::int32_t) * kChannels));
  QGRAD_CUDA_CHECK(cudaMalloc(&bad, sizeof *bad));
  QGRAD_CUDA_CHECK(cudaMemcpy(x, hx.data(), bytes, cudaMemcpyHostToDevice));
  QGRAD_CUDA_CHECK(cudaMemcpy(scale, hs.data(), sizeof(float) * kChannels, cudaMemcpyHostToDevice));
  QGRAD_CUDA_CHECK(cudaMemcpy(zp, hz.data(), sizeof(std::int32_t) * kChannels, cudaMemcpyHostToDevice));

  // The copy: read and write the same bytes as a fake quant (the mask aside).
  const float copy_ms =
      median_ms([&] { QGRAD_CUDA_CHECK(cudaMemcpyAsync(copy, x, bytes, cudaMemcpyDeviceToDevice)); });
  std::printf("device-to-device copy of 1 GiB: %.4f ms\n", copy_ms);

  int failures = 0;
  const auto run = [&](const char* name, Params prm, auto old_form, auto new_form) {
    const float t0 = time_kernel(x, y0, m0, prm, old_form);
    const float t1 = time_kernel(x, y1, m1, prm, new_form);
    const unsigned long long dy = mismatches(y0, y1, kN, bad), dm = mismatches(m0, m1, kN / 32, bad);
    failures += dy != 0 || dm != 0;
    std::printf("%-12s library (int64) form %.4f ms (%.0f%% of copy), float form %.4f ms (%.0f%% of copy): %.2fx; "
                "value mismatches %llu, mask word mismatches %llu\n",
                name, t0, 100.0 * copy_ms / t0, t1, 100.0 * copy_ms / t1, t0 / t1, dy, dm);
  };
  run("per tensor", Params{scale, zp, kN, 1}, LibraryForm<false>{-128, 127}, FloatForm{-128, 127});
  run("per channel", Params{scale, zp, kInner, kChannels}, LibraryForm<true>{-128, 127}, FloatForm{-128, 127});
  run("u8 tensor", Params{scale, zp, kN, 1}, LibraryForm<false>{0, 255}, FloatForm{0, 255});
  std::printf(failures == 0 ? "forms agree bit for bit\n" : "FORMS DIFFER\n");
  return failures == 0 ? 0 : 1;
}
