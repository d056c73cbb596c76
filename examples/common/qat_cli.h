// The command-line options and the "flags" record shared by the QAT
// examples (qgrad-qat-mlp, qgrad-qat-cnn): each example's Flags struct has
// these members (with its own defaults) and adds its own options after.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../cli_checks.h"
#include "qat_train.h"

namespace qgrad_examples {

// The flags both examples take, with qgrad-qat-mlp's defaults; an example's
// Flags derives from it, adds its own and sets its own defaults.
struct QatFlags {
  int epochs = 6;
  int qat_epochs = 2;
  std::int64_t batch = 128;
  double lr = 0.05;
  double qat_lr = 0.005;
  double weight_decay = 5e-4;
  double momentum = 0.9;
  bool nesterov = true;
  std::string device = "auto";
  std::uint64_t seed = 1;
  std::string data = qgrad::nn::kFashionMnistDir;
  std::string out;
  std::string report;
  bool qat_from_scratch = false;
  std::int64_t limit_train = 0, limit_test = 0;  // hidden, for the ctest smoke test
  std::string plot_format = "auto";              // hidden: auto, png, svg
  std::int64_t checkpoint_every = 0;             // --checkpoint-every N (training steps; 0: never)
  bool resume = false;                           // --resume
  std::int64_t abort_at_step = 0;                // hidden: SIGKILL itself during training step N (testing)
  bool probe_cuda = false;                       // hidden: --probe-cuda
  double clip_grad_norm = 0;                     // --clip-grad-norm X (global L2 norm, fused into the step; 0: off)
  std::string precision = "f32";                 // --precision f32|tf32|tf32x3|bf16 (bf16: Module::set_compute_dtype)
};

template <class Flags>
void add_qat_options(CLI::App& app, Flags& f) {
  app.add_option("--epochs", f.epochs, "float epochs (QAT epochs with --qat-from-scratch)")
      ->capture_default_str()
      ->check(integer_in(1, 10000));
  app.add_option("--qat-epochs", f.qat_epochs, "QAT fine-tuning epochs (observers freeze after the first)")
      ->capture_default_str()
      ->check(integer_in(1, 10000));
  app.add_option("--batch", f.batch, "mini-batch size")->capture_default_str()->check(integer_in(1, 60000));
  app.add_option("--lr", f.lr, "peak learning rate of the float phase (cosine schedule)")
      ->capture_default_str()
      ->check(number_in(0, 10, /*lo_open=*/true));
  app.add_option("--qat-lr", f.qat_lr, "peak learning rate of the QAT fine-tuning")
      ->capture_default_str()
      ->check(number_in(0, 10, /*lo_open=*/true));
  app.add_option("--weight-decay", f.weight_decay, "weight decay (SGD: L2 in the gradient; AdamW: decoupled)")->capture_default_str()->check(number_in(0, 1));
  app.add_option("--device", f.device, "auto, cpu, cuda or cuda:N")->capture_default_str()->check(qgrad_examples::device_name(true));
  app.add_option("--seed", f.seed, "seed of the initialisation and the shuffling")
      ->capture_default_str()
      ->check(qgrad_examples::seed_value());
  app.add_option("--data", f.data, "folder with the Fashion-MNIST IDX files")->capture_default_str();
  app.add_option("--out", f.out, "output folder")->capture_default_str();
  app.add_option("--report", f.report, "path of report.json (default <out>/report.json)");
  app.add_flag("--qat-from-scratch", f.qat_from_scratch, "train with fake quant from the start (no float phase)");
  app.add_option("--checkpoint-every", f.checkpoint_every,
                 "write the training state to <out>/train_state.safetensors every N training steps (atomically; "
                 "0: never), for --resume")
      ->capture_default_str()
      ->check(integer_in(0, 1000000000));
  app.add_flag("--resume", f.resume,
               "continue the run in --out from its last checkpoint (same options as the interrupted run); ends "
               "with the same report.json (timing aside) and checkpoints as an uninterrupted run");
  app.add_option("--clip-grad-norm", f.clip_grad_norm, "clip the gradients' global L2 norm to X (0: off)")
      ->capture_default_str()
      ->check(number_in(0, 1e9));
  app.add_option("--precision", f.precision,
                 "f32; tf32 (f32, with matmuls and convolutions on CUDA on TF32 tensor cores); tf32x3 (f32, "
                 "the large matmuls on CUDA on TF32 tensor cores at f32's accuracy, each operand split in two); or "
                 "bf16 mixed precision (bf16 matmuls and activations)")
      ->capture_default_str()
      ->check(one_of({"f32", "tf32", "tf32x3", "bf16"}));
  app.add_option("--limit-train", f.limit_train, "use only the first N training images (testing; 0: all)")
      ->check(integer_in(0, 60000))
      ->group("Testing options");
  app.add_option("--limit-test", f.limit_test, "use only the first N test images (testing; 0: all)")
      ->check(integer_in(0, 10000))
      ->group("Testing options");
  app.add_option("--plot-format", f.plot_format, "auto, png or svg")
      ->check(one_of({"auto", "png", "svg"}))
      ->group("Testing options");
  app.add_option("--abort-at-step", f.abort_at_step, "SIGKILL this process during training step N (testing resume)")
      ->check(integer_in(0, 1000000000))
      ->group("Testing options");
  app.add_flag("--probe-cuda", f.probe_cuda, "exit 0 when a CUDA device is present, 77 otherwise (testing)")->group("Testing options");
}

// The hyper-parameters: report.json's "flags", checked by --resume.
template <class Flags>
nlohmann::ordered_json qat_flags_json(const Flags& f) {
  return {{"epochs", f.epochs},
          {"qat_epochs", f.qat_epochs},
          {"batch", f.batch},
          {"lr", f.lr},
          {"qat_lr", f.qat_lr},
          {"weight_decay", f.weight_decay},
          {"momentum", f.momentum},
          {"nesterov", f.nesterov},
          {"device", f.device},
          {"seed", f.seed},
          {"qat_from_scratch", f.qat_from_scratch},
          {"limit_train", f.limit_train},
          {"limit_test", f.limit_test},
          {"clip_grad_norm", f.clip_grad_norm},
          {"precision", f.precision}};
}

// What every run starts from: the device, the plot format, the report's
// path, the data (the first --limit-train / --limit-test examples) and the
// start time; the output folder exists afterwards.
struct RunSetup {
  qgrad::Device dev;
  PlotFormat format;
  std::string report_path;
  Clock::time_point t_start;
  qgrad::nn::Dataset train, test;
  // Under qgrad-run (WORLD_SIZE > 1): the process group; rank r trains on
  // cuda:LOCAL_RANK for a CUDA device without an index; ranks other than 0
  // print nothing (stdout to /dev/null) and write no files.
  std::shared_ptr<qgrad::dist::ProcessGroup> pg;
};
template <class Flags>
RunSetup run_setup(const Flags& f) {
  RunSetup s;
  if (qgrad::dist::ProcessGroup::env_is_distributed()) s.pg = qgrad::dist::ProcessGroup::from_env();
  if (s.pg && s.pg->rank() != 0 && !std::freopen("/dev/null", "w", stdout))
    throw std::runtime_error("cannot silence rank " + std::to_string(s.pg->rank()));
  s.dev = f.device == "auto" ? (qgrad::cuda_device_count() > 0 ? qgrad::Device::cuda(0) : qgrad::Device::cpu())
                             : qgrad::Device::parse(f.device);
  if (s.pg && s.dev.is_cuda() && f.device.find(':') == std::string::npos) s.dev = qgrad::Device::cuda(s.pg->local_rank());
  if (s.pg)
    std::printf("distributed: %d ranks (Gloo/NCCL), global batch %lld = %lld per rank x %d\n", s.pg->world_size(),
                static_cast<long long>(f.batch) * s.pg->world_size(), static_cast<long long>(f.batch),
                s.pg->world_size());
  // tf32: PyTorch's torch.backends.cuda.matmul.allow_tf32 and cudnn.allow_tf32; tf32x3: the matmuls
  // only, at f32's accuracy (ops/linalg.h; convolutions stay f32). No effect on the CPU.
  qgrad::set_float32_matmul(f.precision == "tf32"     ? qgrad::Float32Matmul::tf32
                            : f.precision == "tf32x3" ? qgrad::Float32Matmul::tf32x3
                                                      : qgrad::Float32Matmul::ieee);
  qgrad::set_conv_allow_tf32(f.precision == "tf32");
  s.format = f.plot_format == "png"   ? PlotFormat::png
             : f.plot_format == "svg" ? PlotFormat::svg
                                      : PlotFormat::automatic;
  std::filesystem::create_directories(f.out);
  s.report_path = f.report.empty() ? f.out + "/report.json" : f.report;
  s.t_start = Clock::now();
  s.train = head(qgrad::nn::load_fashion_mnist("train", f.data), f.limit_train);
  s.test = head(qgrad::nn::load_fashion_mnist("test", f.data), f.limit_test);
  return s;
}

template <class Flags>
TrainOptions train_options(const Flags& f, const std::string& program) {
  return {program, f.out, f.batch, f.momentum, f.weight_decay, f.nesterov, f.seed, f.checkpoint_every,
          f.abort_at_step, f.clip_grad_norm};
}

template <class Flags>
FlowOptions flow_options(const Flags& f, const std::string& int8_format) {
  FlowOptions o;
  o.epochs = f.epochs, o.qat_epochs = f.qat_epochs, o.lr = f.lr, o.qat_lr = f.qat_lr;
  o.qat_from_scratch = f.qat_from_scratch, o.resume = f.resume, o.out = f.out, o.int8_format = int8_format;
  return o;
}

// metrics.csv, report.json and the closing summary of a finished run; 0.
template <class Flags>
int finish_run(const Flags& f, const RunSetup& setup, const FlowResult& res, const Trainer& trainer,
                const std::vector<std::string>& plots, const std::string& flags_text,
                const std::vector<std::string>& onnx_files = {},
                const nlohmann::ordered_json& report_extra = nlohmann::ordered_json::object()) {
  write_metrics(f.out + "/metrics.csv", trainer.records);
  write_report(setup.report_path, res, setup.dev, f.seed, setup.train.size(), setup.test.size(), trainer.records,
               flags_text, setup.t_start, report_extra);
  print_summary(res, f.qat_from_scratch, setup.report_path, f.out, plots, trainer, setup.t_start, onnx_files);
  return 0;
}

// main's last step: run(flags_text), an exception becoming one line on
// stderr and exit status 1.
inline int run_or_report(const std::function<int(const std::string&)>& run, const nlohmann::ordered_json& flags) {
  try {
    return run(flags.dump());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}

}  // namespace qgrad_examples
