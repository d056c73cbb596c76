// A/B of two versions of the W4A16 decode GEMVs (kernels/cuda/w4a16_gemv.cuh)
// without a library build (see run.sh). For M rows of x (argv[1]), N = K =
// 4096, s4 weights in groups of 128, bf16 x, bf16 and f32 scales: the two
// outputs compared bit for bit and B's against a host reference (f64 sums of
// x times the bf16 weight), then µs per layer, 3 rounds alternating A and B:
// the kernel back to back (24 launches over 12 weights, 8 MiB each: together
// past L2), a captured 24-layer chain y_i = W_i y_(i-1) over the same
// rotating weights (a decode step), and that chain over one weight, which
// stays in L2 (the layer without its HBM read). With QGRAD_AB_FRAG=1 in the
// environment both versions get the weights in pack_w4a16's fragment order
// (W4a16GemvArgs::w_fragments), packed here on the host.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "qgrad/core/cuda/common.cuh"
#include "qgrad/core/half.h"
#include "qgrad/kernels/formulas/lowbit_linear.h"  // the fragment order
#include "qgrad/dev/cuda/graph_timing.cuh"  // replay_median_ms
#include "qgrad/kernels/cuda/w4a16_gemv.cuh"  // W4a16GemvArgs (the versions must agree on it)

namespace {
cudaStream_t g_stream = nullptr;
}

// The library's host helpers that the header's launchers call
// (core/cuda/common.cuh), for device 0 and this program's stream.
namespace qgrad::cuda {
[[noreturn]] void throw_cuda_error(cudaError_t err, const char* what, const char* file, int line) {
  std::fprintf(stderr, "CUDA error %s at %s (%s:%d)\n", cudaGetErrorString(err), what, file, line);
  throw std::runtime_error("cuda");
}
cudaStream_t stream(int) { return g_stream; }
bool programmatic_launch(int) { return true; }
}  // namespace qgrad::cuda

using qgrad::bfloat16;
using Args = qgrad::kernels::cuda::W4a16GemvArgs<bfloat16>;
namespace qgrad::kernels::cuda {
void w4a16_decode_a(const Args&);
void w4a16_decode_b(const Args&);
}  // namespace qgrad::kernels::cuda

namespace {

constexpr int N = 4096, K = 4096, G = 128, kCopies = 12, kLayers = 24;
using Launch = void (*)(const Args&);

#define CHECK_CUDA(expr) QGRAD_CUDA_CHECK(expr)

template <class T>
T* device_copy(const std::vector<T>& h) {
  T* d = nullptr;
  CHECK_CUDA(cudaMalloc(&d, h.size() * sizeof(T)));
  CHECK_CUDA(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

struct Problem {
  int M = 1;
  bool frag = false;  // weights in the fragment order
  std::vector<std::uint8_t> w0;  // copy 0 on the host, for the reference
  std::vector<bfloat16> s0, x;
  std::uint8_t* w[kCopies];
  float* sf[kCopies];     // f32 scales (the bf16 values widened: the same weight)
  bfloat16* st[kCopies];  // bf16 scales
  bfloat16* dx = nullptr;
  bfloat16* y[2] = {nullptr, nullptr};
};

Args args_of(const Problem& p, int copy, bool t_scale, const bfloat16* x, bfloat16* out) {
  Args a{x, p.w[copy], t_scale ? static_cast<const void*>(p.st[copy]) : static_cast<const void*>(p.sf[copy]),
         nullptr, nullptr, out, p.M, N, K, G, /*w_signed=*/true, /*scale_in_t=*/t_scale, 0};
  a.w_fragments = p.frag;
  return a;
}

double back_to_back_us(const Problem& p, Launch f, bool t_scale) {
  auto work = [&] {
    for (int i = 0; i < kLayers; ++i) f(args_of(p, i % kCopies, t_scale, p.dx, p.y[0]));
  };
  work();
  return replay_median_ms(g_stream, work) * 1e3 / kLayers;
}

double chain_us(const Problem& p, Launch f, bool t_scale, bool rotate) {
  f(args_of(p, 0, t_scale, p.dx, p.y[0]));  // first launch (its attributes) outside the capture
  CHECK_CUDA(cudaStreamSynchronize(g_stream));
  cudaGraph_t graph;
  CHECK_CUDA(cudaStreamBeginCapture(g_stream, cudaStreamCaptureModeRelaxed));
  for (int i = 0; i < kLayers; ++i)
    f(args_of(p, rotate ? i % kCopies : 0, t_scale, i == 0 ? p.dx : p.y[(i - 1) % 2], p.y[i % 2]));
  CHECK_CUDA(cudaStreamEndCapture(g_stream, &graph));
  cudaGraphExec_t exec;
  CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  const double us = replay_median_ms(g_stream, [&] { CHECK_CUDA(cudaGraphLaunch(exec, g_stream)); }) * 1e3 / kLayers;
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return us;
}

std::vector<std::uint16_t> run_once(const Problem& p, Launch f, bool t_scale) {
  std::vector<std::uint16_t> poison(static_cast<std::size_t>(p.M) * N, 0x7fc1);  // NaN bits
  CHECK_CUDA(cudaMemcpy(p.y[1], poison.data(), poison.size() * 2, cudaMemcpyHostToDevice));
  f(args_of(p, 0, t_scale, p.dx, p.y[1]));
  CHECK_CUDA(cudaStreamSynchronize(g_stream));
  std::vector<std::uint16_t> out(poison.size());
  CHECK_CUDA(cudaMemcpy(out.data(), p.y[1], out.size() * 2, cudaMemcpyDeviceToHost));
  return out;
}

// B against f64 sums of x times the documented weight bf16((q - 8) * s):
// within one bf16 ulp of the reference plus a loose bound of the f32 (tensor-core)
// accumulation over sum |x w| (a wrong nibble, scale or row is off by far more).
double worst_error(const Problem& p, const std::vector<std::uint16_t>& y) {
  double worst = 0;
  for (int m = 0; m < p.M; ++m)
    for (int n = 0; n < N; ++n) {
      double ref = 0, mag = 0;
      for (int k = 0; k < K; ++k) {
        const int byte = p.w0[static_cast<std::size_t>(n) * (K / 2) + k / 2];
        const int q = ((k & 1) ? byte >> 4 : byte & 15) ^ 8;  // s4 as u + 8
        const float wv = static_cast<float>(bfloat16((q - 8) * static_cast<float>(p.s0[static_cast<std::size_t>(n) * (K / G) + k / G])));
        const double t = static_cast<double>(static_cast<float>(p.x[static_cast<std::size_t>(m) * K + k])) * wv;
        ref += t;
        mag += std::fabs(t);
      }
      const float got = qgrad::bf16_bits_to_float(y[static_cast<std::size_t>(m) * N + n]);
      const double err = std::fabs(got - ref) / (std::fabs(ref) * 0x1p-7 + mag * 0x1p-14);
      worst = std::max(worst, std::isfinite(err) ? err : 1e30);
    }
  return worst;  // <= 1: within the bound
}

}  // namespace

int main(int argc, char** argv) {
  Problem p;
  p.M = argc > 1 ? std::atoi(argv[1]) : 1;
  if (p.M < 1 || p.M > 64) {
    std::fprintf(stderr, "M in [1, 64]\n");
    return 1;
  }
  p.frag = std::getenv("QGRAD_AB_FRAG") && std::string(std::getenv("QGRAD_AB_FRAG")) == "1";
  if (p.frag) std::printf("weights in the fragment order\n");
  CHECK_CUDA(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(0.01f, 0.02f);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int c = 0; c < kCopies; ++c) {
    std::vector<std::uint8_t> w(static_cast<std::size_t>(N) * K / 2);
    for (auto& b : w) b = static_cast<std::uint8_t>(byte(rng));
    std::vector<bfloat16> st(static_cast<std::size_t>(N) * (K / G));
    std::vector<float> sf(st.size());
    for (std::size_t i = 0; i < st.size(); ++i) {
      st[i] = bfloat16(scale(rng));
      sf[i] = static_cast<float>(st[i]);
    }
    if (p.frag) {  // N and K are multiples of 32 and 128: no padding
      std::vector<std::uint8_t> f(w.size());
      for (std::int64_t ch = 0; ch < static_cast<std::int64_t>(f.size()) / 16; ++ch) {
        const auto at = qgrad::formulas::w4a16_frag_chunk(ch, K);
        for (int j = 0; j < 4; ++j) {
          std::uint32_t plain = 0;
          for (int b = 0; b < 4; ++b) plain |= static_cast<std::uint32_t>(w[at.n * (K / 2) + at.k / 2 + 4 * j + b]) << (8 * b);
          const std::uint32_t fw = qgrad::formulas::w4a16_frag_word(plain);
          for (int b = 0; b < 4; ++b) f[ch * 16 + 4 * j + b] = static_cast<std::uint8_t>(fw >> (8 * b));
        }
      }
      p.w[c] = device_copy(f);
    } else {
      p.w[c] = device_copy(w);
    }
    p.st[c] = device_copy(st);
    p.sf[c] = device_copy(sf);
    if (c == 0) {
      p.w0 = w;
      p.s0 = st;
    }
  }
  p.x.resize(static_cast<std::size_t>(p.M) * K);
  for (auto& v : p.x) v = bfloat16(normal(rng));
  p.dx = device_copy(p.x);
  for (auto& y : p.y) CHECK_CUDA(cudaMalloc(&y, static_cast<std::size_t>(p.M) * N * 2));

  const Launch fa = qgrad::kernels::cuda::w4a16_decode_a, fb = qgrad::kernels::cuda::w4a16_decode_b;
  int status = 0;
  for (bool t_scale : {true, false}) {
    const char* sname = t_scale ? "bf16 scales" : "f32 scales";
    const auto ya = run_once(p, fa, t_scale), yb = run_once(p, fb, t_scale);
    std::size_t differ = 0;
    for (std::size_t i = 0; i < ya.size(); ++i) differ += ya[i] != yb[i];
    const double err = worst_error(p, yb);
    std::printf("M %d %s: a and b bit-identical: %s (%zu of %zu differ); b's worst error / bound %.3f%s\n", p.M,
                sname, differ ? "no" : "yes", differ, ya.size(), err, err > 1 ? "  OUT OF BOUND" : "");
    if (differ || err > 1) status = 2;
    for (int round = 1; round <= 3; ++round) {
      double r[2][3];
      for (int v = 0; v < 2; ++v) {
        const Launch f = v == 0 ? fa : fb;
        r[v][0] = back_to_back_us(p, f, t_scale);
        r[v][1] = chain_us(p, f, t_scale, /*rotate=*/true);
        r[v][2] = chain_us(p, f, t_scale, /*rotate=*/false);
      }
      std::printf("  round %d (us a layer): back to back a %.2f b %.2f | chain a %.2f b %.2f | chain, L2 weight a %.2f b %.2f\n",
                  round, r[0][0], r[1][0], r[0][1], r[1][1], r[0][2], r[1][2]);
    }
  }
  return status;
}
