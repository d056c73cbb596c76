// Benchmarks of the training ops the QAT step is made of, on CUDA: relu
// forward/backward, the observer's min/max, the fused SGD step, cross-entropy
// forward + backward, linear forward + backward and scaled_dot_product_attention
// forward / backward (a ViT shape and sequence length 1024; the L = 1024 case
// is also timed on the CPU, with a small B * H, before the CUDA rows).
// Memory-bound cases report
// GB/s and the fraction of the copy bandwidth measured in the same run;
// linear reports TFLOP/s and the fraction of the f32 (non-tensor-core) peak.
// JSON lines; bench/peer_train_ops.py measures PyTorch under the same keys.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "bench_common.h"
#include "qgrad/kernels/observer.h"

using namespace qgrad;
using namespace qgrad::bench;

namespace {

constexpr std::int64_t kRows = 8192, kCols = 8192, kN = kRows * kCols;  // 64M elements
constexpr double kF32PeakTflops = 67.0;  // H100 SXM, FP32 without tensor cores

TensorOptions on_gpu(DType dt = DType::f32) { return TensorOptions{}.with_dtype(dt).with_device(Device::cuda()); }

void report(const std::string& name, const Timing& t, double bytes, double copy_gbs, const std::string& dev) {
  const double gbs = bytes / (t.median_ms * 1e-3) / 1e9;
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "{\"bench\":\"train_ops\",\"impl\":\"qgrad\",\"case\":\"%s\",\"ms\":%.4f,\"min_ms\":%.4f,\"gbs\":%.1f,"
                "\"copy_gbs\":%.1f,\"fraction_of_copy\":%.3f,\"device\":\"%s\"}",
                name.c_str(), t.median_ms, t.min_ms, gbs, copy_gbs, gbs / copy_gbs, dev.c_str());
  emit(buf);
}

void report_flops(const std::string& name, const Timing& t, double flops, const std::string& dev) {
  const double tflops = flops / (t.median_ms * 1e-3) / 1e12;
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "{\"bench\":\"train_ops\",\"impl\":\"qgrad\",\"case\":\"%s\",\"ms\":%.4f,\"min_ms\":%.4f,"
                "\"tflops\":%.2f,\"f32_peak_fraction\":%.3f,\"device\":\"%s\"}",
                name.c_str(), t.median_ms, t.min_ms, tflops, tflops / kF32PeakTflops, dev.c_str());
  emit(buf);
}

// Attention FLOPs: forward 2 GEMMs of 2 * L * S * D each; backward 4 (dV, dA, dQ, dK).
double sdpa_flops(std::int64_t bh, std::int64_t L, std::int64_t D, bool backward) {
  return (backward ? 4.0 : 2.0) * 2.0 * static_cast<double>(bh) * static_cast<double>(L * L * D);
}

// Forward (no grad) and backward (the recorded node's rule alone) of
// scaled_dot_product_attention at [B, H, L, D], on `opt`'s device; `time`
// is time_cuda or the CPU timer.
template <class Timer>
void sdpa_rows(const std::string& tag, std::int64_t B, std::int64_t H, std::int64_t L, std::int64_t D,
               TensorOptions opt, const std::string& dev, Timer time) {
  Generator gen(0x5d);
  Tensor q = randn({B, H, L, D}, gen, opt), k = randn({B, H, L, D}, gen, opt), v = randn({B, H, L, D}, gen, opt);
  {
    NoGradGuard ng;
    report_flops("sdpa_fw_" + tag, time([&](int) { scaled_dot_product_attention(q, k, v); }),
                 sdpa_flops(B * H, L, D, false), dev);
    report_flops("sdpa_causal_fw_" + tag, time([&](int) { scaled_dot_product_attention(q, k, v, Tensor(), true); }),
                 sdpa_flops(B * H, L, D, false), dev);
  }
  for (Tensor* t : {&q, &k, &v}) t->set_requires_grad(true);
  Tensor y = scaled_dot_product_attention(q, k, v);
  Tensor dy = randn(y.shape(), gen, opt);
  report_flops("sdpa_bw_" + tag, time([&](int) { y.grad_fn()->backward(dy); }), sdpa_flops(B * H, L, D, true), dev);
}

// Median wall time of `work` on the CPU.
Timing time_cpu(const std::function<void(int)>& work, int reps = 7, int warmup = 1) {
  for (int i = 0; i < warmup; ++i) work(i);
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    work(i);
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return Timing{ms[ms.size() / 2], ms.front(), reps};
}

}  // namespace

int main() {
  // The CPU row of attention at L = 1024 (B * H = 2, D = 64): runs anywhere.
  sdpa_rows("l1024_b1_h2_d64", 1, 2, 1024, 64, TensorOptions{}, "cpu",
            [](const std::function<void(int)>& w) { return time_cpu(w); });
  if (!cuda_available()) {
    std::printf("bench_train_ops: no CUDA device present; nothing measured\n");
    return 0;
  }
  const std::string dev = cuda_device_name(0);
  const double copy = copy_bandwidth_gbs(static_cast<std::size_t>(kN) * 4);
  const double n = static_cast<double>(kN), f4 = 4.0 * n, mask = n / 8.0;
  Generator gen(0x7b);
  Tensor x = randn({kRows, kCols}, gen, on_gpu());
  Tensor dy = randn({kRows, kCols}, gen, on_gpu());
  {
    NoGradGuard ng;
    report("relu_fw", time_cuda([&](int) { relu(x); }), 2 * f4, copy, dev);
    Tensor mn = full({1}, INFINITY, on_gpu()), mx = full({1}, -INFINITY, on_gpu());
    report("observer_minmax_per_tensor",
           time_cuda([&](int) { kernels::observer_minmax(x, mn, mx, -1, 0.01); }), f4, copy, dev);
    Tensor cmn = full({kRows}, INFINITY, on_gpu()), cmx = full({kRows}, -INFINITY, on_gpu());
    report("observer_minmax_per_channel",
           time_cuda([&](int) { kernels::observer_minmax(x, cmn, cmx, 0, 0.01); }), f4, copy, dev);
  }
  {
    Tensor xl = x.detach();
    xl.set_requires_grad(true);
    Tensor y = relu(xl);
    report("relu_bw", time_cuda([&](int) { y.grad_fn()->backward(dy); }), f4 + mask + f4, copy, dev);
  }
  {  // one 64M-element parameter: read p, g, momentum; write p, momentum
    Tensor p = randn({kN}, gen, on_gpu());
    p.set_requires_grad(true);
    nn::SGDOptions o;
    o.lr = 1e-6;
    o.momentum = 0.9;
    nn::SGD opt({{"p", p}}, o);
    p.set_grad(randn({kN}, gen, on_gpu()));
    report("sgd_momentum_step", time_cuda([&](int) { opt.step(); }), 5 * f4, copy, dev);
  }
  {  // cross-entropy forward + backward over [65536, 1000] logits
    const std::int64_t B = 65536, C = 1000;
    Tensor logits = randn({B, C}, gen, on_gpu());
    logits.set_requires_grad(true);
    Tensor labels = randint(0, C, {B}, gen, on_gpu(DType::s64));
    const double bytes = 4.0 * static_cast<double>(B * C) * 4;  // fw: read, write probs; bw: read probs, write dx
    report("cross_entropy_fwbw", time_cuda([&](int) {
             logits.zero_grad();
             cross_entropy(logits, labels).backward();
           }, 20, 3),
           bytes, copy, dev);
  }
  {  // linear forward + backward, [4096, 1024] x [1024, 1024]^T + bias
    const std::int64_t M = 4096, K = 1024, N = 1024;
    Tensor a = randn({M, K}, gen, on_gpu()), w = randn({N, K}, gen, on_gpu()), b = randn({N}, gen, on_gpu());
    a.set_requires_grad(true);
    w.set_requires_grad(true);
    b.set_requires_grad(true);
    Tensor g = randn({M, N}, gen, on_gpu());
    report_flops("linear_fwbw_4096x1024x1024", time_cuda([&](int) {
                   a.zero_grad();
                   w.zero_grad();
                   b.zero_grad();
                   linear(a, w, b).backward(g);
                 }, 30, 3),
                 3.0 * 2.0 * static_cast<double>(M * N * K), dev);
  }
  // Attention at the ViT shape (B = 256, H = 4, L = 50, D = 32) and at L = 1024.
  auto gpu_timer = [](const std::function<void(int)>& w) { return time_cuda(w, 30, 3); };
  sdpa_rows("vit_b256_h4_l50_d32", 256, 4, 50, 32, on_gpu(), dev, gpu_timer);
  sdpa_rows("l1024_b8_h4_d32", 8, 4, 1024, 32, on_gpu(), dev, gpu_timer);
  return 0;
}
