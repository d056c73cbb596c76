// Benchmarks of the training ops the QAT step is made of, on CUDA: relu
// forward/backward, the observer's min/max, the fused SGD step, cross-entropy
// forward + backward, linear forward + backward and scaled_dot_product_attention
// forward / backward (a ViT shape and sequence length 1024; the L = 1024 case
// is also timed on the CPU, with a small B * H, before the CUDA rows); then
// the transformer ops of issue #13 (layer_norm, rms_norm, gelu in both forms,
// silu, softmax, dropout, embedding, batched matmul, permute, cat, slice),
// each forward (no grad) and backward (its node's rule alone).
// Memory-bound cases report
// GB/s and the fraction of the copy bandwidth measured in the same run;
// linear reports TFLOP/s and the fraction of the f32 (non-tensor-core) peak.
// JSON lines; bench/peer_train_ops.py measures PyTorch under the same keys.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>
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

// Forward (no grad) and backward (the node's rule alone) of y = op(inputs):
// rows "<name>_fw" and "<name>_bw" with their bytes (memory-bound ops) or
// FLOPs (flops > 0). Each is timed eagerly and as a replay of its capture in
// a CudaGraph (no host work per call: the kernels alone, as PyTorch's
// captured rows); the faster is the row, both are also "<row>_eager" and
// "<row>_graph".
// QGRAD_BENCH_ONLY (comma-separated parts of names; peer_train_ops.py reads
// it too) keeps only the matching rows of this form.
template <class Op>
void fw_bw_rows(const std::string& name, std::vector<Tensor> inputs, Op op, double fw_bytes, double bw_bytes,
                double copy, const std::string& dev, double fw_flops = 0, double bw_flops = 0) {
  if (const char* only = std::getenv("QGRAD_BENCH_ONLY")) {
    bool selected = false;
    std::istringstream parts(only);
    for (std::string part; !selected && std::getline(parts, part, ',');)
      selected = !part.empty() && name.find(part) != std::string::npos;
    if (!selected) return;
  }
  auto emit_rows = [&](const std::string& row, const std::function<void()>& call, double bytes, double flops) {
    const Timing eager = time_cuda([&](int) { call(); }, 30, 3);
    CudaGraph graph;
    graph.capture(call);
    const Timing replay = time_cuda([&](int) { graph.replay(); }, 30, 3);
    auto one = [&](const std::string& n, const Timing& t) {
      if (flops > 0) report_flops(n, t, flops, dev);
      else report(n, t, bytes, copy, dev);
    };
    one(row + "_eager", eager);
    one(row + "_graph", replay);
    one(row, replay.median_ms < eager.median_ms ? replay : eager);
  };
  {
    NoGradGuard ng;
    emit_rows(name + "_fw", [&] { op(inputs); }, fw_bytes, fw_flops);
  }
  for (Tensor& t : inputs)
    if (is_floating(t.dtype())) t.set_requires_grad(true);
  Tensor y = op(inputs);
  Generator gen(0x9c);
  Tensor dy = randn(y.shape(), gen, TensorOptions{}.with_dtype(y.dtype()).with_device(y.device()));
  emit_rows(name + "_bw", [&] { y.grad_fn()->backward(dy); }, bw_bytes, bw_flops);
}

// The transformer ops (issue #13 item 5) at sizes where their kernels, not
// launches, are timed: rows [8192, 1024] f32 (32 MiB) for the row and
// elementwise ops; bytes count each tensor read or written once.
void transformer_rows(double copy, const std::string& dev) {
  const std::int64_t R = 8192, D = 1024;
  const double f = 4.0 * static_cast<double>(R * D), row_stats = 8.0 * static_cast<double>(R);
  Generator gen(0x3e);
  const Tensor x = randn({R, D}, gen, on_gpu()), w = randn({D}, gen, on_gpu()), b = randn({D}, gen, on_gpu());
  using V = std::vector<Tensor>;
  fw_bw_rows("layer_norm_8192x1024", V{x, w, b}, [&](const V& in) { return layer_norm(in[0], {D}, in[1], in[2]); },
             2 * f + row_stats, 3 * f + row_stats, copy, dev);
  fw_bw_rows("rms_norm_8192x1024", V{x, w}, [&](const V& in) { return rms_norm(in[0], {D}, in[1]); },
             2 * f + row_stats / 2, 3 * f + row_stats / 2, copy, dev);
  fw_bw_rows("gelu_8192x1024", V{x}, [](const V& in) { return gelu(in[0]); }, 2 * f, 3 * f, copy, dev);
  fw_bw_rows("gelu_tanh_8192x1024", V{x}, [](const V& in) { return gelu(in[0], GeluApproximate::tanh); }, 2 * f,
             3 * f, copy, dev);
  fw_bw_rows("silu_8192x1024", V{x}, [](const V& in) { return silu(in[0]); }, 2 * f, 3 * f, copy, dev);
  fw_bw_rows("softmax_8192x1024", V{x}, [](const V& in) { return softmax(in[0], -1); }, 2 * f, 3 * f, copy, dev);
  // dropout: the forward writes y and its mask (1 bit an element); the backward reads dy and the mask.
  fw_bw_rows("dropout_p0.1_8192x1024", V{x}, [&](const V& in) { return dropout(in[0], 0.1, true, gen); },
             2 * f + f / 32, 2 * f + f / 32, copy, dev);
  {  // embedding: 65536 lookups of rows of 256 in a [32768, 256] table; the backward's dense gradient
    const std::int64_t V_ = 32768, E = 256, N = 65536;
    const Tensor table = randn({V_, E}, gen, on_gpu());
    const Tensor idx = randint(0, V_, {N}, gen, on_gpu(DType::s64));
    const double rows = 4.0 * static_cast<double>(N * E);
    fw_bw_rows("embedding_32768x256_n65536", V{table, idx}, [](const V& in) { return embedding(in[0], in[1]); },
               2 * rows + 8.0 * N, rows + 4.0 * static_cast<double>(V_ * E) + 8.0 * N, copy, dev);
  }
  {  // batched matmul [512, 128, 64] x [512, 64, 128]
    const std::int64_t Bm = 512, M = 128, K = 64, N = 128;
    const double fl = 2.0 * static_cast<double>(Bm * M * K * N);
    fw_bw_rows("matmul_b512_128x64x128", V{randn({Bm, M, K}, gen, on_gpu()), randn({Bm, K, N}, gen, on_gpu())},
               [](const V& in) { return matmul(in[0], in[1]); }, 0, 0, copy, dev, fl, 2 * fl);
  }
  {  // permute [64, 256, 16, 64] -> (0, 2, 1, 3): a head split's copy
    const Tensor t = randn({64, 256, 16, 64}, gen, on_gpu());
    const double bytes = 2.0 * 4.0 * static_cast<double>(t.numel());
    fw_bw_rows("permute_0213_64x256x16x64", V{t}, [](const V& in) { return permute(in[0], {0, 2, 1, 3}); }, bytes,
               bytes, copy, dev);
  }
  fw_bw_rows("cat_2x8192x1024_dim1", V{x, randn({R, D}, gen, on_gpu())},
             [](const V& in) { return cat({in[0], in[1]}, 1); }, 4 * f, 4 * f, copy, dev);
  // slice x[:, 256:768]: the forward copies half of x; the backward writes x's shape (zeros outside).
  fw_bw_rows("slice_8192x1024_cols256_768", V{x}, [](const V& in) { return slice(in[0], 1, 256, 768); }, f, f + f / 2,
             copy, dev);
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
  transformer_rows(copy, dev);
  return 0;
}
