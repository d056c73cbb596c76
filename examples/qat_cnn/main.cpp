// qgrad-qat-cnn: quantization-aware training of a small CNN on
// Fashion-MNIST, end to end:
//   Conv(1->W, 3x3, pad 1)-BN-ReLU-MaxPool 2 -> Conv(W->2W, 3x3, pad 1)-BN-ReLU-MaxPool 2
//   -> Flatten -> Linear(2W*7*7 -> 10), W = --width (32);
//   1. train the float model (SGD, Nesterov momentum 0.9, cosine schedule);
//   2. prepare_qat: Conv-BN-ReLU fused into ConvBnReLU2d (the batch norm
//      folded into the per-channel weight fake quant, PyTorch's
//      torch.ao.nn.intrinsic.qat semantics), fake quant on the input and
//      every block's output; fine-tune, freezing the observers after the
//      first QAT epoch and the batch norm statistics from --freeze-bn-epoch;
//   3. convert to an int8 model (BN folded into s8 per-channel conv weights,
//      int32 sums; max pooling and flatten on the dequantized grid values)
//      and evaluate all three on the test set.
// Writes what qgrad-qat-mlp writes (examples/common/qat_train.h): metrics.csv,
// report.json, plots, the graph of one QAT training step (DOT) and
// safetensors checkpoints; --checkpoint-every / --resume as there.
//
//   qgrad-qat-cnn [--epochs 5] [--qat-epochs 1] [--device auto|cpu|cuda] [--out qat-cnn-out] ...
#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../common/qat_cli.h"
#include "../common/qat_train.h"
#include "qgrad/nn/nn.h"
#include "qgrad/qgrad.h"

using namespace qgrad;
using namespace qgrad::nn;
using namespace qgrad_examples;

namespace {

struct Flags : QatFlags {
  // 5 float epochs reach 92.1% (3 gave 91.5%); one QAT epoch is within
  // 0.1 point of the second and keeps the CPU run near 10 minutes.
  Flags() {
    epochs = 5;
    qat_epochs = 1;
    out = "qat-cnn-out";
  }
  int freeze_bn_epoch = 2;  // --freeze-bn-epoch
  std::int64_t width = 32;  // --width
};

// [N, 784] images -> conv blocks -> [N, 10] logits.
std::shared_ptr<Sequential> make_cnn(std::int64_t width, Generator& gen, Device dev) {
  Conv2dOptions same;
  same.padding = {1, 1};
  auto m = std::make_shared<Sequential>();
  m->emplace_back<Unflatten>(1, Shape{1, 28, 28});
  m->emplace_back<Conv2d>(1, width, std::array<std::int64_t, 2>{3, 3}, gen, same);
  m->emplace_back<BatchNorm2d>(width);
  m->emplace_back<ReLU>();
  m->emplace_back<MaxPool2d>(2);
  m->emplace_back<Conv2d>(width, 2 * width, std::array<std::int64_t, 2>{3, 3}, gen, same);
  m->emplace_back<BatchNorm2d>(2 * width);
  m->emplace_back<ReLU>();
  m->emplace_back<MaxPool2d>(2);
  m->emplace_back<Flatten>();
  m->emplace_back<Linear>(2 * width * 7 * 7, 10, gen);
  m->to(dev);
  return m;
}

// The loss and accuracy curves, and output channel 0 of the second block's
// folded weights (what its weight fake quant sees) against their int8 grid.
std::vector<std::string> write_plots(const std::vector<EpochRecord>& records, const Sequential& model,
                                     const std::string& out, PlotFormat format) {
  std::vector<std::string> files = write_curves(records, out, format);
  std::vector<const ConvBn2d*> blocks;
  for (std::size_t i = 0; i < model.size(); ++i)
    if (const auto* cb = dynamic_cast<const ConvBn2d*>(model[i].get())) blocks.push_back(cb);
  if (blocks.size() < 2) return files;
  const ConvBn2d& block = *blocks[1];
  const Tensor w = block.folded_weight_bias().first.cpu();
  auto wv = w.to(DType::f64).to_vector<double>();
  wv.resize(static_cast<std::size_t>(w.numel() / w.size(0)));
  const FakeQuantize& fq = block.weight_fake_quant();
  files.push_back(write_weight_grid(wv, fq.scale().cpu().to_vector<float>()[0],
                                    fq.zero_point().cpu().to_vector<std::int32_t>()[0], fq.qmin(), fq.qmax(),
                                    "Block 2, output channel 0: BN-folded weights and their int8 grid",
                                    out + "/weights_layer0", format));
  return files;
}

int run(const Flags& f, const std::string& flags_text) {
  const RunSetup setup = run_setup(f);
  const auto& [dev, format, report_path, t_start, train, test, pg] = setup;
  std::printf("qgrad-qat-cnn: 2 x (Conv-BN-ReLU-MaxPool), widths %lld/%lld, Fashion-MNIST %lld train / %lld test, "
              "device %s, seed %llu\n",
              static_cast<long long>(f.width), static_cast<long long>(2 * f.width),
              static_cast<long long>(train.size()), static_cast<long long>(test.size()), dev.str().c_str(),
              static_cast<unsigned long long>(f.seed));

  Generator gen(f.seed);
  auto model = make_cnn(f.width, gen, dev);
  if (f.precision == "bf16") model->set_compute_dtype(DType::bf16);  // f32 master weights; prepare_qat keeps it
  Trainer trainer(train_options(f, "qgrad-qat-cnn"), dev, train, test, gen, nlohmann::json::parse(flags_text),
                  setup.pg);
  FlowOptions fo = flow_options(f, "qgrad-int8-cnn");
  fo.freeze_bn_epoch = f.freeze_bn_epoch;
  const FlowResult res = run_flow(trainer, *model, fo, test, dev, [](Sequential& m) { prepare_qat(m); });
  if (!res.int8) return 0;  // a rank other than 0: evaluation and files are rank 0's

  auto plots = write_plots(trainer.records, *model, f.out, format);
  return finish_run(f, setup, res, trainer, plots, flags_text);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Quantization-aware training of a small CNN (Conv-BN-ReLU blocks) on Fashion-MNIST with qgrad"};
  Flags f;
  add_qat_options(app, f);
  app.add_option("--freeze-bn-epoch", f.freeze_bn_epoch,
                 "QAT epoch from which the batch norm statistics are frozen (freeze_bn_stats; 0: never)")
      ->capture_default_str()
      ->check(integer_in(0, 10000));
  app.add_option("--width", f.width, "channels of the first conv block (the second has twice as many)")
      ->capture_default_str()
      ->check(integer_in(1, 1024));
  CLI11_PARSE(app, argc, argv);
  if (f.probe_cuda) return cuda_device_count() > 0 ? 0 : 77;

  nlohmann::ordered_json flags = qat_flags_json(f);
  flags["freeze_bn_epoch"] = f.freeze_bn_epoch;
  flags["width"] = f.width;
  return run_or_report([&](const std::string& text) { return run(f, text); }, flags);
}
