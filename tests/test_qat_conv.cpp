// QAT of convolutions (nn/qat_conv.h): ConvBn2d / ConvBnReLU2d against
// PyTorch 2.11's torch.ao.nn.intrinsic.qat modules (golden values of
// tests/python/gen_convbn_golden.py: outputs, gradients, running statistics
// and weight scales through training steps, freeze_bn_stats and eval),
// prepare_qat's fusion patterns, freeze_bn_stats / update_bn_stats,
// Unflatten, and bad arguments.
#include <fstream>
#include <nlohmann/json.hpp>

#include "helpers.h"
#include "test_nn_helpers.h"
#include "qgrad/nn/nn.h"

using namespace qgrad;
using namespace qgrad::nn;
using json = nlohmann::json;
using qgrad::testing::bit_equal;
using qgrad::testing::error_of;
using qgrad::testing::values;

namespace {

const char* kGoldenPath = QGRAD_SOURCE_DIR "/tests/data/golden_convbn.json";

std::vector<float> floats(const json& j) { return j.get<std::vector<float>>(); }

Tensor tensor_of(const json& j, const Shape& shape, Device dev) {
  return Tensor::from_vector(floats(j), shape).to(dev);
}

// Worst |a - b| / (1 + |b|) over the elements, and how many exceed tol.
std::pair<double, std::int64_t> compare(const Tensor& got, const std::vector<float>& want, double tol) {
  const auto g = values(got);
  REQUIRE(g.size() == want.size());
  double worst = 0;
  std::int64_t over = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    const double e = std::abs(g[i] - static_cast<double>(want[i])) / (1.0 + std::abs(static_cast<double>(want[i])));
    worst = std::max(worst, e);
    over += e > tol;
  }
  return {worst, over};
}

// Frobenius error of got against want, relative to want's norm (or to 1e-2
// when want is about zero: the conv bias's gradient through training-mode
// batch norm, which subtracts the per-channel mean, is zero up to rounding).
double rel_error(const Tensor& got, const std::vector<float>& want) {
  const auto g = values(got);
  REQUIRE(g.size() == want.size());
  double num = 0, den = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    num += (g[i] - want[i]) * (g[i] - want[i]);
    den += static_cast<double>(want[i]) * want[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-2);
}

struct Built {
  std::shared_ptr<ConvBn2d> m;
  Tensor weight, bias, bn_weight, bn_bias;
};

Built build(const json& c, Device dev) {
  const std::int64_t cin = c["in_channels"], cout = c["out_channels"], stride = c["stride"], pad = c["padding"];
  const bool bias = c["bias"], relu = c["relu"];
  Generator gen(1);
  Conv2dOptions o;
  o.stride = {stride, stride};
  o.padding = {pad, pad};
  o.bias = bias;
  Conv2d conv(cin, cout, {3, 3}, gen, o);
  auto bn = std::make_shared<BatchNorm2d>(cout);
  conv.to(dev);
  bn->to(dev);
  {
    NoGradGuard no_grad;
    conv.weight().copy_(tensor_of(c["weight"], conv.weight().shape(), dev));
    if (bias) conv.bias().copy_(tensor_of(c["conv_bias"], {cout}, dev));
    bn->weight().copy_(tensor_of(c["bn_weight"], {cout}, dev));
    bn->bias().copy_(tensor_of(c["bn_bias"], {cout}, dev));
    bn->running_mean().copy_(tensor_of(c["running_mean"], {cout}, dev));
    bn->running_var().copy_(tensor_of(c["running_var"], {cout}, dev));
  }
  Built b;
  b.m = relu ? std::make_shared<ConvBnReLU2d>(conv, bn, default_qat_qconfig())
             : std::make_shared<ConvBn2d>(conv, bn, default_qat_qconfig());
  b.weight = conv.weight();
  b.bias = conv.bias();
  b.bn_weight = bn->weight();
  b.bn_bias = bn->bias();
  return b;
}

}  // namespace

TEST_CASE("ConvBn2d / ConvBnReLU2d match PyTorch 2.11 (training, frozen bn, eval; golden values)") {
  std::ifstream f(kGoldenPath);
  if (!f) {
    std::printf("SKIPPED: %s missing (run tests/python/gen_convbn_golden.py)\n", kGoldenPath);
    return;
  }
  const json doc = json::parse(f);
  for (const Device dev : testing::test_devices()) {
    for (const char* name : {"convbnrelu", "convbn"}) {
      CAPTURE(dev.str());
      const std::string case_name = name;
      CAPTURE(case_name);
      const json& c = doc[name];
      Built b = build(c, dev);
      const std::int64_t cin = c["in_channels"];
      const Shape xs{4, cin, 7, 7};
      const Shape os = c["out_shape"].get<Shape>();
      std::int64_t numel = 1;
      for (auto d : os) numel *= d;
      for (const char* tag : {"1", "2", "3", "4"}) {
        const std::string step_tag = tag;
        CAPTURE(step_tag);
        const std::string t(tag);
        if (t == "3") {
          b.m->freeze_bn_stats();
          b.m->train();  // stays frozen
        }
        if (t == "4") b.m->eval();
        Tensor x = tensor_of(c["x" + t], xs, dev).set_requires_grad(true);
        for (Tensor p : b.m->parameters()) p.zero_grad();
        Tensor y = b.m->forward(x);
        REQUIRE(y.shape() == os);
        // The output lies on the activation grid: an element may move by one
        // step where PyTorch's conv (oneDNN) and ours round differently
        // near a rounding boundary; allow that for 1% of them.
        const double step = floats(c["act_scale" + t])[0];
        auto [worst, over] = compare(y, floats(c["out" + t]), 1e-5);
        CHECK(worst <= 1.01 * step);
        CHECK(over <= numel / 100);
        CHECK(compare(b.m->weight_fake_quant().scale(), floats(c["weight_scale" + t]), 1e-6).second == 0);
        CHECK(compare(b.m->activation_fake_quant().scale(), floats(c["act_scale" + t]), 1e-6).second == 0);
        CHECK(compare(b.m->bn().running_mean(), floats(c["running_mean" + t]), 1e-6).second == 0);
        CHECK(compare(b.m->bn().running_var(), floats(c["running_var" + t]), 1e-6).second == 0);
        if (c.contains("g" + t)) {
          Tensor g = tensor_of(c["g" + t], os, dev);
          sum(mul(y, g)).backward();
          CHECK(rel_error(x.grad(), floats(c["grad_x" + t])) < 2e-3);
          CHECK(rel_error(b.weight.grad(), floats(c["grad_weight" + t])) < 2e-3);
          if (b.bias.defined()) CHECK(rel_error(b.bias.grad(), floats(c["grad_bias" + t])) < 2e-3);
          CHECK(rel_error(b.bn_weight.grad(), floats(c["grad_bn_weight" + t])) < 2e-3);
          CHECK(rel_error(b.bn_bias.grad(), floats(c["grad_bn_bias" + t])) < 2e-3);
        }
      }
    }
  }
}

namespace {

// Conv-BN-ReLU, pool, Conv-BN, Conv-ReLU, Conv, BN alone, Flatten, Linear.
std::shared_ptr<Sequential> pattern_model(Generator& gen) {
  auto m = std::make_shared<Sequential>();
  Conv2dOptions p1;
  p1.padding = {1, 1};
  m->emplace_back<Unflatten>(1, Shape{1, 6, 6});
  m->emplace_back<Conv2d>(1, 4, std::array<std::int64_t, 2>{3, 3}, gen, p1);  // 1
  m->emplace_back<BatchNorm2d>(4);                                          // 2
  m->emplace_back<ReLU>();                                                  // 3
  m->emplace_back<MaxPool2d>(2);                                            // 4
  m->emplace_back<Conv2d>(4, 4, std::array<std::int64_t, 2>{3, 3}, gen, p1);  // 5
  m->emplace_back<BatchNorm2d>(4);                                          // 6
  m->emplace_back<Conv2d>(4, 4, std::array<std::int64_t, 2>{1, 1}, gen);    // 7
  m->emplace_back<ReLU>();                                                  // 8
  m->emplace_back<Conv2d>(4, 3, std::array<std::int64_t, 2>{1, 1}, gen);    // 9
  m->emplace_back<BatchNorm2d>(3);                                          // 10 (after ReLU? no: after conv 9)
  m->emplace_back<ReLU>();                                                  // 11
  m->emplace_back<BatchNorm2d>(3);                                          // 12: alone, not fused
  m->emplace_back<Flatten>();                                               // 13
  m->emplace_back<Linear>(27, 5, gen);                                      // 14
  return m;
}

std::vector<std::string> types(const Sequential& m) {
  std::vector<std::string> t;
  for (std::size_t i = 0; i < m.size(); ++i) t.push_back(m[i]->type_name());
  return t;
}

}  // namespace

TEST_CASE("prepare_qat fuses Conv2d -> BatchNorm2d (-> ReLU) and Conv2d (-> ReLU); names stay") {
  Generator gen(3);
  auto m = pattern_model(gen);
  Tensor bn_w = std::dynamic_pointer_cast<BatchNorm2d>((*m)[2])->weight();
  prepare_qat(*m);
  const std::vector<std::string> want = {"FakeQuantize", "Unflatten",  "ConvBnReLU2d", "Identity",   "Identity",
                                         "MaxPool2d",    "ConvBn2d",   "Identity",     "ConvReLU2d", "Identity",
                                         "ConvBnReLU2d", "Identity",   "Identity",     "BatchNorm2d", "Flatten",
                                         "QATLinear"};
  CHECK(types(*m) == want);
  CHECK(m->name_at(0) == "quant");
  CHECK(m->name_at(2) == "1");  // the fused module keeps the conv's name
  // The fused module shares the BatchNorm2d's tensors, under "<conv>.bn.".
  bool found = false;
  for (const auto& [n, t] : m->named_parameters())
    if (n == "1.bn.weight") found = t.data_ptr() == bn_w.data_ptr();
  CHECK(found);
  bool has_rv = false;
  for (const auto& [n, t] : m->named_buffers()) has_rv |= n == "1.bn.running_var" || n == "1.weight_fake_quant.scale";
  CHECK(has_rv);
  // It trains: one step runs forward and backward through every module.
  Generator g(5);
  Tensor x = randn({8, 36}, g);
  Tensor loss = cross_entropy((*m)(x), Tensor::from_vector<std::int64_t>({0, 1, 2, 3, 4, 0, 1, 2}, {8}));
  loss.backward();
  for (const auto& row : m->named_parameters()) {
    const auto& n = std::get<0>(row);
    const auto& p = std::get<1>(row);
    CAPTURE(n);
    CHECK(p.grad().defined());
  }
  // Twice is an error.
  CHECK(error_of([&] { prepare_qat(*m); }).find("already prepared") != std::string::npos);
}

TEST_CASE("Sequential fuses a fused conv's activation fake quant with the MaxPool2d after it: the same bits") {
  // Two copies of a CNN (Conv-BN-ReLU-MaxPool, Conv-BN-MaxPool, a pooling
  // with padding and ceil_mode) prepared for QAT: one run by Sequential
  // (the Conv-BN-ReLU block and the MaxPool2d after its Identity
  // placeholders as batch_norm_relu_fake_quantize_max_pool2d, the Conv-BN
  // block's fake quant and pooling as fake_quantize_max_pool2d), one child
  // by child. Three training passes: outputs, every gradient and every
  // buffer (observer ranges, qparams, running statistics, counters) bit for
  // bit; then in eval mode with the observers on, and off.
  for (const Device dev : qgrad::testing::test_devices()) {
    CAPTURE(dev.str());
    const auto make = [&] {
      Generator gen(21);
      Conv2dOptions p1;
      p1.padding = {1, 1};
      auto m = std::make_shared<Sequential>();
      m->emplace_back<Unflatten>(1, Shape{1, 10, 10});
      m->emplace_back<Conv2d>(1, 4, std::array<std::int64_t, 2>{3, 3}, gen, p1);
      m->emplace_back<BatchNorm2d>(4);
      m->emplace_back<ReLU>();
      m->emplace_back<MaxPool2d>(2);
      m->emplace_back<Conv2d>(4, 6, std::array<std::int64_t, 2>{3, 3}, gen, p1);
      m->emplace_back<BatchNorm2d>(6);
      m->emplace_back<MaxPool2d>(Size2{3}, Size2{2}, Size2{1}, Size2{1}, true);
      m->emplace_back<Flatten>();
      m->emplace_back<Linear>(6 * 3 * 3, 5, gen);
      m->to(dev);
      prepare_qat(*m);
      return m;
    };
    auto fused = make(), plain = make();
    const auto child_by_child = [](Sequential& m, const Tensor& x) {
      Tensor h = x;
      for (std::size_t i = 0; i < m.size(); ++i) h = m[i]->forward(h);
      return h;
    };
    const auto same_state = [](Sequential& a, Sequential& b) {
      const NamedTensors ta = a.state_dict(), tb = b.state_dict();
      REQUIRE(ta.size() == tb.size());
      for (std::size_t i = 0; i < ta.size(); ++i) {
        CAPTURE(ta[i].first);
        CHECK(qgrad::testing::bit_equal(ta[i].second, tb[i].second));
      }
    };
    Generator data(22);
    const TensorOptions o = TensorOptions{}.with_device(dev);
    for (int step = 0; step < 3; ++step) {
      CAPTURE(step);
      const Tensor x = mul(randn({16, 100}, data, o), 1.5);
      const Tensor dy = randn({16, 5}, data, o);
      fused->zero_grad();
      plain->zero_grad();
      const Tensor yf = (*fused)(x), yp = child_by_child(*plain, x);
      CHECK(qgrad::testing::bit_equal(yf, yp));
      // The fused paths ran (the Conv-BN-ReLU block's normalisation, fake
      // quant and pooling as one op; the Conv-BN block's fake quant and
      // pooling), the plain one did not.
      const std::string gf = to_dot(yf), gp = to_dot(yp);
      CHECK(gf.find("\"batch_norm_relu_fake_quantize_max_pool2d") != std::string::npos);
      CHECK(gf.find("\"fake_quantize_max_pool2d") != std::string::npos);
      CHECK(gf.find("\"max_pool2d") == std::string::npos);
      CHECK(gp.find("fake_quantize_max_pool2d") == std::string::npos);
      yf.backward(dy);
      yp.backward(dy);
      const NamedTensors pf = fused->named_parameters(), pp = plain->named_parameters();
      for (std::size_t i = 0; i < pf.size(); ++i) {
        CAPTURE(pf[i].first);
        CHECK(qgrad::testing::bit_equal(pf[i].second.grad(), pp[i].second.grad()));
      }
      same_state(*fused, *plain);
    }
    fused->eval();
    plain->eval();
    NoGradGuard no_grad;
    {  // Evaluation with the observers on (the fused op's range pass over x).
      const Tensor x = randn({8, 100}, data, o);
      CHECK(qgrad::testing::bit_equal((*fused)(x), child_by_child(*plain, x)));
      same_state(*fused, *plain);
    }
    enable_observer(*fused, false);
    enable_observer(*plain, false);
    const Tensor x = randn({8, 100}, data, o);
    CHECK(qgrad::testing::bit_equal((*fused)(x), child_by_child(*plain, x)));
  }
}

// stage_weight_fake_quants: the weights of the QATConv2d (conv 7 + relu), the
// QATLinear and the folded weights of the three ConvBn2d modules (one followed
// by a pooling, one without relu) observed and fake-quantized in one batch
// before the forward; three SGD steps, each model's own.
TEST_CASE("stage_weight_fake_quants: the staged QAT step equals the unstaged one bit for bit (every device)") {
  for (const Device dev : testing::test_devices()) {
    CAPTURE(dev.str());
    Generator gen_a(41), gen_b(41), gen(42);  // two identical models
    auto staged = pattern_model(gen_a), plain = pattern_model(gen_b);
    std::vector<std::unique_ptr<SGD>> opts;
    for (auto* m : {staged.get(), plain.get()}) {
      prepare_qat(*m);
      m->to(dev);
      m->train();
      SGDOptions o;
      o.lr = 0.05;
      o.momentum = 0.9;
      opts.push_back(std::make_unique<SGD>(m->named_parameters(), o));
    }
    for (int step = 0; step < 3; ++step) {
      CAPTURE(step);
      const Tensor x = mul(randn({8, 36}, gen), 1.0 + step).to(dev);
      const Tensor g = randn({8, 5}, gen).to(dev);
      stage_weight_fake_quants(*staged);
      const Tensor ya = staged->forward(x), yb = plain->forward(x);
      CHECK(bit_equal(ya, yb));
      for (auto* m : {staged.get(), plain.get()}) m->zero_grad();
      sum(mul(ya, g)).backward();
      sum(mul(yb, g)).backward();
      const auto pa = staged->named_parameters(), pb = plain->named_parameters();
      REQUIRE(pa.size() == pb.size());
      for (std::size_t i = 0; i < pa.size(); ++i) {
        CAPTURE(pa[i].first);
        CHECK(bit_equal(pa[i].second.grad(), pb[i].second.grad()));
      }
      const auto ba = staged->named_buffers(), bb = plain->named_buffers();
      REQUIRE(ba.size() == bb.size());
      for (std::size_t i = 0; i < ba.size(); ++i) {
        CAPTURE(ba[i].first);
        CHECK(bit_equal(ba[i].second, bb[i].second));
      }
      for (auto& o : opts) o->step();
    }
    // Observer off: nothing staged, the forward runs its own fake quantize.
    enable_observer(*staged, false);
    enable_observer(*plain, false);
    stage_weight_fake_quants(*staged);
    const Tensor x = randn({8, 36}, gen).to(dev);
    CHECK(bit_equal(staged->forward(x), plain->forward(x)));
    // A staged output goes only to the tensor it was staged for.
    enable_observer(*staged, true);
    stage_weight_fake_quants(*staged);
    auto& lin = dynamic_cast<QATLinear&>(*(*staged)[staged->size() - 1]);
    testing::check_error([&] { lin.weight_fake_quant().forward(lin.weight().detach()); }, "FakeQuantize::forward", "x");
    auto& folded = dynamic_cast<ConvBn2d&>(*(*staged)[2]);  // its folded weight was staged too
    testing::check_error([&] { folded.weight_fake_quant().forward(folded.weight().detach()); },
                         "FakeQuantize::forward", "x");
  }
}

TEST_CASE("prepare_qat leaves a model untouched when a fusion pattern is bad") {
  Generator gen(4);
  auto m = std::make_shared<Sequential>();
  m->emplace_back<Conv2d>(1, 4, std::array<std::int64_t, 2>{3, 3}, gen);
  m->emplace_back<BatchNorm2d>(4);
  m->emplace_back<Conv2d>(4, 4, std::array<std::int64_t, 2>{3, 3}, gen);
  m->emplace_back<BatchNorm2d>(5);  // does not match its conv
  const auto before = types(*m);
  const std::string e = error_of([&] { prepare_qat(*m); });
  CHECK(e.find("prepare_qat") != std::string::npos);
  CHECK(e.find("'3'") != std::string::npos);
  CHECK(types(*m) == before);
  // A BatchNorm2d without affine parameters cannot be folded.
  auto m2 = std::make_shared<Sequential>();
  m2->emplace_back<Conv2d>(1, 4, std::array<std::int64_t, 2>{3, 3}, gen);
  m2->emplace_back<BatchNorm2d>(4, 1e-5, 0.1, /*affine=*/false);
  CHECK(error_of([&] { prepare_qat(*m2); }).find("affine") != std::string::npos);
  CHECK(types(*m2) == std::vector<std::string>{"Conv2d", "BatchNorm2d"});
  // Nothing to prepare.
  Sequential empty_ish;
  empty_ish.emplace_back<ReLU>();
  CHECK(error_of([&] { prepare_qat(empty_ish); }).find("no Linear or Conv2d") != std::string::npos);
}

TEST_CASE("freeze_bn_stats: running statistics stop, normalise in training, survive train(); update_bn_stats") {
  Generator gen(6);
  auto m = std::make_shared<Sequential>();
  m->emplace_back<Conv2d>(2, 3, std::array<std::int64_t, 2>{3, 3}, gen);
  m->emplace_back<BatchNorm2d>(3);
  m->emplace_back<ReLU>();
  prepare_qat(*m);
  auto* cb = dynamic_cast<ConvBn2d*>((*m)[1].get());
  REQUIRE(cb != nullptr);
  Generator g(7);
  Tensor x1 = randn({4, 2, 6, 6}, g, {}, 0.5, 2.0), x2 = randn({4, 2, 6, 6}, g, {}, -0.3, 1.0);
  m->train();
  (*m)(x1);
  const auto mean1 = values(cb->bn().running_mean()), var1 = values(cb->bn().running_var());
  CHECK(mean1 != std::vector<double>(3, 0.0));
  CHECK(cb->bn().num_batches_tracked().item() == 1.0);
  freeze_bn_stats(*m);
  CHECK(cb->bn_frozen());
  m->train();  // does not unfreeze
  Tensor y_frozen = (*m)(x2);
  CHECK(values(cb->bn().running_mean()) == mean1);
  CHECK(values(cb->bn().running_var()) == var1);
  CHECK(cb->bn().num_batches_tracked().item() == 1.0);
  // Frozen in training normalises like eval (observers off so the fake
  // quant ranges do not move between the two calls).
  enable_observer(*m, false);
  Tensor y_train = (*m)(x2);
  m->eval();
  Tensor y_eval = (*m)(x2);
  CHECK(testing::bit_equal(y_train, y_eval));
  enable_observer(*m, true);
  update_bn_stats(*m);
  m->train();
  CHECK(!cb->bn_frozen());
  (*m)(x2);
  CHECK(values(cb->bn().running_mean()) != mean1);
  CHECK(cb->bn().num_batches_tracked().item() == 2.0);
}

TEST_CASE("ConvBn2d::folded_weight_bias: w * gamma / sqrt(var + eps), beta + (b - mean) * gamma / sqrt(var + eps)") {
  Generator gen(8);
  Conv2d conv(2, 3, {3, 3}, gen);
  auto bn = std::make_shared<BatchNorm2d>(3, 1e-3);
  {
    NoGradGuard no_grad;
    bn->weight().copy_(Tensor::from_vector<float>({0.5f, 1.5f, -2.0f}, {3}));
    bn->bias().copy_(Tensor::from_vector<float>({0.1f, -0.2f, 0.3f}, {3}));
    bn->running_mean().copy_(Tensor::from_vector<float>({0.25f, -1.0f, 2.0f}, {3}));
    bn->running_var().copy_(Tensor::from_vector<float>({4.0f, 0.5f, 1.0f}, {3}));
  }
  ConvBn2d cb(conv, bn, default_qat_qconfig());
  auto [w, b] = cb.folded_weight_bias();
  const auto wv = values(conv.weight()), bv = values(conv.bias()), fw = values(w), fb = values(b);
  const double gamma[] = {0.5, 1.5, -2.0}, beta[] = {0.1, -0.2, 0.3}, mean[] = {0.25, -1.0, 2.0}, var[] = {4.0, 0.5, 1.0};
  for (int c = 0; c < 3; ++c) {
    const double f = gamma[c] / std::sqrt(var[c] + 1e-3);
    for (int k = 0; k < 18; ++k) CHECK(fw[static_cast<std::size_t>(c * 18 + k)] == doctest::Approx(wv[static_cast<std::size_t>(c * 18 + k)] * f).epsilon(1e-6));
    CHECK(fb[static_cast<std::size_t>(c)] == doctest::Approx(beta[c] + (bv[static_cast<std::size_t>(c)] - mean[c]) * f).epsilon(1e-6));
  }
  CHECK(!w.requires_grad());
}

TEST_CASE("QAT conv modules and Unflatten: bad arguments throw qgrad::Error naming the module and argument") {
  Generator gen(9);
  Conv2d conv(2, 3, {3, 3}, gen);
  QConfig per_channel_act = default_qat_qconfig();
  per_channel_act.activation.qscheme = QScheme::per_channel_affine;
  CHECK(error_of([&] { QATConv2d(conv, per_channel_act); }).find("QATConv2d: argument 'qconfig'") != std::string::npos);
  QConfig axis1 = default_qat_qconfig();
  axis1.weight.ch_axis = 1;
  CHECK(error_of([&] { QATConv2d(conv, axis1); }).find("axis 0") != std::string::npos);
  CHECK(error_of([&] { ConvBn2d(conv, std::make_shared<BatchNorm2d>(4), default_qat_qconfig()); })
            .find("ConvBn2d: argument 'bn'") != std::string::npos);
  CHECK(error_of([&] { ConvBnReLU2d(conv, nullptr, default_qat_qconfig()); }).find("ConvBnReLU2d: argument 'bn'") !=
        std::string::npos);
  CHECK(error_of([&] {
          ConvBn2d(conv, std::make_shared<BatchNorm2d>(3, 1e-5, 0.1, true, /*track_running_stats=*/false),
                   default_qat_qconfig());
        }).find("running") != std::string::npos);
  ConvBn2d cb(conv, std::make_shared<BatchNorm2d>(3), default_qat_qconfig());
  const auto rm = values(cb.bn().running_mean());
  CHECK(error_of([&] { cb.forward(zeros({2, 6, 6})); }).find("conv2d") != std::string::npos);
  CHECK(error_of([&] { cb.forward(zeros({1, 5, 6, 6})); }).find("conv2d") != std::string::npos);
  CHECK(values(cb.bn().running_mean()) == rm);  // nothing written
  CHECK(error_of([] { Unflatten(1, Shape{}); }).find("Unflatten: argument 'sizes'") != std::string::npos);
  CHECK(error_of([] { Unflatten(1, Shape{2, 0}); }).find("sizes") != std::string::npos);
  Unflatten u(1, {2, 3});
  CHECK(error_of([&] { u.forward(zeros({4, 5})); }).find("Unflatten: argument 'sizes'") != std::string::npos);
  CHECK(error_of([&] { u.forward(zeros({4})); }).find("Unflatten: argument 'dim'") != std::string::npos);
  CHECK(u.forward(zeros({4, 6})).shape() == Shape{4, 2, 3});
  CHECK(Unflatten(-1, {2, 2}).forward(zeros({3, 4})).shape() == Shape{3, 2, 2});
}

TEST_CASE("convert: a small random CNN's int8 model agrees with its fake-quant model (every device)") {
  for (const Device dev : testing::test_devices()) {
    CAPTURE(dev.str());
    Generator gen(11);
    Conv2dOptions p1;
    p1.padding = {1, 1};
    Sequential m;
    m.emplace_back<Unflatten>(1, Shape{1, 8, 8});
    m.emplace_back<Conv2d>(1, 4, std::array<std::int64_t, 2>{3, 3}, gen, p1);
    m.emplace_back<BatchNorm2d>(4);
    m.emplace_back<ReLU>();
    m.emplace_back<MaxPool2d>(2);
    m.emplace_back<Conv2d>(4, 6, std::array<std::int64_t, 2>{3, 3}, gen, p1);
    m.emplace_back<BatchNorm2d>(6);
    m.emplace_back<Conv2d>(6, 6, std::array<std::int64_t, 2>{1, 1}, gen);
    m.emplace_back<ReLU>();
    m.emplace_back<Flatten>();
    m.emplace_back<Linear>(6 * 4 * 4, 5, gen);
    m.to(dev);
    prepare_qat(m);
    // A few training-mode passes move the observers and running statistics.
    Generator data(12);
    m.train();
    for (int i = 0; i < 4; ++i) m(randn({32, 64}, data, TensorOptions{}.with_device(dev)));
    freeze_bn_stats(m);
    enable_observer(m, false);
    m.eval();
    auto int8 = convert(m);
    std::vector<std::string> want = {"Unflatten", "QuantizedConvReLU2d", "Identity", "Identity", "MaxPool2d",
                                     "QuantizedConv2d", "Identity", "QuantizedConvReLU2d", "Identity", "Flatten",
                                     "QuantizedLinear"};
    CHECK(types(*int8) == want);
    NoGradGuard no_grad;
    const Tensor x = randn({256, 64}, data, TensorOptions{}.with_device(dev));
    const auto yq = values(m(x)), yi = values((*int8)(x));
    const auto* last = dynamic_cast<const QATLinear*>(m[m.size() - 1].get());
    const double step = last->activation_fake_quant().scale().cpu().item();
    REQUIRE(yq.size() == yi.size());
    std::size_t same = 0;
    double worst = 0;
    for (std::size_t i = 0; i < yq.size(); ++i) {
      same += yq[i] == yi[i];
      worst = std::max(worst, std::abs(yq[i] - yi[i]));
    }
    // Only int32-exact versus float sums differ: a value moves by one grid
    // step only when it lies within float rounding of a rounding boundary.
    CHECK(static_cast<double>(same) >= 0.97 * static_cast<double>(yq.size()));
    CHECK(worst <= 2.01 * step);
    const auto pq = values(argmax(m(x), 1)), pi = values(argmax((*int8)(x), 1));
    std::size_t agree = 0;
    for (std::size_t i = 0; i < pq.size(); ++i) agree += pq[i] == pi[i];
    CHECK(static_cast<double>(agree) >= 0.97 * static_cast<double>(pq.size()));
  }
}

TEST_CASE("convert: average pooling leaves the int8 grid and is refused, naming the module") {
  Generator gen(13);
  Sequential m;
  m.emplace_back<Conv2d>(1, 2, std::array<std::int64_t, 2>{3, 3}, gen);
  m.emplace_back<AvgPool2d>(2);
  m.emplace_back<Flatten>();
  m.emplace_back<Linear>(2 * 3 * 3, 3, gen);
  prepare_qat(m);
  m(randn({4, 1, 8, 8}, gen));
  const std::string e = error_of([&] { convert(m); });
  CHECK(e.find("convert: argument '1'") != std::string::npos);
  CHECK(e.find("AvgPool2d") != std::string::npos);
}
