// The QAT training steps of bench/peer_train_step.py: a 784-H-H-10 MLP
// (nn::Sequential of Linear/ReLU) and a small CNN, prepared with prepare_qat and the default
// QAT qconfig (per-channel symmetric s8 weight fake quant, per-tensor u8
// activation fake quant with moving-average observers), cross-entropy, SGD
// with momentum 0.9, gradients set to none before each step.
//
// Cases (same "case" keys as the peer, plus "_graph" variants):
//   qat_step_cuda_b256_h256, qat_step_cuda_b4096_h1024: eager steps, each
//     bracketed by CUDA events and synchronised (as the peer does), median
//     over >= 200 steps after 20 warm-up steps;
//   ..._graph: the same step captured once in a CudaGraph (after the eager
//     warm-up) and replayed; each timed step copies the next batch into the
//     static inputs the graph reads, then replays;
//   ..._graph_in_order: the same, captured with programmatic dependent
//     launch off (cuda_set_programmatic_launch(false)), its replays
//     alternating with those of ..._graph;
//   qat_step_cpu_b256_h256: 2 OpenMP threads, wall-clock median;
//   qat_step_cuda_b4096_h1024_tf32x3 (+ _graph): the b4096 MLP with its
//     f32 products as tf32x3 (set_float32_matmul: f32's accuracy on TF32
//     tensor cores, docs/ops.md "linear"); the peer's is qat_step_cuda_b4096_h1024;
//   qat_cnn_step_cuda_b256_w32 (+ _graph), qat_cnn_step_cpu_b64_w32: the
//     same for the CNN of bench/qat_cnn.h (two Conv-BN-ReLU-MaxPool blocks
//     of 32 and 64 channels, fused into ConvBnReLU2d by prepare_qat, and a
//     linear head) on [B, 1, 28, 28] inputs;
//   qat_cnn_step_cuda_b256_w32_tf32 (+ _graph): the same CNN with TF32
//     convolutions allowed (set_conv_allow_tf32), PyTorch's default math for
//     them (the peer runs so);
//   qat_vit_step_cuda_b256 (+ _graph): the ViT of bench/qat_vit.h (the
//     qgrad-qat-vit model: 6 blocks of width 128, 49 tokens) prepared with
//     the 8da8w recipe, AdamW with the global gradient norm clipped to 1
//     (no CPU case: a step there takes about a second);
//   qat_vit_step_cuda_b256_tf32 (+ _graph): the same ViT with its f32
//     matmuls on TF32 tensor cores (set_matmul_allow_tf32; the peer sets
//     torch.backends.cuda.matmul.allow_tf32);
//   qat_vit_step_cuda_b256_bf16 (+ _graph): the same ViT in bf16 mixed
//     precision (Module::set_compute_dtype(bf16): bf16 matmuls and
//     activations, f32 master weights and AdamW state; the loss in f32; the
//     peer runs the forward under torch.autocast(bfloat16)).
// peak_bytes: the allocator's peak of bytes held by tensors (model,
// optimizer state, the four input batches, the step's temporaries), reset
// after warm-up; PyTorch's peer reports torch.cuda.max_memory_allocated
// over the same set. For a graph, the peak is taken over the capture (the
// replays allocate nothing) and graph_pool_bytes is the memory the graph's
// private pool holds.
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif
#if QGRAD_WITH_CUDA
#include <cuda_profiler_api.h>
#endif

#include <CLI/CLI.hpp>

#include "bench_common.h"
#include "qat_cnn.h"
#include "qat_mlp.h"
#include "qat_vit.h"

using namespace qgrad;
using namespace qgrad::bench;

namespace {

// A benchmarked network: the case name's stem, how to build it, the shape
// of one input example.
struct Net {
  std::string name;  // "qat_step_{device}_b256_h256": name = "qat_step", tag = "_h256"
  std::string tag;
  std::function<std::unique_ptr<QatStep>(Device, Generator&)> make;
  Shape example;
};

Net mlp(std::int64_t hidden, const std::string& suffix = "") {
  return {"qat_step", "_h" + std::to_string(hidden) + suffix,
          [hidden](Device d, Generator& g) { return std::make_unique<QatMlp>(d, hidden, g); }, {784}};
}
// The MLP with its forward, loss and backward as one fused kernel
// (nn::qat_mlp_loss_backward; b256 only, b4096 is past the kernel's limit
// kQatMlpFusedMultiplyAdds): case ..._h256_fused. CUDA cases only (unused
// in a CPU-only build).
[[maybe_unused]] Net mlp_fused(std::int64_t hidden) {
  return {"qat_step", "_h" + std::to_string(hidden) + "_fused",
          [hidden](Device d, Generator& g) { return std::make_unique<QatMlp>(d, hidden, g, 0.01, true); }, {784}};
}
Net cnn(std::int64_t width, const std::string& suffix = "") {
  return {"qat_cnn_step", "_w" + std::to_string(width) + suffix,
          [width](Device d, Generator& g) { return std::make_unique<QatCnn>(d, width, g); }, {1, 28, 28}};
}
#if QGRAD_WITH_CUDA
// The CNN with TF32 convolutions allowed (set_conv_allow_tf32), as PyTorch
// runs them by default: case ..._w32_tf32.
template <class F>
void with_conv_tf32(F&& f) {
  set_conv_allow_tf32(true);
  f(cnn(32, "_tf32"));
  set_conv_allow_tf32(false);
}
#endif
// precision: "f32" (case qat_vit_step_..._b256), "tf32" (..._tf32: run it
// inside with_matmul_tf32) or "bf16" (..._bf16).
[[maybe_unused]] Net vit(const std::string& precision = "f32") {  // CUDA only
  const std::optional<DType> compute = precision == "bf16" ? std::optional<DType>(DType::bf16) : std::nullopt;
  return {"qat_vit_step", precision == "f32" ? "" : "_" + precision,
          [compute](Device d, Generator& g) { return std::make_unique<QatVit>(d, g, compute); }, {784}};
}
#if QGRAD_WITH_CUDA
// f(vit("tf32")) with TF32 matmuls allowed (set_matmul_allow_tf32), as
// torch.backends.cuda.matmul.allow_tf32 in the peer.
template <class F>
void with_matmul_tf32(F&& f) {
  set_matmul_allow_tf32(true);
  f(vit("tf32"));
  set_matmul_allow_tf32(false);
}
// The b4096 MLP with its f32 products as tf32x3 (set_float32_matmul: f32's
// accuracy on TF32 tensor cores; the peer runs f32): case ..._h1024_tf32x3.
template <class F>
void with_matmul_tf32x3(F&& f) {
  set_float32_matmul(Float32Matmul::tf32x3);
  f(mlp(1024, "_tf32x3"));
  set_float32_matmul(Float32Matmul::ieee);
}
#endif
std::string case_name(const Net& net, const std::string& device, std::int64_t batch) {
  return net.name + "_" + device + "_b" + std::to_string(batch) + net.tag;
}

struct Setup {
  std::unique_ptr<QatStep> net;
  std::vector<Tensor> xs, ys;
};

Setup make_setup(Device dev, std::int64_t batch, const Net& net) {
  Generator gen(0x7a1);
  Setup s;
  s.net = net.make(dev, gen);
  const auto on = TensorOptions{}.with_device(dev);
  Shape shape{batch};
  shape.insert(shape.end(), net.example.begin(), net.example.end());
  for (int i = 0; i < 4; ++i) {  // several batches, as the peer
    s.xs.push_back(randn(shape, gen, on));
    s.ys.push_back(randint(0, 10, {batch}, gen, TensorOptions{}.with_dtype(DType::s64).with_device(dev)));
  }
  return s;
}

void train_step(Setup& s, const Tensor& x, const Tensor& y) { s.net->step(x, y); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void emit_case(const std::string& name, double ms, long long peak, const std::string& device, const std::string& extra) {
  char buf[768];
  std::snprintf(buf, sizeof buf,
                "{\"bench\":\"train_step\",\"impl\":\"qgrad\",\"case\":\"%s\",\"ms\":%.4f,\"peak_bytes\":%lld,"
                "\"device\":\"%s\"%s}",
                name.c_str(), ms, peak, device.c_str(), extra.c_str());
  emit(buf);
}

#if QGRAD_WITH_CUDA
// Per-step CUDA-event times, each step synchronised (as the peer measures).
template <class F>
std::vector<double> time_steps_cuda(int reps, F&& step) {
  cudaStream_t st = qgrad::cuda::stream(0);
  cudaEvent_t a, b;
  QGRAD_CUDA_CHECK(cudaEventCreate(&a));
  QGRAD_CUDA_CHECK(cudaEventCreate(&b));
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    QGRAD_CUDA_CHECK(cudaEventRecord(a, st));
    step(i);
    QGRAD_CUDA_CHECK(cudaEventRecord(b, st));
    QGRAD_CUDA_CHECK(cudaEventSynchronize(b));
    float m = 0;
    QGRAD_CUDA_CHECK(cudaEventElapsedTime(&m, a, b));
    ms.push_back(m);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms;
}

void bench_cuda(const Net& net, std::int64_t batch, int reps) {
  const std::string name = case_name(net, "cuda", batch);
  const std::string dev_name = cuda_device_name(0);
  {  // eager
    Setup s = make_setup(Device::cuda(), batch, net);
    for (int i = 0; i < 20; ++i) train_step(s, s.xs[i % 4], s.ys[i % 4]);
    cuda_synchronize();
    cuda_reset_peak_stats();
    const long long mallocs0 = cuda_allocator_stats().num_device_mallocs;
    // Host time to queue one step (the GPU may still be busy): the overhead
    // a captured graph removes.
    std::vector<double> host_ms;
    const auto t = time_steps_cuda(reps, [&](int i) {
      const auto h0 = std::chrono::steady_clock::now();
      train_step(s, s.xs[i % 4], s.ys[i % 4]);
      host_ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - h0).count());
    });
    const AllocatorStats st = cuda_allocator_stats();
    char extra[160];
    std::snprintf(extra, sizeof extra, ",\"host_ms\":%.4f,\"reps\":%d,\"device_mallocs_in_steps\":%lld",
                  median(host_ms), reps, st.num_device_mallocs - mallocs0);
    emit_case(name, median(t), st.peak_bytes_in_use, dev_name, extra);
  }
  cuda_empty_cache();
  {  // captured
    Setup s = make_setup(Device::cuda(), batch, net);
    Tensor x_static = empty_like(s.xs[0]), y_static = empty_like(s.ys[0]);
    for (int i = 0; i < 20; ++i) {  // warm-up: momentum buffers exist, observers have seen data
      x_static.copy_(s.xs[i % 4]);
      y_static.copy_(s.ys[i % 4]);
      train_step(s, x_static, y_static);
    }
    cuda_synchronize();
    cuda_reset_peak_stats();
    const long long reserved0 = cuda_allocator_stats().bytes_reserved;
    CudaGraph graph;
    graph.capture([&] { train_step(s, x_static, y_static); });
    const AllocatorStats cap = cuda_allocator_stats();
    // The same step captured with programmatic dependent launch off (plain
    // stream order between kernel nodes), replayed alternately with the
    // first: case ..._graph_in_order, the A/B of that launch mode.
    const bool programmatic = cuda_programmatic_launch();
    cuda_set_programmatic_launch(false);
    CudaGraph in_order;
    in_order.capture([&] { train_step(s, x_static, y_static); });
    cuda_set_programmatic_launch(programmatic);
    const auto t = time_steps_cuda(2 * reps, [&](int i) {
      x_static.copy_(s.xs[(i / 2) % 4]);
      y_static.copy_(s.ys[(i / 2) % 4]);
      (i % 2 == 0 ? graph : in_order).replay();
    });
    std::vector<double> t_graph, t_in_order;
    for (std::size_t i = 0; i < t.size(); ++i) (i % 2 == 0 ? t_graph : t_in_order).push_back(t[i]);
    char extra[200];
    std::snprintf(extra, sizeof extra, ",\"graph_pool_bytes\":%lld,\"reps\":%d,\"programmatic_launch\":%s",
                  cap.bytes_reserved - reserved0, reps, programmatic ? "true" : "false");
    emit_case(name + "_graph", median(t_graph), cap.peak_bytes_in_use, dev_name, extra);
    std::snprintf(extra, sizeof extra, ",\"reps\":%d,\"programmatic_launch\":false", reps);
    emit_case(name + "_graph_in_order", median(t_in_order), cap.peak_bytes_in_use, dev_name, extra);
  }
  cuda_empty_cache();
}

// --profile: the b256 step captured as in bench_cuda, then `replays` graph
// replays (no input copies) between cudaProfilerStart/Stop, for a profiler
// started with profiling off (scripts/profile_step.sh runs ncu on it).
// Prints the number of kernel nodes and the CUDA-event time per replay.
void profile_graph(const Net& net, std::int64_t batch, int replays) {
  Setup s = make_setup(Device::cuda(), batch, net);
  for (int i = 0; i < 20; ++i) train_step(s, s.xs[0], s.ys[0]);
  CudaGraph graph;
  graph.capture([&] { train_step(s, s.xs[0], s.ys[0]); });
  for (int i = 0; i < 20; ++i) graph.replay();
  cuda_synchronize();
  QGRAD_CUDA_CHECK(cudaProfilerStart());
  const auto t = time_steps_cuda(replays, [&](int) { graph.replay(); });
  QGRAD_CUDA_CHECK(cudaProfilerStop());
  std::printf("{\"bench\":\"train_step_profile\",\"case\":\"%s_graph\",\"kernel_nodes\":%lld,"
              "\"replay_ms\":%.4f,\"replays\":%d}\n",
              case_name(net, "cuda", batch).c_str(), static_cast<long long>(graph.kernel_node_count()), median(t),
              replays);
}
#endif

// Times `step(i)` on the CPU with `threads` OpenMP threads (10 warm-up
// steps, then `reps`) and emits the median as case `name`.
template <class Step>
void time_cpu_case(const std::string& name, int reps, int threads, Step&& step) {
#if defined(_OPENMP)
  omp_set_num_threads(threads);
#else
  (void)threads;
#endif
  for (int i = 0; i < 10; ++i) step(i);
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    step(i);
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  char extra[64];
  std::snprintf(extra, sizeof extra, ",\"reps\":%d,\"min_ms\":%.4f", reps, *std::min_element(ms.begin(), ms.end()));
  emit_case(name, median(ms), 0, "cpu (" + std::to_string(threads) + " threads)", extra);
}

void bench_cpu(const Net& net, std::int64_t batch, int reps, int threads) {
  Setup s = make_setup(Device::cpu(), batch, net);
  time_cpu_case(case_name(net, "cpu", batch), reps, threads, [&](int i) { train_step(s, s.xs[i % 4], s.ys[i % 4]); });
}

// The CPU MLP step's linear layers alone (784-256-256-10 at b256, f32, with
// bias; forward and backward, no gradient for the input, as in the step):
// the step's eight GEMMs and its bias sums without the fake quant, relu,
// loss and optimizer, so that the step's time splits into what the GEMM
// library does and what qgrad's own kernels do. Case
// qat_step_cpu_b256_h256_linears; peer_train_step.py --cpu-linears times
// PyTorch's F.linear on the same shapes.
void bench_cpu_linears(int reps, int threads) {
  constexpr std::int64_t kBatch = 256;
  const std::int64_t widths[] = {784, 256, 256, 10};
  Generator g(0x11);
  std::vector<Tensor> ws, bs, dys;
  const Tensor x = randn({kBatch, 784}, g);
  for (int l = 0; l < 3; ++l) {
    ws.push_back(randn({widths[l + 1], widths[l]}, g));
    bs.push_back(randn({widths[l + 1]}, g));
    ws.back().set_requires_grad(true);
    bs.back().set_requires_grad(true);
    dys.push_back(randn({kBatch, widths[l + 1]}, g));
  }
  time_cpu_case("qat_step_cpu_b256_h256_linears", reps, threads, [&](int) {
    Tensor in = x;
    for (int l = 0; l < 3; ++l) {
      ws[l].zero_grad();
      bs[l].zero_grad();
      Tensor out = linear(in, ws[l], bs[l]);
      out.backward(dys[l]);  // each layer's backward from its own output: dW, db, and dX where x needs it
      in = out.detach();
      in.set_requires_grad(l + 1 < 3);
    }
  });
}

}  // namespace

int main(int argc, char** argv) {
  bool cpu_only = false;
  int profile_replays = 0;
  std::string profile_nets = "mlp";  // comma-separated: mlp (b256 and b4096/h1024), cnn, vit
  std::string cpu_nets = "mlp,cnn";  // the CPU cases to run (a profiler's run of one)
  std::string cuda_nets = "mlp,mlp_fused,mlp_tf32x3,cnn,cnn_tf32,vit,vit_tf32,vit_bf16";  // the CUDA cases to run
  int cpu_reps = 50, cpu_threads = 2;
  CLI::App app{"The QAT training step of the examples' models, eager and captured in a CUDA graph (JSON lines)"};
  app.add_flag("--cpu-only", cpu_only, "only the CPU cases");
  app.add_option("--cpu-reps", cpu_reps, "steps timed per CPU case")->check(CLI::PositiveNumber);
  app.add_option("--cpu-threads", cpu_threads, "OpenMP threads of the CPU cases")->check(CLI::PositiveNumber);
  app.add_option("--profile", profile_replays,
                 "capture the --profile-nets steps and replay each REPLAYS times for a profiler, nothing else")
      ->expected(0, 1)
      ->default_str("3")
      ->check(CLI::PositiveNumber);
  app.add_option("--profile-nets", profile_nets,
                 "nets --profile captures: mlp, mlp_fused, mlp_tf32x3, cnn, cnn_tf32, vit, vit_tf32, vit_bf16");
  app.add_option("--cuda-nets", cuda_nets, "CUDA cases to run: mlp, mlp_fused, mlp_tf32x3, cnn, cnn_tf32, vit, vit_tf32, vit_bf16");
  app.add_option("--cpu-nets", cpu_nets,
                 "CPU cases to run: mlp, cnn, mlp_linears (the MLP step's linear layers alone; none: no CPU case)");
  CLI11_PARSE(app, argc, argv);
#if QGRAD_WITH_CUDA
  if (profile_replays > 0) {
    if (!cuda_available()) return 1;
    const auto wanted = [&](const std::string& n) {
      return ("," + profile_nets + ",").find("," + n + ",") != std::string::npos;
    };
    if (wanted("mlp")) {
      profile_graph(mlp(256), 256, profile_replays);
      profile_graph(mlp(1024), 4096, profile_replays);
    }
    if (wanted("mlp_tf32x3")) with_matmul_tf32x3([&](const Net& net) { profile_graph(net, 4096, profile_replays); });
    if (wanted("mlp_fused")) profile_graph(mlp_fused(256), 256, profile_replays);
    if (wanted("cnn")) profile_graph(cnn(32), 256, profile_replays);
    if (wanted("cnn_tf32")) with_conv_tf32([&](const Net& net) { profile_graph(net, 256, profile_replays); });
    if (wanted("vit")) profile_graph(vit(), 256, profile_replays);
    if (wanted("vit_tf32")) with_matmul_tf32([&](const Net& net) { profile_graph(net, 256, profile_replays); });
    if (wanted("vit_bf16")) profile_graph(vit("bf16"), 256, profile_replays);
    return 0;
  }
  const auto cuda_wanted = [&](const std::string& n) {
    return ("," + cuda_nets + ",").find("," + n + ",") != std::string::npos;
  };
  if (!cpu_only && cuda_available()) {
    if (cuda_wanted("mlp")) {
      bench_cuda(mlp(256), 256, 300);
      bench_cuda(mlp(1024), 4096, 200);
    }
    if (cuda_wanted("mlp_tf32x3")) with_matmul_tf32x3([](const Net& net) { bench_cuda(net, 4096, 200); });
    if (cuda_wanted("mlp_fused")) bench_cuda(mlp_fused(256), 256, 300);  // b4096 is past the kernel's limit
    if (cuda_wanted("cnn")) bench_cuda(cnn(32), 256, 200);
    if (cuda_wanted("cnn_tf32")) with_conv_tf32([](const Net& net) { bench_cuda(net, 256, 200); });
    if (cuda_wanted("vit")) bench_cuda(vit(), 256, 100);
    if (cuda_wanted("vit_tf32")) with_matmul_tf32([](const Net& net) { bench_cuda(net, 256, 100); });
    if (cuda_wanted("vit_bf16")) bench_cuda(vit("bf16"), 256, 100);
  }
#else
  (void)cpu_only;
  if (profile_replays > 0) return 1;  // nothing to profile without CUDA
#endif
  const auto cpu_wanted = [&](const std::string& n) { return ("," + cpu_nets + ",").find("," + n + ",") != std::string::npos; };
  if (cpu_wanted("mlp")) bench_cpu(mlp(256), 256, cpu_reps, cpu_threads);
  if (cpu_wanted("cnn")) bench_cpu(cnn(32), 64, std::max(cpu_reps / 5, 5), cpu_threads);
  if (cpu_wanted("mlp_linears")) bench_cpu_linears(cpu_reps, cpu_threads);
  return 0;
}
