// nn::BatchNorm2d, MaxPool2d, AvgPool2d, AdaptiveAvgPool2d, Flatten:
// PyTorch's defaults, train/eval, num_batches_tracked and the cumulative
// momentum, checkpoints holding the running statistics, a small CNN-shaped
// training step.
#include "helpers.h"
#include "test_nn_helpers.h"
#include "qgrad/nn/checkpoint.h"
#include "qgrad/nn/layers.h"
#include "qgrad/nn/optim.h"
#include "qgrad/nn/pool_norm.h"

using namespace qgrad;
using namespace qgrad::nn;
using qgrad::testing::bit_equal;
using qgrad::testing::error_of;
using qgrad::testing::TempDir;
using qgrad::testing::values;

namespace {

TensorOptions f64() { return TensorOptions{}.with_dtype(DType::f64); }

Tensor batch(std::uint64_t seed, double scale = 2.0, double shift = 0.5) {
  Generator g(seed);
  return randn({4, 3, 5, 5}, g, f64(), shift, scale);
}

// Per-channel batch mean and unbiased variance of x [N, C, H, W] in double.
void channel_stats(const Tensor& x, std::vector<double>& mean, std::vector<double>& var_unbiased) {
  const auto v = values(x);
  const std::int64_t N = x.size(0), C = x.size(1), inner = x.size(2) * x.size(3);
  mean.assign(static_cast<std::size_t>(C), 0);
  var_unbiased.assign(static_cast<std::size_t>(C), 0);
  for (std::int64_t c = 0; c < C; ++c) {
    double s = 0, sq = 0;
    for (std::int64_t n = 0; n < N; ++n)
      for (std::int64_t j = 0; j < inner; ++j) s += v[static_cast<std::size_t>((n * C + c) * inner + j)];
    const double m = s / static_cast<double>(N * inner);
    for (std::int64_t n = 0; n < N; ++n)
      for (std::int64_t j = 0; j < inner; ++j) {
        const double d = v[static_cast<std::size_t>((n * C + c) * inner + j)] - m;
        sq += d * d;
      }
    mean[static_cast<std::size_t>(c)] = m;
    var_unbiased[static_cast<std::size_t>(c)] = sq / static_cast<double>(N * inner - 1);
  }
}

}  // namespace

TEST_CASE("BatchNorm2d: PyTorch's initial state, parameters and buffers") {
  BatchNorm2d bn(3, 1e-5, 0.1, true, true, f64());
  CHECK(values(bn.weight()) == std::vector<double>{1, 1, 1});
  CHECK(values(bn.bias()) == std::vector<double>{0, 0, 0});
  CHECK(values(bn.running_mean()) == std::vector<double>{0, 0, 0});
  CHECK(values(bn.running_var()) == std::vector<double>{1, 1, 1});
  CHECK(bn.num_batches_tracked().dtype() == DType::s64);
  CHECK(bn.num_batches_tracked().item() == 0);
  const NamedTensors p = bn.named_parameters(), b = bn.named_buffers();
  REQUIRE(p.size() == 2);
  CHECK(p[0].first == "weight");
  CHECK(p[1].first == "bias");
  REQUIRE(b.size() == 3);
  CHECK(b[0].first == "running_mean");
  CHECK(b[1].first == "running_var");
  CHECK(b[2].first == "num_batches_tracked");
  BatchNorm2d plain(3, 1e-5, 0.1, false, false);
  CHECK(plain.named_parameters().empty());
  CHECK(plain.named_buffers().empty());
}

TEST_CASE("BatchNorm2d: training moves the running statistics, eval uses them") {
  BatchNorm2d bn(3, 1e-5, 0.1, true, true, f64());
  Tensor x = batch(1);
  std::vector<double> mean, var;
  channel_stats(x, mean, var);
  Tensor y = bn(x);
  CHECK(bn.num_batches_tracked().item() == 1);
  for (std::size_t c = 0; c < 3; ++c) {
    CHECK(values(bn.running_mean())[c] == doctest::Approx(0.1 * mean[c]).epsilon(1e-12));
    CHECK(values(bn.running_var())[c] == doctest::Approx(0.9 + 0.1 * var[c]).epsilon(1e-12));
  }
  // Training output: the batch statistics (what batch_norm gives without running ones).
  CHECK(bit_equal(y, batch_norm(x, bn.weight(), bn.bias(), Tensor(), Tensor(), true, 0.1, 1e-5)));
  bn.eval();
  const auto rm = values(bn.running_mean()), rv = values(bn.running_var());
  Tensor ye = bn(x);
  CHECK(bn.num_batches_tracked().item() == 1);  // eval does not count
  CHECK(values(bn.running_mean()) == rm);
  CHECK(bit_equal(ye, batch_norm(x, bn.weight(), bn.bias(), bn.running_mean(), bn.running_var(), false, 0.1, 1e-5)));
  // Without tracking, eval still normalises with the batch's statistics.
  BatchNorm2d untracked(3, 1e-5, 0.1, true, false, f64());
  untracked.eval();
  CHECK(bit_equal(untracked(x), y));
}

TEST_CASE("BatchNorm2d: momentum = nullopt is the cumulative average over the batches") {
  BatchNorm2d bn(3, 1e-5, std::nullopt, false, true, f64());
  std::vector<double> sum_mean(3, 0.0), sum_var(3, 0.0);
  for (int i = 1; i <= 3; ++i) {
    Tensor x = batch(static_cast<std::uint64_t>(10 + i));
    std::vector<double> mean, var;
    channel_stats(x, mean, var);
    bn(x);
    for (std::size_t c = 0; c < 3; ++c) {
      sum_mean[c] += mean[c];
      sum_var[c] += var[c];
    }
  }
  // 1, 1/2, 1/3: the plain mean of the three batches (the initial 0 / 1 forgotten at the first).
  for (std::size_t c = 0; c < 3; ++c) {
    CHECK(values(bn.running_mean())[c] == doctest::Approx(sum_mean[c] / 3).epsilon(1e-12));
    CHECK(values(bn.running_var())[c] == doctest::Approx(sum_var[c] / 3).epsilon(1e-12));
  }
  CHECK(bn.num_batches_tracked().item() == 3);
}

TEST_CASE("BatchNorm2d: a checkpoint holds and restores the running statistics") {
  TempDir dir;
  BatchNorm2d bn(3, 1e-5, 0.1, true, true, f64());
  for (int i = 0; i < 2; ++i) bn(batch(static_cast<std::uint64_t>(20 + i)));
  save_checkpoint(dir.file("bn.safetensors"), bn);
  BatchNorm2d fresh(3, 1e-5, 0.1, true, true, f64());
  load_checkpoint(dir.file("bn.safetensors"), fresh);
  CHECK(bit_equal(fresh.running_mean(), bn.running_mean()));
  CHECK(bit_equal(fresh.running_var(), bn.running_var()));
  CHECK(fresh.num_batches_tracked().item() == 2);
  bn.eval();
  fresh.eval();
  Tensor x = batch(30);
  CHECK(bit_equal(fresh(x), bn(x)));
  // Training continues the count from the loaded value.
  fresh.train();
  fresh(x);
  CHECK(fresh.num_batches_tracked().item() == 3);
}

TEST_CASE("BatchNorm2d: errors; a bad input changes nothing") {
  CHECK(error_of([] { BatchNorm2d(0); }).find("num_features") != std::string::npos);
  CHECK(error_of([] { BatchNorm2d(3, 0.0); }).find("eps") != std::string::npos);
  CHECK(error_of([] { BatchNorm2d(3, 1e-5, 1.5); }).find("momentum") != std::string::npos);
  BatchNorm2d bn(3, 1e-5, 0.1, true, true, f64());
  CHECK(error_of([&] { bn(zeros({4, 3}, f64())); }).find("BatchNorm2d") != std::string::npos);
  CHECK(error_of([&] { bn(zeros({4, 5, 2, 2}, f64())); }).find("batch_norm") != std::string::npos);
  CHECK(error_of([&] { bn(zeros({4, 3, 2, 2})); }).find("weight") != std::string::npos);  // f32 x, f64 weight
  CHECK(bn.num_batches_tracked().item() == 0);
  CHECK(values(bn.running_var()) == std::vector<double>{1, 1, 1});
}

TEST_CASE("MaxPool2d, AvgPool2d, AdaptiveAvgPool2d, Flatten call their ops") {
  Generator g(40);
  Tensor x = randn({2, 3, 7, 8}, g, f64());
  CHECK(bit_equal(MaxPool2d(3, Size2{2}, 1, 1, true)(x), max_pool2d(x, 3, Size2{2}, 1, 1, true)));
  CHECK(MaxPool2d(2)(x).shape() == Shape{2, 3, 3, 4});
  CHECK(bit_equal(AvgPool2d(3, Size2{2}, 1, true, false)(x), avg_pool2d(x, 3, Size2{2}, 1, true, false)));
  CHECK(bit_equal(AdaptiveAvgPool2d(1)(x), adaptive_avg_pool2d(x, 1)));
  CHECK(Flatten()(x).shape() == Shape{2, 168});
  CHECK(Flatten(0, 1)(x).shape() == Shape{6, 7, 8});
  CHECK(MaxPool2d(2).type_name() == "MaxPool2d");
  CHECK(error_of([&] { MaxPool2d(3, std::nullopt, 2)(x); }).find("padding") != std::string::npos);
}

TEST_CASE("a small CNN-shaped model (BN, ReLU, pooling, Flatten, Linear) learns a fixed batch") {
  Generator g(50);
  auto model = std::make_shared<Sequential>();
  model->emplace_back<BatchNorm2d>(3);
  model->emplace_back<ReLU>();
  model->emplace_back<MaxPool2d>(2);
  model->emplace_back<AvgPool2d>(2, Size2{1}, 0);
  model->emplace_back<AdaptiveAvgPool2d>(Size2{2, 2});
  model->emplace_back<Flatten>();
  model->emplace_back<Linear>(12, 4, g);
  Tensor x = randn({8, 3, 8, 8}, g);
  Tensor labels = Tensor::from_vector<std::int64_t>({0, 1, 2, 3, 0, 1, 2, 3}, {8});
  SGDOptions so;
  so.lr = 0.5;
  so.momentum = 0.9;
  SGD opt(model->named_parameters(), so);
  double first = 0, last = 0;
  for (int step = 0; step < 30; ++step) {
    opt.zero_grad();
    Tensor loss = cross_entropy((*model)(x), labels);
    loss.backward();
    opt.step();
    (step == 0 ? first : last) = loss.item();
  }
  CHECK(last < first);
  const NamedTensors state = model->state_dict();
  bool has_running = false;
  for (const auto& [name, t] : state) has_running |= name == "0.running_mean";
  CHECK(has_running);
}

TEST_CASE("BatchNorm2d on CUDA: outputs, running statistics and the count as on the CPU, bit for bit") {
  QGRAD_REQUIRE_GPU();
  for (const std::optional<double> momentum : {std::optional<double>(0.1), std::optional<double>()}) {
    BatchNorm2d cpu(3, 1e-5, momentum), gpu(3, 1e-5, momentum);
    gpu.to(Device::cuda(0));
    for (int step = 0; step < 3; ++step) {
      Generator g(static_cast<std::uint64_t>(60 + step));
      Tensor x = randn({4, 3, 9, 7}, g);
      CHECK(bit_equal(cpu(x), gpu(x.to(Device::cuda(0)))));
    }
    CHECK(bit_equal(cpu.running_mean(), gpu.running_mean()));
    CHECK(bit_equal(cpu.running_var(), gpu.running_var()));
    CHECK(gpu.num_batches_tracked().item() == 3);
    cpu.eval();
    gpu.eval();
    Generator g(70);
    Tensor x = randn({2, 3, 5, 5}, g);
    CHECK(bit_equal(cpu(x), gpu(x.to(Device::cuda(0)))));
  }
}
