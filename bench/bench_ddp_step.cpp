// Weak scaling of a data-parallel QAT step (issue #17): the MLP of
// bench/qat_mlp.h (784-H-H-10, prepare_qat, SGD momentum 0.9) at a fixed
// per-GPU batch, wrapped in dist::DistributedDataParallel (NCCL on CUDA,
// Gloo on the CPU), one process per GPU under qgrad-run:
//
//   qgrad-run --nproc-per-node N build/bench/bench_ddp_step [--batch 4096] [--hidden 4096] [--reps 30]
//
// Without a process group (no WORLD_SIZE) it runs the same step without DDP
// (the 1-GPU baseline). Each rank times `reps` steps after warm-up (a host
// barrier on the device before and after, so the time includes the
// gradient all-reduce); rank 0 prints one JSON line:
//   {"bench":"ddp_step","device":..,"world":N,"batch_per_rank":B,"hidden":H,
//    "ms_median":..,"ms_min":..,"samples_per_s":N*B/median}
// Weak-scaling efficiency of N GPUs = samples_per_s(N) / (N * samples_per_s(1)).
// PyTorch's peer: bench/peer_ddp.py; both run by scripts/dist_check.sh.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "qat_mlp.h"
#include "qgrad/qgrad.h"

using namespace qgrad;

int main(int argc, char** argv) {
  std::int64_t batch = 4096, hidden = 4096;
  int reps = 30, warmup = 5;
  std::string device = "auto";
  CLI::App app{"Weak scaling of a data-parallel QAT step: one rank of qgrad-run, or alone (one JSON line)"};
  app.add_option("--batch", batch, "batch per rank")->check(CLI::PositiveNumber);
  app.add_option("--hidden", hidden, "hidden width")->check(CLI::PositiveNumber);
  app.add_option("--reps", reps, "steps timed")->check(CLI::PositiveNumber);
  app.add_option("--device", device, "auto, cpu or cuda")->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  CLI11_PARSE(app, argc, argv);
  try {
    auto pg = dist::ProcessGroup::env_is_distributed() ? dist::ProcessGroup::from_env() : nullptr;
    const int local = pg ? pg->local_rank() : 0;
    Device dev = device == "auto" ? (cuda_device_count() > 0 ? Device::cuda(local) : Device::cpu())
                                  : Device::parse(device);
    if (dev.is_cuda() && device.find(':') == std::string::npos) dev = Device::cuda(local);
    Generator gen(1);
    bench::QatMlp m(dev, hidden, gen);
    std::unique_ptr<dist::DistributedDataParallel> ddp;
    if (pg) ddp = std::make_unique<dist::DistributedDataParallel>(m.model, pg);
    Generator data_gen(100 + static_cast<std::uint64_t>(pg ? pg->rank() : 0));
    Tensor x = randn({batch, 784}, data_gen, TensorOptions{}.with_device(dev));
    std::vector<std::int64_t> labels(static_cast<std::size_t>(batch));
    for (std::int64_t i = 0; i < batch; ++i) labels[static_cast<std::size_t>(i)] = i % 10;
    Tensor y = Tensor::from_vector(labels, {batch}, dev);
    auto step = [&] {
      m.opt->zero_grad();
      Tensor loss = cross_entropy(ddp ? ddp->forward(x) : m.model->forward(x), y);
      loss.backward();
      m.opt->step();
    };
    auto sync = [&] {
      if (dev.is_cuda()) cuda_synchronize(dev.index);
      if (pg) pg->barrier(dev);
    };
    for (int i = 0; i < warmup; ++i) step();
    std::vector<double> ms;
    for (int i = 0; i < reps; ++i) {
      sync();
      const auto t0 = std::chrono::steady_clock::now();
      step();
      if (dev.is_cuda()) cuda_synchronize(dev.index);
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    // Each step ends when the slowest rank's does: take the max over ranks.
    Tensor t = Tensor::from_vector(ms, {static_cast<std::int64_t>(ms.size())});
    if (pg && dist::gloo_available()) pg->all_reduce(t, dist::ReduceOp::max);
    ms = t.to_vector<double>();
    std::sort(ms.begin(), ms.end());
    const int world = pg ? pg->world_size() : 1;
    if (!pg || pg->rank() == 0) {
      const double med = ms[ms.size() / 2];
      std::printf("{\"bench\":\"ddp_step\",\"case\":\"ddp_qat_mlp_b%lld_h%lld_x%d\",\"ms\":%.4f,\"impl\":\"qgrad\","
                  "\"device\":\"%s\",\"world\":%d,\"batch_per_rank\":%lld,"
                  "\"hidden\":%lld,\"ms_median\":%.4f,\"ms_min\":%.4f,\"samples_per_s\":%.1f,\"reps\":%d}\n",
                  static_cast<long long>(batch), static_cast<long long>(hidden), world, med,
                  dev.is_cuda() ? cuda_device_name(dev.index).c_str() : "cpu", world, static_cast<long long>(batch),
                  static_cast<long long>(hidden), med, ms.front(), world * static_cast<double>(batch) / (med / 1e3),
                  reps);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_ddp_step: %s\n", e.what());
    return 1;
  }
  return 0;
}
