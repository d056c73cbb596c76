// A/B of two versions of the fused QAT MLP kernel (kernels/cuda/qat_mlp.cu)
// without a library build (run.sh compiles each under renamed entry points,
// variant.cu): the b B x 784-H-H-10 problem built by hand, every output (the
// gradients, the observers' state, the qparams, the loss) compared bit for
// bit after each of 3 launches (the words that differ and the worst relative
// difference where they do), then µs a launch (200 back to back, 4
// alternating rounds) and the median phase stamps (qat_mlp_record_phases).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "qgrad/core/cuda/common.cuh"
#include "qgrad/kernels/qat_mlp.h"

// The library's host helpers that the kernel file calls (core/cuda/common.cuh),
// for device 0 and the default stream.
namespace qgrad::cuda {
[[noreturn]] void throw_cuda_error(cudaError_t err, const char* what, const char* file, int line) {
  std::fprintf(stderr, "CUDA error %s at %s (%s:%d)\n", cudaGetErrorString(err), what, file, line);
  throw std::runtime_error("cuda");
}
cudaStream_t stream(int) { return nullptr; }
int multiprocessor_count(int) {
  int n = 0;
  cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, 0);
  return n;
}
bool cooperative_launch(int) { return true; }
bool programmatic_launch(int) { return false; }
std::uint32_t* block_counters(int) {
  static std::uint32_t* p = nullptr;
  if (!p) {
    cudaMalloc(&p, kBlockCounters * sizeof(std::uint32_t));
    cudaMemset(p, 0, kBlockCounters * sizeof(std::uint32_t));
  }
  return p;
}
}  // namespace qgrad::cuda

namespace qgrad::kernels::cuda {
bool qat_mlp_plan_a(QatMlpArgs&);
void qat_mlp_forward_backward_a(const QatMlpArgs&);
void qat_mlp_record_phases_a(std::uint64_t*);
bool qat_mlp_plan_b(QatMlpArgs&);
void qat_mlp_forward_backward_b(const QatMlpArgs&);
void qat_mlp_record_phases_b(std::uint64_t*);
}  // namespace qgrad::kernels::cuda

using namespace qgrad::kernels;

namespace {

constexpr int kVariants = 2;
const char* const kNames[kVariants] = {"a", "b"};
bool (*const kPlan[kVariants])(QatMlpArgs&) = {cuda::qat_mlp_plan_a, cuda::qat_mlp_plan_b};
void (*const kRun[kVariants])(const QatMlpArgs&) = {cuda::qat_mlp_forward_backward_a, cuda::qat_mlp_forward_backward_b};
void (*const kPhases[kVariants])(std::uint64_t*) = {cuda::qat_mlp_record_phases_a, cuda::qat_mlp_record_phases_b};

std::uint64_t rng = 0x9e3779b97f4a7c15ULL;
float uniform(float lo, float hi) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return lo + (hi - lo) * static_cast<float>((rng >> 11) * (1.0 / 9007199254740992.0));
}

template <class T>
T* upload(const std::vector<T>& h) {
  T* d = nullptr;
  cudaMalloc(&d, h.size() * sizeof(T));
  cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice);
  return d;
}
template <class T>
std::vector<T> download(const T* d, std::size_t n) {
  std::vector<T> h(n);
  cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost);
  return h;
}

QatMlpQuant make_quant(int channels, bool weight) {
  QatMlpQuant q;
  q.run_min = upload(std::vector<float>(channels, INFINITY));
  q.run_max = upload(std::vector<float>(channels, -INFINITY));
  q.scale = upload(std::vector<float>(channels, 1.0f));
  q.zero_point = upload(std::vector<std::int32_t>(channels, 0));
  q.symmetric = weight;
  q.qmin = weight ? -128 : 0;
  q.qmax = 127;
  return q;
}

struct Problem {
  QatMlpArgs a;
  std::vector<std::pair<const void*, std::size_t>> outputs;  // device pointer, bytes
};

Problem make(const std::vector<int>& dims, int batch, const float* x, const std::int64_t* labels,
             const std::vector<std::vector<float>>& w, const std::vector<std::vector<float>>& b, int variant) {
  Problem p;
  QatMlpArgs& a = p.a;
  a.device = 0;
  a.batch = batch;
  a.x = x;
  a.labels = labels;
  a.labels_s64 = true;
  a.input_quant = make_quant(1, false);
  a.num_layers = static_cast<int>(dims.size()) - 1;
  const auto out = [&](const void* d, std::size_t bytes) { p.outputs.push_back({d, bytes}); };
  out(a.input_quant.run_min, 4);
  out(a.input_quant.scale, 4);
  out(a.input_quant.zero_point, 4);
  for (int i = 0; i < a.num_layers; ++i) {
    QatMlpLayer& l = a.layers[i];
    l.in_features = dims[i];
    l.out_features = dims[i + 1];
    l.weight = upload(w[i]);
    l.bias = upload(b[i]);
    float* wg = nullptr;
    float* bg = nullptr;
    cudaMalloc(&wg, w[i].size() * 4);
    cudaMalloc(&bg, b[i].size() * 4);
    l.weight_grad = wg;
    l.bias_grad = bg;
    l.relu = i + 1 < a.num_layers;
    l.weight_quant = make_quant(dims[i + 1], true);
    l.output_quant = make_quant(1, false);
    out(wg, w[i].size() * 4);
    out(bg, b[i].size() * 4);
    out(l.weight_quant.run_min, dims[i + 1] * 4);
    out(l.weight_quant.run_max, dims[i + 1] * 4);
    out(l.weight_quant.scale, dims[i + 1] * 4);
    out(l.weight_quant.zero_point, dims[i + 1] * 4);
    out(l.output_quant.run_min, 4);
    out(l.output_quant.run_max, 4);
    out(l.output_quant.scale, 4);
    out(l.output_quant.zero_point, 4);
  }
  float* loss = nullptr;
  cudaMalloc(&loss, 4);
  a.loss = loss;
  out(loss, 4);
  const bool ok = kPlan[variant](a);
  if (!ok) throw std::runtime_error("plan");
  float* ws = nullptr;
  cudaMalloc(&ws, a.offsets.total * 4);
  a.workspace = ws;
  return p;
}

void launch(const Problem& p, int variant) { kRun[variant](p.a); }

float us_per_launch(const Problem& p, int variant, int n) {
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  cudaEventRecord(e0);
  for (int i = 0; i < n; ++i) launch(p, variant);
  cudaEventRecord(e1);
  cudaEventSynchronize(e1);
  float ms = 0;
  cudaEventElapsedTime(&ms, e0, e1);
  return ms * 1000.0f / n;
}

}  // namespace

int main(int argc, char** argv) {
  const int batch = argc > 1 ? std::atoi(argv[1]) : 256, hidden = argc > 2 ? std::atoi(argv[2]) : 256;
  const std::vector<int> dims{784, hidden, hidden, 10};
  std::vector<float> xh(static_cast<std::size_t>(batch) * 784);
  for (float& v : xh) v = uniform(-2.0f, 2.5f);
  std::vector<std::int64_t> lh(batch);
  for (auto& v : lh) v = static_cast<std::int64_t>(uniform(0.0f, 9.999f));
  std::vector<std::vector<float>> w, b;
  for (std::size_t i = 0; i + 1 < dims.size(); ++i) {
    const float bound = 1.0f / std::sqrt(static_cast<float>(dims[i]));
    w.emplace_back(static_cast<std::size_t>(dims[i]) * dims[i + 1]);
    b.emplace_back(dims[i + 1]);
    for (float& v : w.back()) v = uniform(-bound, bound);
    for (float& v : b.back()) v = uniform(-bound, bound);
  }
  const float* x = upload(xh);
  const std::int64_t* labels = upload(lh);
  std::vector<Problem> probs;
  for (int v = 0; v < kVariants; ++v) probs.push_back(make(dims, batch, x, labels, w, b, v));
  for (int v = 0; v < kVariants; ++v) {
    const QatMlpArgs& a = probs[v].a;
    std::printf("%s: b%d h%d grid %d, splits (forward/weight grad/input grad)", kNames[v], batch, hidden, a.grid);
    for (int i = 0; i < a.num_layers; ++i)
      std::printf(" %d/%d/%d", a.layers[i].split_forward, a.layers[i].split_weight_grad, a.layers[i].split_input_grad);
    std::printf("\n");
  }
  bool same = true;
  for (int step = 0; step < 3; ++step) {
    for (int v = 0; v < kVariants; ++v) launch(probs[v], v);
    if (cudaDeviceSynchronize() != cudaSuccess) {
      std::printf("launch failed: %s\n", cudaGetErrorString(cudaGetLastError()));
      return 1;
    }
    for (int v = 1; v < kVariants; ++v) {
      std::size_t differing = 0;
      for (std::size_t k = 0; k < probs[0].outputs.size(); ++k) {
        const auto h0 = download(static_cast<const unsigned char*>(probs[0].outputs[k].first), probs[0].outputs[k].second);
        const auto hv = download(static_cast<const unsigned char*>(probs[v].outputs[k].first), probs[v].outputs[k].second);
        if (h0 != hv) {
          ++differing;
          const std::size_t nf = h0.size() / 4;
          double worst = 0;
          std::size_t nd = 0;
          for (std::size_t e = 0; e < nf; ++e) {
            float x0, x1;
            std::memcpy(&x0, &h0[e * 4], 4);
            std::memcpy(&x1, &hv[e * 4], 4);
            if (std::memcmp(&x0, &x1, 4)) {
              ++nd;
              worst = std::max(worst, std::fabs(double(x0) - double(x1)) / std::max(1e-30, std::fabs(double(x0))));
            }
          }
          std::printf("  output %zu: %zu of %zu words differ, worst rel %.3g\n", k, nd, nf, worst);
        }
      }
      std::printf("step %d: loss %.6f; %s differs from a in %zu of %zu outputs\n", step, download(probs[0].a.loss, 1)[0],
                  kNames[v], differing, probs[0].outputs.size());
      same = same && differing == 0;
    }
  }
  std::printf("all variants bit-identical: %s\n", same ? "yes" : "NO");
  for (int r = 0; r < 4; ++r) {
    std::printf("round %d (us a launch, 200 back to back):", r);
    for (int v = 0; v < kVariants; ++v) std::printf("  %c %.2f", 'a' + v, us_per_launch(probs[v], v, 200));
    std::printf("\n");
  }
  std::uint64_t* words = nullptr;
  cudaMalloc(&words, 9 * 8);
  for (int v = 0; v < kVariants; ++v) {
    kPhases[v](words);
    std::vector<std::vector<double>> us(9);
    for (int s = 0; s < 30; ++s) {
      launch(probs[v], v);
      cudaDeviceSynchronize();
      const auto h = download(words, 9);
      for (int k = 1; k < 9; ++k) us[k].push_back((h[k] - h[k - 1]) / 1000.0);
      us[0].push_back((h[8] - h[0]) / 1000.0);
    }
    std::printf("%c phases, median us (total, weights, l1, l2, l3, loss, b3, b2, b1): ", 'a' + v);
    for (auto& u : us) {
      std::sort(u.begin(), u.end());
      std::printf("%.1f ", u[u.size() / 2]);
    }
    std::printf("\n");
    kPhases[v](nullptr);
  }

  return same ? 0 : 2;
}
