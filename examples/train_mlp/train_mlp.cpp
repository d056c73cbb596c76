// qgrad-train-mlp: a 2-64-64-2 ReLU MLP trained with plain mini-batch SGD on
// a seeded two-moons problem, on the CPU or a CUDA device. Prints the loss
// per epoch and the accuracy on a held-out set.
//
//   qgrad-train-mlp [--device cpu|cuda] [--epochs 30] [--lr 0.1] [--batch 32] [--seed 7]
#include <CLI/CLI.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <vector>

#include "qgrad/qgrad.h"
#include "../cli_checks.h"

using namespace qgrad;

namespace {

struct Dataset {
  std::vector<float> x;  // [n, 2]
  std::vector<std::int64_t> y;  // [n]
  std::int64_t size() const { return static_cast<std::int64_t>(y.size()); }
};

// Two interleaved half circles with Gaussian noise; classes alternate.
Dataset make_moons(std::int64_t n, double noise, Generator& gen) {
  const double pi = 3.14159265358979323846;
  auto t = rand({n}, gen, TensorOptions{}.with_dtype(DType::f64), 0.0, pi).to_vector<double>();
  auto e = randn({n, 2}, gen, TensorOptions{}.with_dtype(DType::f64), 0.0, noise).to_vector<double>();
  Dataset d;
  for (std::int64_t i = 0; i < n; ++i) {
    const auto k = static_cast<std::size_t>(i);
    const bool upper = i % 2 == 0;
    const double px = upper ? std::cos(t[k]) : 1.0 - std::cos(t[k]);
    const double py = upper ? std::sin(t[k]) : 0.5 - std::sin(t[k]);
    d.x.push_back(static_cast<float>(px + e[2 * k]));
    d.x.push_back(static_cast<float>(py + e[2 * k + 1]));
    d.y.push_back(upper ? 0 : 1);
  }
  return d;
}

struct Linear {
  Tensor w, b;
  Linear(std::int64_t in, std::int64_t out, Generator& gen, Device dev) {
    // Kaiming-uniform-like init: U(-1/sqrt(in), 1/sqrt(in)) scaled for ReLU.
    const double bound = std::sqrt(6.0 / static_cast<double>(in));
    w = rand({out, in}, gen, TensorOptions{}.with_device(dev), -bound, bound);
    b = zeros({out}, TensorOptions{}.with_device(dev));
    w.set_requires_grad(true);
    b.set_requires_grad(true);
  }
  Tensor operator()(const Tensor& x) const { return linear(x, w, b); }
};

struct Mlp {
  Linear l1, l2, l3;
  Mlp(Generator& gen, Device dev) : l1(2, 64, gen, dev), l2(64, 64, gen, dev), l3(64, 2, gen, dev) {}
  Tensor operator()(const Tensor& x) const { return l3(relu(l2(relu(l1(x))))); }
  std::vector<Tensor> parameters() const { return {l1.w, l1.b, l2.w, l2.b, l3.w, l3.b}; }
};

// p <- p - lr * grad, outside the graph.
void sgd_step(const std::vector<Tensor>& params, double lr) {
  NoGradGuard no_grad;
  for (Tensor p : params) {
    p.copy_(sub(p, mul(p.grad(), lr)));
    p.zero_grad();
  }
}

double accuracy(const Mlp& model, const Dataset& d, Device dev) {
  NoGradGuard no_grad;
  Tensor x = Tensor::from_vector(d.x, {d.size(), 2}, dev);
  auto pred = argmax(model(x), 1).cpu().to_vector<std::int64_t>();
  std::int64_t correct = 0;
  for (std::size_t i = 0; i < pred.size(); ++i) correct += pred[i] == d.y[i];
  return static_cast<double>(correct) / static_cast<double>(d.size());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Train a small MLP on a seeded two-moons problem with qgrad"};
  std::string device_name = "cpu";
  int epochs = 30;
  double lr = 0.1;
  std::int64_t batch = 32;
  std::uint64_t seed = 7;
  app.add_option("--device", device_name, "cpu, cuda or cuda:N")->capture_default_str()->check(qgrad_examples::device_name(false));
  app.add_option("--epochs", epochs, "passes over the training set")->capture_default_str()->check(qgrad_examples::integer_in(1, 100000));
  app.add_option("--lr", lr, "SGD learning rate")->capture_default_str()->check(qgrad_examples::number_in(0, 10, true));
  app.add_option("--batch", batch, "mini-batch size")->capture_default_str()->check(qgrad_examples::integer_in(1, 1 << 20));
  app.add_option("--seed", seed, "seed of the data, the init and the shuffling")->capture_default_str()->check(qgrad_examples::seed_value());
  CLI11_PARSE(app, argc, argv);

  try {
    const Device dev = Device::parse(device_name);
    Generator gen(seed);
    const Dataset train = make_moons(2000, 0.1, gen);
    const Dataset test = make_moons(1000, 0.1, gen);
    Mlp model(gen, dev);
    std::printf("qgrad-train-mlp: 2-64-64-2 MLP, two moons (%lld train / %lld test), device %s\n",
                static_cast<long long>(train.size()), static_cast<long long>(test.size()), dev.str().c_str());

    std::vector<std::int64_t> order(static_cast<std::size_t>(train.size()));
    std::iota(order.begin(), order.end(), 0);
    std::uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
    const auto start = std::chrono::steady_clock::now();
    for (int epoch = 1; epoch <= epochs; ++epoch) {
      // Fisher-Yates with a fixed LCG: the same order on every platform.
      for (std::size_t i = order.size() - 1; i > 0; --i) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        std::swap(order[i], order[static_cast<std::size_t>((state >> 33) % (i + 1))]);
      }
      double loss_sum = 0;
      std::int64_t batches = 0;
      for (std::int64_t first = 0; first < train.size(); first += batch) {
        const std::int64_t n = std::min(batch, train.size() - first);
        std::vector<float> bx;
        std::vector<std::int64_t> by;
        for (std::int64_t i = first; i < first + n; ++i) {
          const auto k = static_cast<std::size_t>(order[static_cast<std::size_t>(i)]);
          bx.push_back(train.x[2 * k]);
          bx.push_back(train.x[2 * k + 1]);
          by.push_back(train.y[k]);
        }
        Tensor x = Tensor::from_vector(bx, {n, 2}, dev);
        Tensor y = Tensor::from_vector(by, {n}, dev);
        Tensor loss = cross_entropy(model(x), y);
        loss.backward();
        sgd_step(model.parameters(), lr);
        loss_sum += loss.item();
        ++batches;
      }
      std::printf("epoch %3d  loss %.4f\n", epoch, loss_sum / static_cast<double>(batches));
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double train_acc = accuracy(model, train, dev), test_acc = accuracy(model, test, dev);
    std::printf("train accuracy %.2f%%  test accuracy %.2f%%  (%.2f s)\n", 100 * train_acc, 100 * test_acc, seconds);
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
