// qgrad-smoothquant: naive W8A8 against SmoothQuant against float.
//
// Two models: (1) a two-layer MLP whose activations have a few outlier
// channels (synthetic, seeded); (2) with --fmnist-checkpoint, the trained
// 784-256-256-10 Fashion-MNIST MLP that qgrad-qat-mlp saves as
// <out>/float.safetensors, calibrated on training images and evaluated on
// the test set. Prints the relative Frobenius error of each variant's output
// against float (and, for Fashion-MNIST, the test accuracy) and writes the
// tables as Markdown to --out.
//
//   qgrad-smoothquant [--out FILE] [--seed N] [--alpha A] [--device cpu|cuda]
//                     [--fmnist-checkpoint qat-mlp-out/float.safetensors] [--data DIR]
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "qgrad/qgrad.h"
#include "../cli_checks.h"

using namespace qgrad;

namespace {

struct Linear {
  Tensor w, b;  // f32 [N, K], [N] on the host
};

// Float reference y = relu?(x W^T + b), in double, returned as f32.
Tensor linear_f(const Tensor& x, const Linear& l, bool relu) {
  const auto xv = x.detach().to(DType::f64).cpu().to_vector<double>();
  const auto wv = l.w.to(DType::f64).to_vector<double>(), bv = l.b.to(DType::f64).to_vector<double>();
  const std::int64_t K = l.w.size(1), N = l.w.size(0), M = x.numel() / K;
  std::vector<float> y(static_cast<std::size_t>(M * N));
  for (std::int64_t m = 0; m < M; ++m)
    for (std::int64_t n = 0; n < N; ++n) {
      double acc = bv[static_cast<std::size_t>(n)];
      for (std::int64_t k = 0; k < K; ++k)
        acc += xv[static_cast<std::size_t>(m * K + k)] * wv[static_cast<std::size_t>(n * K + k)];
      y[static_cast<std::size_t>(m * N + n)] = static_cast<float>(relu && acc < 0 ? 0.0 : acc);
    }
  return Tensor::from_vector<float>(y, {M, N});
}

double rel_fro(const Tensor& a, const Tensor& ref) {
  const auto av = a.detach().to(DType::f64).cpu().to_vector<double>();
  const auto rv = ref.detach().to(DType::f64).cpu().to_vector<double>();
  double num = 0, den = 0;
  for (std::size_t i = 0; i < av.size(); ++i) {
    num += (av[i] - rv[i]) * (av[i] - rv[i]);
    den += rv[i] * rv[i];
  }
  return std::sqrt(num / den);
}

// Inputs with outlier channels: a few features 50x larger than the rest.
Tensor make_input(std::int64_t rows, std::int64_t K, Generator& g) {
  auto v = randn({rows, K}, g).to_vector<float>();
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t j : {std::int64_t(5), std::int64_t(17), K - 3}) v[static_cast<std::size_t>(r * K + j)] *= 50.0f;
  return Tensor::from_vector<float>(v, {rows, K});
}

// Naive W8A8 of one layer: per-channel weights, static per-tensor
// activation scale from the calibrated max.
Tensor naive_layer(const Tensor& x, const Linear& l, const SmoothQuantCalibrator& calib, Device dev) {
  auto wq = dynamic_range_quantize(l.w, QuantScope::per_token(), QuantMode::symmetric, DType::s8, -127, 127);
  const auto amax = calib.act_absmax().cpu().to_vector<float>();
  float m = 0;
  for (float a : amax) m = a > m ? a : m;
  const auto act = ActivationQuant::fixed(Tensor::from_vector<float>({m / 127.0f}, {1}, dev),
                                          Tensor::from_vector<std::int32_t>({0}, {1}, dev), -127, 127);
  return quantized_linear(x.to(dev), wq.q.to(dev), wq.scale.to(dev), l.b.to(dev), act);
}

Tensor dynamic_layer(const Tensor& x, const Linear& l, Device dev) {
  auto wq = dynamic_range_quantize(l.w, QuantScope::per_token(), QuantMode::symmetric, DType::s8, -127, 127);
  return quantized_linear(x.to(dev), wq.q.to(dev), wq.scale.to(dev), l.b.to(dev), ActivationQuant::dynamic());
}

// The trained Fashion-MNIST MLP: three linear layers with ReLU between,
// each quantized three ways. Returns the Markdown table.
std::string fashion_mnist_table(const std::string& checkpoint, const std::string& data_dir, double alpha, Device dev) {
  const nn::SafetensorsFile file = nn::load_safetensors(checkpoint);
  auto get = [&](const std::string& name) {
    for (const auto& [n, t] : file.tensors)
      if (n == "model." + name) return t.to(DType::f32);
    throw Error("qgrad-smoothquant", "fmnist-checkpoint", checkpoint + " has no tensor model." + name);
  };
  const std::vector<Linear> layers = {{get("0.weight"), get("0.bias")}, {get("2.weight"), get("2.bias")},
                                      {get("4.weight"), get("4.bias")}};
  const nn::Dataset train = nn::load_fashion_mnist("train", data_dir);
  const nn::Dataset test = nn::load_fashion_mnist("t10k", data_dir);
  // Calibrate every layer's input on 2048 training images (float activations).
  const std::int64_t calib_rows = 2048;
  auto first_rows = train.images.to_vector<float>();
  first_rows.resize(static_cast<std::size_t>(calib_rows * 784));
  const Tensor calib_x = Tensor::from_vector(first_rows, {calib_rows, 784});
  std::vector<SmoothQuantCalibrator> calib;
  Tensor h = calib_x;
  for (std::size_t i = 0; i < layers.size(); ++i) {
    calib.emplace_back(layers[i].w.size(1), dev);
    calib.back().observe(h.to(dev));
    h = linear_f(h, layers[i], i + 1 < layers.size());
  }
  const Tensor x = test.images;
  // Float reference and the three W8A8 variants, layer by layer.
  Tensor y_float = x, y_naive = x, y_dyn = x, y_sq = x;
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const bool last = i + 1 == layers.size();
    y_float = linear_f(y_float, layers[i], !last);
    y_naive = naive_layer(y_naive, layers[i], calib[i], dev);
    y_dyn = dynamic_layer(y_dyn, layers[i], dev);
    const SmoothQuantLinear sq = SmoothQuantLinear::from_float(layers[i].w.to(dev), layers[i].b.to(dev), calib[i], alpha);
    y_sq = sq.forward(y_sq.to(dev));
    if (!last) {
      y_naive = qgrad::relu(y_naive);
      y_dyn = qgrad::relu(y_dyn);
      y_sq = qgrad::relu(y_sq);
    }
  }
  auto accuracy = [&](const Tensor& logits) {
    const auto pred = argmax(logits.to(DType::f32).cpu(), 1).to_vector<std::int64_t>();
    const auto lab = test.labels.to_vector<std::int64_t>();
    std::int64_t ok = 0;
    for (std::size_t i = 0; i < lab.size(); ++i) ok += pred[i] == lab[i];
    return 100.0 * static_cast<double>(ok) / static_cast<double>(lab.size());
  };
  char table[1024];
  std::snprintf(table, sizeof table,
                "| variant | relative Frobenius error of the logits | test accuracy |\n"
                "| --- | --- | --- |\n"
                "| float (f64 reference) | 0 | %.2f%% |\n"
                "| naive W8A8 (static per-tensor activations, per-channel weights) | %.4e | %.2f%% |\n"
                "| W8A8, dynamic per-token activations | %.4e | %.2f%% |\n"
                "| SmoothQuant W8A8 (alpha %.2f, static per-tensor activations) | %.4e | %.2f%% |\n",
                accuracy(y_float), rel_fro(y_naive, y_float), accuracy(y_naive), rel_fro(y_dyn, y_float),
                accuracy(y_dyn), alpha, rel_fro(y_sq, y_float), accuracy(y_sq));
  return table;
}

}  // namespace

int main(int argc, char** argv) {
  std::string out_path, fmnist_checkpoint, data_dir = nn::kFashionMnistDir;
  std::uint64_t seed = 1234;
  double alpha = 0.5;
  std::string device = "cpu";
  CLI::App app{"naive W8A8 against SmoothQuant against float"};
  app.add_option("--out", out_path, "write the tables as Markdown to this file");
  app.add_option("--seed", seed, "seed of the synthetic model and data")->capture_default_str()->check(qgrad_examples::seed_value());
  app.add_option("--alpha", alpha, "SmoothQuant migration strength, in (0, 1)")
      ->capture_default_str()
      ->check(qgrad_examples::number_in(0, 1, /*lo_open=*/true, /*hi_open=*/true));
  app.add_option("--device", device, "cpu, cuda or cuda:N")->capture_default_str()->check(qgrad_examples::device_name(false));
  app.add_option("--fmnist-checkpoint", fmnist_checkpoint,
                 "float.safetensors written by qgrad-qat-mlp: also compare on the trained Fashion-MNIST MLP");
  app.add_option("--data", data_dir, "folder with the Fashion-MNIST IDX files")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  Device dev;
  try {
    dev = Device::parse(device);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  try {
    const std::int64_t D = 128, H = 256, O = 64, calib_batches = 8, rows = 64;
    Generator g(seed);
    Linear l1{randn({H, D}, g, {}, 0.0, 0.05), randn({H}, g, {}, 0.0, 0.05)};
    Linear l2{randn({O, H}, g, {}, 0.0, 0.05), randn({O}, g, {}, 0.0, 0.05)};
    // A few hidden units with large weights: outliers in layer 2's input too.
    {
      auto w = l1.w.to_vector<float>();
      for (std::int64_t j : {std::int64_t(9), std::int64_t(100), H - 7})
        for (std::int64_t k = 0; k < D; ++k) w[static_cast<std::size_t>(j * D + k)] *= 20.0f;
      l1.w = Tensor::from_vector<float>(w, {H, D});
    }
    SmoothQuantCalibrator c1(D, dev), c2(H, dev);
    for (std::int64_t b = 0; b < calib_batches; ++b) {
      Tensor x = make_input(rows, D, g);
      c1.observe(x.to(dev));
      c2.observe(linear_f(x, l1, true).to(dev));
    }
    Tensor x = make_input(rows, D, g);
    const Tensor y_float = linear_f(linear_f(x, l1, true), l2, false);
    const Tensor y_naive = naive_layer(qgrad::relu(naive_layer(x, l1, c1, dev)), l2, c2, dev);
    const Tensor y_dyn = dynamic_layer(qgrad::relu(dynamic_layer(x, l1, dev)), l2, dev);
    const SmoothQuantLinear s1 = SmoothQuantLinear::from_float(l1.w.to(dev), l1.b.to(dev), c1, alpha);
    const SmoothQuantLinear s2 = SmoothQuantLinear::from_float(l2.w.to(dev), l2.b.to(dev), c2, alpha);
    const Tensor y_sq = s2.forward(qgrad::relu(s1.forward(x.to(dev))).to(dev));
    const double e_naive = rel_fro(y_naive, y_float), e_dyn = rel_fro(y_dyn, y_float), e_sq = rel_fro(y_sq, y_float);
    char table[1024];
    std::snprintf(table, sizeof table,
                  "| variant | relative Frobenius error of the MLP output |\n"
                  "| --- | --- |\n"
                  "| float (f64 reference) | 0 |\n"
                  "| naive W8A8 (static per-tensor activations, per-channel weights) | %.4e |\n"
                  "| W8A8, dynamic per-token activations | %.4e |\n"
                  "| SmoothQuant W8A8 (alpha %.2f, static per-tensor activations) | %.4e |\n",
                  e_naive, e_dyn, alpha, e_sq);
    std::printf("MLP %lld-%lld-%lld, ReLU, outlier channels in both layers' inputs; seed %llu, device %s\n\n%s",
                static_cast<long long>(D), static_cast<long long>(H), static_cast<long long>(O),
                static_cast<unsigned long long>(seed), dev.str().c_str(), table);
    std::string fmnist;
    if (!fmnist_checkpoint.empty()) {
      fmnist = fashion_mnist_table(fmnist_checkpoint, data_dir, alpha, dev);
      std::printf("\nThe trained Fashion-MNIST MLP (%s), 10000 test images:\n\n%s", fmnist_checkpoint.c_str(),
                  fmnist.c_str());
    }
    if (!out_path.empty()) {
      std::ofstream f(out_path);
      f << "# SmoothQuant on a synthetic MLP with outlier channels\n\n"
        << "Two-layer MLP " << D << "-" << H << "-" << O << " with ReLU; three input features 50x the rest and three "
        << "hidden units with 20x weights; " << calib_batches << " calibration batches of " << rows
        << " rows; seed " << seed << ", device " << dev.str() << ".\n\n"
        << table;
      if (!fmnist.empty()) {
        f << "\n# SmoothQuant on the trained Fashion-MNIST MLP\n\n784-256-256-10 MLP trained by qgrad-qat-mlp "
          << "(float phase), every layer's input calibrated on 2048 training images; logits of the 10000 test "
          << "images against the float model; device " << dev.str() << ".\n\n"
          << fmnist;
      }
      if (!f) {
        std::fprintf(stderr, "cannot write %s\n", out_path.c_str());
        return 1;
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
