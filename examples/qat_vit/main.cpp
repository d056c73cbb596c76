// qgrad-qat-vit: quantization-aware training of a tiny Vision Transformer
// on Fashion-MNIST, end to end (nn/vit.h):
//   4x4 patches -> Linear(16 -> D) + learned position embedding
//   -> depth x pre-norm encoder block (LayerNorm -> multi-head attention ->
//      residual; LayerNorm -> Linear -> GELU -> Linear -> residual)
//   -> LayerNorm -> mean over the 49 tokens -> Linear(D -> 10);
//   D = --dim (128), --depth (6) blocks, --heads (4), MLP ratio --mlp-ratio (2);
//   1. train the float model (AdamW with decoupled weight decay, linear
//      warmup then cosine, optional --clip-grad-norm on the device);
//   2. optionally (--smoothquant) calibrate SmoothQuant factors on a few
//      training batches and fold them into ln1 -> attention in_proj and
//      ln2 -> fc1 (the same function, float);
//   3. prepare_qat with --recipe (nn/recipes.h; every Linear, nested ones
//      included): 8da8w (default; dynamic per-token asymmetric int8
//      activations, per-channel symmetric int8 weights), 8da4w (the same
//      activations, int4 weights in groups of --group-size along in_features;
//      a Linear the group does not divide, the 16-input patch projection at
//      group 32, stays float as torchao's quantizer leaves it) or fp8 (e4m3
//      weights and activations, dynamic per-tensor scales); straight-through;
//      fine-tune;
//   4. convert (8da8w: W8A8 quantized_linear on int8 tensor cores; 8da4w:
//      linear_w4a8; fp8: fp8_linear on FP8 tensor cores; the attention
//      matmuls, norms and GELU stay floating point) and evaluate all three.
// Writes what qgrad-qat-mlp writes (examples/common/qat_train.h): metrics.csv,
// report.json (the converted model under the recipe's name: "8da8w_acc",
// "8da8w_vs_qat_agreement", ...; 8da4w adds "group_size" and "float_layers"),
// plots, the graph of one QAT training step (DOT) and safetensors checkpoints
// (float, qat, <recipe>); --checkpoint-every / --resume as there. --bf16 (=
// --precision bf16, 8da8w only): bf16 matmuls and activations, f32 master
// weights and optimizer state.
//
//   qgrad-qat-vit [--epochs 40] [--qat-epochs 2] [--augment-shift 1] [--device auto|cpu|cuda]
//                 [--recipe 8da8w|8da4w|fp8] [--group-size 32] [--smoothquant] [--bf16] ...
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
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
  // AdamW at 1e-3 (linear warmup over 5% of the steps, at most 200, then
  // cosine to 0) for the float phase, then a short fine-tune with fake quant
  // at a tenth of that; gradients clipped to global norm 1 (on the device).
  Flags() {
    epochs = 40;
    qat_epochs = 2;
    batch = 256;
    lr = 1e-3;
    qat_lr = 1e-4;
    weight_decay = 0.05;
    clip_grad_norm = 1.0;
    out = "qat-vit-out";
  }
  std::int64_t patch = 4, dim = 128, depth = 6, heads = 4, mlp_ratio = 2;
  bool smoothquant = false;          // --smoothquant
  double smoothquant_alpha = 0.5;    // --smoothquant-alpha
  std::int64_t calib_batches = 8;    // --calib-batches
  std::int64_t augment_shift = 1;    // --augment-shift (0: no augmentation)
  std::string recipe = "8da8w";      // --recipe 8da8w|8da4w|fp8 (nn/recipes.h)
  std::int64_t group_size = 32;      // --group-size: 8da4w int4 weight groups
};

// The converted checkpoint's metadata: its format ("qgrad-8da8w-vit",
// "qgrad-8da4w-vit", "qgrad-fp8-vit") and the group size of each int4 weight.
Metadata converted_metadata(const Module& m, const std::string& recipe) {
  Metadata md{{"format", "qgrad-" + recipe + "-vit"}};
  const std::function<void(const Module&, const std::string&)> visit = [&](const Module& mod, const std::string& prefix) {
    for (const auto& [name, child] : mod.named_children()) {
      if (const auto* l = dynamic_cast<const Int8DynActInt4WeightLinear*>(child.get()))
        md[prefix + name + ".weight.group_size"] = std::to_string(l->group_size());
      visit(*child, prefix + name + ".");
    }
  };
  visit(m, "");
  return md;
}

// The first n batches of the training set in order (no shuffling), on dev.
std::vector<Tensor> calibration_batches(const Dataset& train, std::int64_t batch, std::int64_t n, Device dev) {
  DataLoader loader(train, batch, /*shuffle=*/false, 0, false, dev);
  std::vector<Tensor> out;
  Batch b;
  while (static_cast<std::int64_t>(out.size()) < n && loader.next(b)) out.push_back(b.images);
  return out;
}

// The loss and accuracy curves, and output channel 0 of block 0's fc1 against
// its per-channel int8 grid (scale = amax / 127.5, zero point 0).
// Random translation by up to `max_shift` pixels in each direction and a
// horizontal flip with probability 1/2, drawn per image from `gen`: one
// gather (embedding over the batch's pixels as a one-column table) with the
// source indices clamped to the image, so uncovered border pixels repeat the
// edge (Fashion-MNIST's background). images: [B, 28 * 28], normalized.
Tensor random_shift_flip(const Tensor& images, std::int64_t max_shift, Generator& gen) {
  constexpr std::int64_t kSide = 28, kPixels = kSide * kSide;
  const std::int64_t B = images.size(0);
  const std::vector<std::int64_t> draws =  // per image: dy, dx, flip (low bit)
      randint(0, 2 * max_shift + 1, {B, 3}, gen, TensorOptions{}.with_dtype(DType::s64)).to_vector<std::int64_t>();
  std::vector<std::int64_t> index(static_cast<std::size_t>(B * kPixels));
  for (std::int64_t b = 0; b < B; ++b) {
    const std::int64_t dy = draws[static_cast<std::size_t>(3 * b)] - max_shift;
    const std::int64_t dx = draws[static_cast<std::size_t>(3 * b + 1)] - max_shift;
    const bool flip = (draws[static_cast<std::size_t>(3 * b + 2)] & 1) != 0;
    for (std::int64_t r = 0; r < kSide; ++r)
      for (std::int64_t c = 0; c < kSide; ++c) {
        const std::int64_t sr = std::clamp<std::int64_t>(r + dy, 0, kSide - 1);
        const std::int64_t sc = std::clamp<std::int64_t>((flip ? kSide - 1 - c : c) + dx, 0, kSide - 1);
        index[static_cast<std::size_t>(b * kPixels + r * kSide + c)] = b * kPixels + sr * kSide + sc;
      }
  }
  const Tensor idx = Tensor::from_vector(index, {B, kPixels}, images.device());
  return embedding(images.reshape({B * kPixels, 1}), idx).reshape({B, kPixels});
}

std::vector<std::string> write_plots(const std::vector<EpochRecord>& records, const Sequential& model,
                                     const std::string& out, PlotFormat format) {
  std::vector<std::string> files = write_curves(records, out, format);
  const auto* block = dynamic_cast<const EncoderBlock*>(model[1].get());
  const auto* fc1 = block ? dynamic_cast<const Int8DynActInt8WeightQATLinear*>(block->named_children()[3].second.get())
                          : nullptr;
  if (!fc1) return files;
  const Tensor w = fc1->weight().detach().cpu();
  auto wv = w.to(DType::f64).to_vector<double>();
  wv.resize(static_cast<std::size_t>(w.size(1)));
  double amax = 0;
  for (double v : wv) amax = std::max(amax, std::fabs(v));
  const double scale = std::max(static_cast<double>(static_cast<float>(amax) / 127.5f),
                                static_cast<double>(std::numeric_limits<float>::epsilon()));
  files.push_back(write_weight_grid(wv, scale, 0, -128, 127, "Block 0 fc1, output channel 0: weights and their int8 grid",
                                    out + "/weights_layer0", format));
  return files;
}

int run(const Flags& f, const std::string& flags_text) {
  const RunSetup setup = run_setup(f);
  const auto& [dev, format, report_path, t_start, train, test, pg] = setup;
  std::printf("qgrad-qat-vit: ViT %lldx%lld patches, dim %lld, %lld blocks, %lld heads, MLP x%lld, Fashion-MNIST "
              "%lld train / %lld test, device %s, seed %llu%s%s\n",
              static_cast<long long>(f.patch), static_cast<long long>(f.patch), static_cast<long long>(f.dim),
              static_cast<long long>(f.depth), static_cast<long long>(f.heads), static_cast<long long>(f.mlp_ratio),
              static_cast<long long>(train.size()), static_cast<long long>(test.size()), dev.str().c_str(),
              static_cast<unsigned long long>(f.seed), f.smoothquant ? ", SmoothQuant" : "",
              f.precision == "f32" ? "" : (", " + f.precision).c_str());

  Generator gen(f.seed);
  ViTOptions vo;
  vo.patch = f.patch, vo.dim = f.dim, vo.depth = f.depth, vo.heads = f.heads, vo.mlp_ratio = f.mlp_ratio;
  auto model = make_vit(vo, gen);
  model->to(dev);
  if (f.precision == "bf16") model->set_compute_dtype(DType::bf16);  // f32 master weights; prepare_qat keeps it
  TrainOptions to = train_options(f, "qgrad-qat-vit");
  to.optimizer = "adamw";
  if (f.augment_shift > 0)
    to.augment = [&f, &gen](const Tensor& x) { return random_shift_flip(x, f.augment_shift, gen); };
  Trainer trainer(to, dev, train, test, gen, nlohmann::json::parse(flags_text), setup.pg);
  const Recipe recipe = parse_recipe(f.recipe);
  FlowOptions fo = flow_options(f, "qgrad-" + f.recipe + "-vit");
  fo.recipe = recipe_name(recipe);
  fo.convert = [recipe](Sequential& m) { return convert(m, recipe); };
  fo.enable_fake_quant = [](Sequential& m, bool on) { enable_recipe_fake_quant(m, on); };
  fo.converted_metadata = [&](const Sequential& m) { return converted_metadata(m, fo.recipe); };
  RecipeOptions recipe_options;
  recipe_options.group_size = f.group_size;
  recipe_options.skip_indivisible = true;  // torchao's quantizer: a layer G does not divide stays float
  std::vector<std::string> float_layer_names;
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();
  const FlowResult res = run_flow(trainer, *model, fo, test, dev, [&](Sequential& m) {
    if (f.smoothquant) {
      const std::vector<Tensor> calib = calibration_batches(train, f.batch, f.calib_batches, dev);
      smoothquant_encoder_blocks(m, calib, f.smoothquant_alpha);
      extra["smoothquant"] = {{"alpha", f.smoothquant_alpha}, {"calib_batches", static_cast<std::int64_t>(calib.size())}};
      // The fold keeps the float function (to a few roundings). After --resume the weights here are
      // not yet the trained ones (the QAT state is restored next), so nothing is measured then.
      if (!f.resume && trainer.writer())
        std::printf("SmoothQuant folded (alpha %.2f, %zu batches): float test accuracy %.2f%% after the fold\n",
                    f.smoothquant_alpha, calib.size(), 100 * accuracy(predict(m, test, dev), test));
    }
    prepare_qat(m, recipe, recipe_options);
    float_layer_names = float_layers(m);
  });
  if (!res.int8) return 0;  // a rank other than 0: evaluation and files are rank 0's
  if (recipe == Recipe::w8da4) extra["group_size"] = f.group_size, extra["float_layers"] = float_layer_names;

  auto plots = write_plots(trainer.records, *model, f.out, format);
  return finish_run(f, setup, res, trainer, plots, flags_text, {}, extra);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Quantization-aware training of a tiny Vision Transformer on Fashion-MNIST with qgrad (8da8w, 8da4w "
               "or fp8)"};
  Flags f;
  add_qat_options(app, f);
  app.add_flag_callback("--bf16", [&f] { f.precision = "bf16"; }, "bf16 mixed precision (= --precision bf16)");
  app.add_option("--patch", f.patch, "patch size (must divide 28)")->capture_default_str()->check(one_of({"1", "2", "4", "7", "14", "28"}));
  app.add_option("--dim", f.dim, "embedding width D")->capture_default_str()->check(integer_in(1, 4096));
  app.add_option("--depth", f.depth, "encoder blocks")->capture_default_str()->check(integer_in(1, 64));
  app.add_option("--heads", f.heads, "attention heads (must divide --dim)")->capture_default_str()->check(integer_in(1, 4096));
  app.add_option("--mlp-ratio", f.mlp_ratio, "MLP hidden width / D")->capture_default_str()->check(integer_in(1, 16));
  app.add_flag("--smoothquant", f.smoothquant,
               "calibrate SmoothQuant factors after the float phase and fold them into ln1 -> in_proj, ln2 -> fc1");
  app.add_option("--smoothquant-alpha", f.smoothquant_alpha, "SmoothQuant migration strength alpha")
      ->capture_default_str()
      ->check(number_in(0, 1, /*lo_open=*/true, /*hi_open=*/true));
  app.add_option("--calib-batches", f.calib_batches, "SmoothQuant: training batches to calibrate on")
      ->capture_default_str()
      ->check(integer_in(1, 1000));
  app.add_option("--augment-shift", f.augment_shift,
                 "training augmentation: random shift by up to this many pixels and a random horizontal flip "
                 "per image (0: none)")
      ->capture_default_str()
      ->check(integer_in(0, 8));
  app.add_option("--recipe", f.recipe, "QAT recipe: 8da8w (dynamic int8 activations, int8 weights per channel), "
                 "8da4w (dynamic int8 activations, int4 weights per group) or fp8 (e4m3, dynamic per-tensor scales)")
      ->capture_default_str()
      ->check(one_of({"8da8w", "8da4w", "fp8"}));
  app.add_option("--group-size", f.group_size, "8da4w: int4 weight group size along in_features (a layer it does "
                 "not divide stays float, as in torchao)")
      ->capture_default_str()
      ->check(integer_in(2, 4096));
  CLI11_PARSE(app, argc, argv);
  if (f.probe_cuda) return cuda_device_count() > 0 ? 0 : 77;
  if (f.precision == "bf16" && f.recipe != "8da8w") {
    // The 8da4w and fp8 QAT linears fake-quantize in the weights' dtype only.
    std::fprintf(stderr, "--bf16: must go with --recipe 8da8w, got '--recipe %s'\n", f.recipe.c_str());
    return 2;
  }
  if (f.dim % f.heads != 0) {
    std::fprintf(stderr, "--heads: must be a divisor of --dim %lld, got '%lld'\n", static_cast<long long>(f.dim),
                 static_cast<long long>(f.heads));
    return 2;
  }

  nlohmann::ordered_json flags = qat_flags_json(f);
  flags["optimizer"] = "adamw";
  flags["recipe"] = f.recipe;
  if (f.recipe == "8da4w") flags["group_size"] = f.group_size;
  flags["patch"] = f.patch;
  flags["dim"] = f.dim;
  flags["depth"] = f.depth;
  flags["heads"] = f.heads;
  flags["mlp_ratio"] = f.mlp_ratio;
  flags["smoothquant"] = f.smoothquant;
  flags["augment_shift"] = f.augment_shift;
  if (f.smoothquant) flags["smoothquant_alpha"] = f.smoothquant_alpha, flags["calib_batches"] = f.calib_batches;
  return run_or_report([&](const std::string& text) { return run(f, text); }, flags);
}
