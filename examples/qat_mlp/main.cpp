// qgrad-qat-mlp: quantization-aware training of a 784-256-256-10 MLP on
// Fashion-MNIST, end to end:
//   1. train the float model (SGD, Nesterov momentum 0.9, cosine schedule);
//   2. prepare_qat: fake quant on the input, every weight and every layer
//      output; fine-tune, freezing the observers after the first QAT epoch;
//   3. convert to an int8 model (s8 weights, int32 sums) and evaluate all
//      three on the test set.
// Writes <out>/metrics.csv, <out>/report.json, plots (PNG with gnuplot,
// SVG otherwise), the graph of one QAT training step (DOT, and SVG when
// Graphviz is installed) and safetensors checkpoints.
//
// report.json: everything except its "timing" object is a function of the
// flags, the data and the device, bit-identical between runs with the same
// seed on the same device; "timing" holds the wall-clock measurements.
//
//   qgrad-qat-mlp [--epochs 6] [--qat-epochs 2] [--device auto|cpu|cuda] [--out qat-mlp-out] ...
//   longer schedule: --epochs 30 --qat-epochs 3
//
// Resume: --checkpoint-every N writes <out>/train_state.safetensors every N
// training steps (atomically, nn::save_train_state); --resume continues the
// run in <out> from it and ends with the same report.json (timing aside)
// and bit-identical float/qat/int8 checkpoints as an uninterrupted run.
// docs/design.md "Checkpoints and resume".
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../cli_checks.h"
#include "../common/qat_cli.h"
#include "../common/qat_train.h"
#include "qgrad/nn/nn.h"
#include "qgrad/qgrad.h"

using namespace qgrad;
using namespace qgrad::nn;
using namespace qgrad_examples;

namespace {

struct Flags : QatFlags {
  Flags() { out = "qat-mlp-out"; }
  std::string export_onnx;     // --export-onnx PATH
  bool onnx_no_clamp = false;  // hidden: measure the graph without the quant-range clamp
  std::string recipe = "int8";    // --recipe int8|8da4w|fp8 (nn/recipes.h)
  std::int64_t group_size = 32;   // --group-size: 8da4w int4 weight groups
};

// The converted checkpoint's metadata: its format ("qgrad-int8-mlp",
// "qgrad-8da4w-mlp", "qgrad-fp8-mlp") and the group size of int4 weights.
Metadata converted_metadata(const Sequential& m, const std::string& conv) {
  Metadata md{{"format", "qgrad-" + conv + "-mlp"}};
  for (std::size_t i = 0; i < m.size(); ++i)
    if (const auto* l = dynamic_cast<const Int8DynActInt4WeightLinear*>(m[i].get()))
      md[m.name_at(i) + ".weight.group_size"] = std::to_string(l->group_size());
  return md;
}

std::shared_ptr<Sequential> make_mlp(Generator& gen, Device dev) {
  auto m = std::make_shared<Sequential>();
  m->emplace_back<Linear>(784, 256, gen);
  m->emplace_back<ReLU>();
  m->emplace_back<Linear>(256, 256, gen);
  m->emplace_back<ReLU>();
  m->emplace_back<Linear>(256, 10, gen);
  m->to(dev);
  return m;
}

// The model's output (logits, [N, classes] row-major) on every example.
std::vector<float> logits(Sequential& model, const Dataset& data, Device dev) {
  NoGradGuard no_grad;
  DataLoader loader(data, 1000, /*shuffle=*/false, 0, false, dev);
  std::vector<float> out;
  Batch b;
  while (loader.next(b)) {
    auto y = model(b.images).cpu().to_vector<float>();
    out.insert(out.end(), y.begin(), y.end());
  }
  return out;
}

// <base>_logits.npy (f32 [N, classes]) and <base>_predictions.txt (the
// first largest logit's class, one line per example), for scripts/onnx_check.py.
void write_outputs(const std::string& base, const std::vector<float>& y, std::size_t n) {
  const std::size_t classes = n ? y.size() / n : 0;
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + std::to_string(n) + ", " +
                       std::to_string(classes) + "), }";
  header.append(64 - (10 + header.size() + 1) % 64, ' ').push_back('\n');
  std::ofstream npy(base + "_logits.npy", std::ios::binary);
  const auto len = static_cast<std::uint16_t>(header.size());
  npy << "\x93NUMPY" << '\x01' << '\x00' << static_cast<char>(len & 0xff) << static_cast<char>(len >> 8) << header;
  npy.write(reinterpret_cast<const char*>(y.data()), static_cast<std::streamsize>(y.size() * sizeof(float)));
  std::ofstream txt(base + "_predictions.txt");
  for (std::size_t i = 0; i < n; ++i) {
    const float* row = y.data() + i * classes;
    txt << std::max_element(row, row + classes) - row << '\n';
  }
  if (!npy || !txt) throw std::runtime_error("cannot write " + base + "_{logits.npy,predictions.txt}");
}

// --export-onnx PATH: the int8 model to PATH, the QAT model's QDQ form to
// <stem>_qat.onnx beside it, and qgrad's logits and predictions of both on
// the test set (<stem>_int8_*, <stem>_qat_*). Returns the files written.
std::vector<std::string> export_models(const std::string& path, Sequential& qat, Sequential& int8,
                                       const Dataset& test, Device dev, bool clamp) {
  namespace fs = std::filesystem;
  const fs::path p(path);
  if (p.has_parent_path()) fs::create_directories(p.parent_path());
  const std::string stem = (p.parent_path() / p.stem()).string();
  const Tensor example = zeros({1, test.images.size(1)});
  OnnxExportOptions options;
  options.clamp_to_quant_range = clamp;
  export_onnx(int8, example, path, options);
  export_onnx(qat, example, stem + "_qat.onnx", options);
  const auto n = static_cast<std::size_t>(test.size());
  write_outputs(stem + "_int8", logits(int8, test, dev), n);
  enable_observer(qat, false);
  write_outputs(stem + "_qat", logits(qat, test, dev), n);
  return {path, stem + "_qat.onnx", stem + "_int8_{logits.npy,predictions.txt}",
          stem + "_qat_{logits.npy,predictions.txt}"};
}

// The loss and accuracy curves, and output channel 0 of the first layer
// against its per-channel int8 grid.
std::vector<std::string> write_plots(const std::vector<EpochRecord>& records, const QATLinear* layer0,
                                     const std::string& out, PlotFormat format) {
  std::vector<std::string> files = write_curves(records, out, format);
  if (!layer0) return files;  // the weight histogram shows the int8 recipe's grid
  const QATLinear& layer = *layer0;
  const Tensor w = layer.weight().detach().cpu();
  const std::int64_t k = w.size(1);
  auto wv = w.to(DType::f64).to_vector<double>();
  wv.resize(static_cast<std::size_t>(k));
  const FakeQuantize& fq = layer.weight_fake_quant();
  files.push_back(write_weight_grid(wv, fq.scale().cpu().to_vector<float>()[0],
                                    fq.zero_point().cpu().to_vector<std::int32_t>()[0], fq.qmin(), fq.qmax(),
                                    "Layer 0, output channel 0: weights and their int8 grid", out + "/weights_layer0",
                                    format));
  return files;
}

int run(const Flags& f, const std::string& flags_text) {
  if (!f.export_onnx.empty() && f.recipe != "int8")
    throw std::runtime_error("--export-onnx exports the int8 recipe's models only, not --recipe " + f.recipe);
  const RunSetup setup = run_setup(f);
  const Device dev = setup.dev;
  const Dataset& train = setup.train;
  const Dataset& test = setup.test;
  std::printf("qgrad-qat-mlp: 784-256-256-10 MLP, Fashion-MNIST %lld train / %lld test, device %s, seed %llu\n",
              static_cast<long long>(train.size()), static_cast<long long>(test.size()), dev.str().c_str(),
              static_cast<unsigned long long>(f.seed));

  Generator gen(f.seed);
  auto model = make_mlp(gen, dev);
  if (f.precision == "bf16") model->set_compute_dtype(DType::bf16);  // f32 master weights; prepare_qat keeps it
  Trainer trainer(train_options(f, "qgrad-qat-mlp"), dev, train, test, gen, nlohmann::json::parse(flags_text),
                  setup.pg);
  FlowOptions fo = flow_options(f, "qgrad-int8-mlp");
  const Recipe recipe = parse_recipe(f.recipe);
  fo.recipe = recipe_name(recipe);  // int8, 8da4w, fp8
  fo.convert = [&](Sequential& m) { return convert(m, recipe); };
  fo.enable_fake_quant = [](Sequential& m, bool on) { enable_recipe_fake_quant(m, on); };
  fo.converted_metadata = [&](const Sequential& m) { return converted_metadata(m, fo.recipe); };
  RecipeOptions recipe_options;
  recipe_options.group_size = f.group_size;
  recipe_options.skip_indivisible = true;  // torchao's quantizer: a layer G does not divide stays float
  std::vector<std::string> float_layer_names;
  const FlowResult res = run_flow(trainer, *model, fo, test, dev, [&](Sequential& m) {
    prepare_qat(m, recipe, recipe_options);
    float_layer_names = float_layers(m);
  });
  if (!res.int8) return 0;  // a rank other than 0: evaluation and files are rank 0's
  std::vector<std::string> exported;
  if (!f.export_onnx.empty()) exported = export_models(f.export_onnx, *model, *res.int8, test, dev, !f.onnx_no_clamp);

  auto plots = write_plots(trainer.records, dynamic_cast<const QATLinear*>((*model)[1].get()), f.out, setup.format);
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();
  if (recipe == Recipe::w8da4) extra["group_size"] = f.group_size, extra["float_layers"] = float_layer_names;
  const int rc = finish_run(f, setup, res, trainer, plots, flags_text, exported, extra);
  if (!float_layer_names.empty())
    std::printf("float layers         %zu Linear kept in float (in_features not a multiple of --group-size %lld)\n",
                float_layer_names.size(), static_cast<long long>(f.group_size));
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Quantization-aware training of an MLP on Fashion-MNIST with qgrad"};
  Flags f;
  add_qat_options(app, f);
  app.add_option("--export-onnx", f.export_onnx,
                 "write the int8 model as ONNX to PATH, its QAT (QDQ) form to <stem>_qat.onnx, and qgrad's test-set "
                 "logits and predictions of both beside them (check with scripts/onnx_check.py)");
  app.add_flag("--onnx-no-clamp", f.onnx_no_clamp,
               "--export-onnx without the clamp to narrower quant ranges (testing; see docs/export.md)")
      ->group("Testing options");
  app.add_option("--recipe", f.recipe, "QAT recipe: int8 (static u8 activations, s8 weights), 8da4w (dynamic int8 "
                 "activations, int4 weights per group) or fp8 (e4m3, dynamic per-tensor scales)")
      ->capture_default_str()
      ->check(one_of({"int8", "8da4w", "fp8"}));
  app.add_option("--group-size", f.group_size, "8da4w: int4 weight group size along in_features (a layer it does "
                 "not divide stays float, as in torchao)")
      ->capture_default_str()
      ->check(integer_in(2, 4096));
  CLI11_PARSE(app, argc, argv);
  if (f.probe_cuda) return cuda_device_count() > 0 ? 0 : 77;

  nlohmann::ordered_json flags = qat_flags_json(f);
  if (f.recipe != "int8") flags["recipe"] = f.recipe, flags["group_size"] = f.group_size;
  return run_or_report([&](const std::string& text) { return run(f, text); }, flags);
}
