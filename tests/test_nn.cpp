// Modules, Linear init, Sequential, state dicts, QAT prepare/convert,
// training with the optimizers, all with the real ops; the host
// references below (linear, relu, fake quant, quantize, quantized_linear)
// check what the modules compute.
#include <cmath>

#include "helpers.h"
#include "qgrad/nn/nn.h"
#include "qgrad/ops/activation.h"
#include "qgrad/ops/linalg.h"
#include "qgrad/ops/loss.h"
#include "qgrad/ops/quantize.h"
#include "qgrad/ops/quantized_linear.h"
#include "qgrad/ops/reduce.h"

using namespace qgrad;
using namespace qgrad::nn;
using qgrad::testing::bit_equal;

namespace {

Tensor linear_ref(const Tensor& x, const Tensor& w, const Tensor& b) {
  auto xv = x.detach().to_vector<float>(), wv = w.detach().to_vector<float>();
  const std::int64_t m = x.size(0), k = x.size(1), n = w.size(0);
  std::vector<float> bv = b.defined() ? b.detach().to_vector<float>() : std::vector<float>(n, 0.0f);
  std::vector<float> y(m * n);
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      float acc = 0;
      for (std::int64_t t = 0; t < k; ++t) acc += xv[i * k + t] * wv[j * k + t];
      y[i * n + j] = acc + bv[j];
    }
  return Tensor::from_vector(y, {m, n});
}

Tensor relu_ref(const Tensor& x) {
  auto v = x.detach().to_vector<float>();
  for (float& f : v) f = f > 0 ? f : 0.0f;
  return Tensor::from_vector(v, x.shape());
}

float fq1(float x, float s, int z, std::int64_t qmin, std::int64_t qmax) {
  float q = std::nearbyint(x * (1.0f / s)) + static_cast<float>(z);
  q = std::clamp(q, static_cast<float>(qmin), static_cast<float>(qmax));
  return (q - static_cast<float>(z)) * s;
}

Tensor fq_tensor_ref(const Tensor& x, const Tensor& s, const Tensor& z, std::int64_t qmin, std::int64_t qmax) {
  auto v = x.detach().to_vector<float>();
  const float sv = s.to_vector<float>()[0];
  const int zv = z.to_vector<std::int32_t>()[0];
  for (float& f : v) f = fq1(f, sv, zv, qmin, qmax);
  return Tensor::from_vector(v, x.shape());
}

// Axis 0 only (weights [N, K]).
Tensor fq_channel_ref(const Tensor& x, const Tensor& s, const Tensor& z, std::int64_t axis, std::int64_t qmin,
                      std::int64_t qmax) {
  REQUIRE(axis == 0);
  auto v = x.detach().to_vector<float>();
  auto sv = s.to_vector<float>();
  auto zv = z.to_vector<std::int32_t>();
  const std::int64_t inner = x.numel() / x.size(0);
  for (std::int64_t i = 0; i < x.numel(); ++i) v[i] = fq1(v[i], sv[i / inner], zv[i / inner], qmin, qmax);
  return Tensor::from_vector(v, x.shape());
}

Tensor quantize_channel_ref(const Tensor& x, const Tensor& s, const Tensor& z, std::int64_t axis, DType dt) {
  REQUIRE(axis == 0);
  REQUIRE(dt == DType::s8);
  auto v = x.detach().to_vector<float>();
  auto sv = s.to_vector<float>();
  auto zv = z.to_vector<std::int32_t>();
  const std::int64_t inner = x.numel() / x.size(0);
  std::vector<std::int8_t> q(v.size());
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    const float r = std::nearbyint(v[i] * (1.0f / sv[i / inner])) + static_cast<float>(zv[i / inner]);
    q[i] = static_cast<std::int8_t>(std::clamp(r, -128.0f, 127.0f));
  }
  return Tensor::from_vector(q, x.shape());
}

// int32 accumulation of (xq - zp) * wq, then acc * (xs * ws) + bias.
Tensor qlinear_ref(const Tensor& x, const Tensor& wq, const Tensor& ws, const Tensor& b, const Tensor& xs,
                   const Tensor& xz, std::int64_t qmin, std::int64_t qmax) {
  auto xv = x.detach().to_vector<float>();
  auto wv = wq.to_vector<std::int8_t>();
  auto wsv = ws.to_vector<float>();
  const float s = xs.to_vector<float>()[0];
  const int z = xz.to_vector<std::int32_t>()[0];
  const std::int64_t m = x.size(0), k = x.size(1), n = wq.size(0);
  std::vector<float> bv = b.defined() ? b.to_vector<float>() : std::vector<float>(n, 0.0f);
  std::vector<float> y(m * n);
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      std::int32_t acc = 0;
      for (std::int64_t t = 0; t < k; ++t) {
        float q = std::nearbyint(xv[i * k + t] * (1.0f / s)) + static_cast<float>(z);
        q = std::clamp(q, static_cast<float>(qmin), static_cast<float>(qmax));
        acc += (static_cast<std::int32_t>(q) - z) * wv[j * k + t];
      }
      y[i * n + j] = static_cast<float>(acc) * (s * wsv[j]) + bv[j];
    }
  return Tensor::from_vector(y, {m, n});
}

std::shared_ptr<Sequential> mlp(Generator& gen) {
  auto m = std::make_shared<Sequential>();
  m->emplace_back<Linear>(12, 16, gen);
  m->emplace_back<ReLU>();
  m->emplace_back<Linear>(16, 8, gen);
  m->emplace_back<ReLU>();
  m->emplace_back<Linear>(8, 4, gen);
  return m;
}

std::vector<std::int64_t> argmax_rows(const Tensor& y) {
  auto v = y.detach().to_vector<float>();
  const std::int64_t n = y.size(1);
  std::vector<std::int64_t> out;
  for (std::int64_t i = 0; i < y.size(0); ++i) {
    std::int64_t best = 0;
    for (std::int64_t j = 1; j < n; ++j)
      if (v[i * n + j] > v[i * n + best]) best = j;
    out.push_back(best);
  }
  return out;
}

}  // namespace

TEST_CASE("Linear: PyTorch kaiming-uniform bounds, deterministic per seed, names") {
  Generator g1(3), g2(3);
  Linear a(50, 20, g1), b(50, 20, g2);
  CHECK(bit_equal(a.weight(), b.weight()));
  CHECK(bit_equal(a.bias(), b.bias()));
  const double bound = 1.0 / std::sqrt(50.0);
  for (double v : qgrad::testing::values(a.weight())) CHECK(std::fabs(v) <= bound);
  for (double v : qgrad::testing::values(a.bias())) CHECK(std::fabs(v) <= bound);
  CHECK(a.weight().shape() == Shape{20, 50});
  CHECK(a.weight().requires_grad());
  auto np = a.named_parameters();
  REQUIRE(np.size() == 2);
  CHECK(np[0].first == "weight");
  CHECK(np[1].first == "bias");
  Linear nb(4, 3, g1, false);
  CHECK(nb.named_parameters().size() == 1);
  CHECK_THROWS_AS(Linear(0, 3, g1), qgrad::Error);
  CHECK_THROWS_AS(Linear(3, 3, g1, true, TensorOptions{}.with_dtype(DType::s32)), qgrad::Error);
}

TEST_CASE("Sequential: recursive dotted names, train/eval, zero_grad") {
  Generator gen(1);
  auto m = mlp(gen);
  auto np = m->named_parameters();
  REQUIRE(np.size() == 6);
  CHECK(np[0].first == "0.weight");
  CHECK(np[1].first == "0.bias");
  CHECK(np[4].first == "4.weight");
  auto outer = std::make_shared<Sequential>();
  outer->push_back("body", m);
  CHECK(outer->named_parameters()[2].first == "body.2.weight");
  CHECK(outer->is_training());
  outer->eval();
  CHECK_FALSE((*m)[0]->is_training());
  outer->train();
  CHECK((*m)[4]->is_training());
  np[0].second.set_grad(ones(np[0].second.shape()));
  outer->zero_grad();
  CHECK_FALSE(np[0].second.grad().defined());
  CHECK_THROWS_AS(m->push_back("0", std::make_shared<ReLU>()), qgrad::Error);
  CHECK_THROWS_AS(m->push_back("a.b", std::make_shared<ReLU>()), qgrad::Error);
}

TEST_CASE("Sequential forward chains children (host reference)") {
  Generator gen(2);
  auto m = mlp(gen);
  Tensor x = randn({5, 12}, gen);
  Tensor y = m->forward(x);
  CHECK(y.shape() == Shape{5, 4});
  Tensor h = x;
  for (std::size_t i = 0; i < m->size(); ++i) h = (*m)[i]->forward(h);
  CHECK(bit_equal(y, h));
  Tensor r = x;
  for (std::size_t i = 0; i < m->size(); ++i) {
    if (auto* l = dynamic_cast<Linear*>((*m)[i].get()))
      r = linear_ref(r, l->weight(), l->bias());
    else
      r = relu_ref(r);
  }
  CHECK(qgrad::testing::max_abs_diff(y, r) <= 1e-5);
}

TEST_CASE("Module::load_state_dict checks names, shapes, dtypes before writing") {
  Generator gen(4);
  auto a = mlp(gen);
  auto b = mlp(gen);
  b->load_state_dict(a->state_dict());
  for (std::size_t i = 0; i < a->state_dict().size(); ++i)
    CHECK(bit_equal(a->state_dict()[i].second, b->state_dict()[i].second));
  auto sd = a->state_dict();
  auto before = b->state_dict()[0].second.clone();
  NamedTensors missing(sd.begin() + 1, sd.end());
  CHECK_THROWS_AS(b->load_state_dict(missing), qgrad::Error);
  b->load_state_dict(missing, false);  // non-strict: the rest loads
  NamedTensors extra = sd;
  extra.emplace_back("9.weight", zeros({1}));
  CHECK_THROWS_AS(b->load_state_dict(extra), qgrad::Error);
  NamedTensors wrong_shape = sd;
  wrong_shape[0].second = zeros({16, 13});
  CHECK_THROWS_AS(b->load_state_dict(wrong_shape), qgrad::Error);
  NamedTensors wrong_dtype = sd;
  wrong_dtype[0].second = sd[0].second.to(DType::f64);
  CHECK_THROWS_AS(b->load_state_dict(wrong_dtype), qgrad::Error);
  (void)before;
}

TEST_CASE("Module::to moves in place: handles held elsewhere follow") {
  Generator gen(5);
  Linear l(3, 2, gen);
  Tensor held = l.weight();
  l.to(Device::cpu());
  CHECK(held.impl() == l.weight().impl());
  if (!qgrad::testing::has_gpu()) return;
  l.to(Device::cuda(0));
  CHECK(held.is_cuda());
  CHECK(held.requires_grad());
  l.to(Device::cpu());
  CHECK_FALSE(held.is_cuda());
}

TEST_CASE("prepare_qat: input stub, QATLinear with shared weights, PyTorch x86 qconfig") {
  Generator gen(6);
  auto m = mlp(gen);
  Tensor w0 = std::dynamic_pointer_cast<Linear>((*m)[0])->weight();
  prepare_qat(*m);
  REQUIRE(m->size() == 6);
  CHECK(m->name_at(0) == "quant");
  CHECK((*m)[1]->type_name() == "QATLinear");
  auto* q = dynamic_cast<QATLinear*>((*m)[1].get());
  REQUIRE(q);
  CHECK(q->weight().impl() == w0.impl());
  CHECK(q->weight_fake_quant().qmin() == -128);
  CHECK(q->weight_fake_quant().qmax() == 127);
  CHECK(q->weight_fake_quant().scale().shape() == Shape{16});
  CHECK(q->activation_fake_quant().qmin() == 0);
  CHECK(q->activation_fake_quant().qmax() == 127);
  auto np = m->named_parameters();
  REQUIRE(np.size() == 6);
  CHECK(np[0].first == "0.weight");  // names survive the swap
  bool found = false;
  for (auto& [n, t] : m->named_buffers()) found = found || n == "0.weight_fake_quant.scale";
  CHECK(found);
  CHECK_THROWS_AS(prepare_qat(*m), qgrad::Error);
  Sequential empty;
  CHECK_THROWS_AS(prepare_qat(empty), qgrad::Error);
}

TEST_CASE("prepare_qat: QATLinear + ReLU runs fused and equals the two modules run one after the other") {
  for (const Device dev : {Device::cpu(), Device::cuda(0)}) {
    if (dev.is_cuda() && !cuda_available()) continue;
    CAPTURE(dev.is_cuda());
    Generator gen_a(31), gen_b(31), gen(32);  // two identical models
    auto fused = mlp(gen_a), apart = mlp(gen_b);
    for (auto* m : {fused.get(), apart.get()}) {
      prepare_qat(*m);
      m->to(dev);
    }
    for (int step = 0; step < 3; ++step) {
      // Inputs growing past the moving-average ranges: both clamp bounds hit.
      Tensor x = mul(randn({32, 12}, gen), 1.0 + step).to(dev);
      Tensor g = randn({32, 4}, gen).to(dev);
      Tensor y_fused = fused->forward(x);
      Tensor h = x;
      for (std::size_t i = 0; i < apart->size(); ++i) h = (*apart)[i]->forward(h);  // forward_with_next unused
      CHECK(bit_equal(y_fused, h));
      sum(mul(y_fused, g)).backward();
      sum(mul(h, g)).backward();
      const auto pa = fused->named_parameters(), pb = apart->named_parameters();
      REQUIRE(pa.size() == pb.size());
      for (std::size_t i = 0; i < pa.size(); ++i) {
        CAPTURE(pa[i].first);
        // Equal values; the sign of an all-zero sum may differ (ops/quantize.h).
        CHECK(qgrad::testing::max_abs_diff(pa[i].second.grad(), pb[i].second.grad()) == 0.0);
      }
      fused->zero_grad();
      apart->zero_grad();
      const auto ba = fused->named_buffers(), bb = apart->named_buffers();
      REQUIRE(ba.size() == bb.size());
      for (std::size_t i = 0; i < ba.size(); ++i) {
        CAPTURE(ba[i].first);
        CHECK(bit_equal(ba[i].second, bb[i].second));
      }
    }
  }
}

TEST_CASE("convert: int8 model agrees with the fake-quant model (host references)") {
  Generator gen(8);
  auto m = mlp(gen);
  prepare_qat(*m);
  // Calibrate the observers, then freeze them (the state convert captures).
  for (int i = 0; i < 5; ++i) m->forward(randn({32, 12}, gen));
  enable_observer(*m, false);
  auto qm = convert(*m);
  REQUIRE(qm->size() == 5);
  CHECK((*qm)[0]->type_name() == "QuantizedLinear");
  CHECK((*qm)[1]->type_name() == "ReLU");
  // Weights: w_q * w_scale equals the weight fake quant exactly.
  auto* q0 = dynamic_cast<QATLinear*>((*m)[1].get());
  auto* i0 = dynamic_cast<QuantizedLinear*>((*qm)[0].get());
  REQUIRE(q0);
  REQUIRE(i0);
  CHECK(i0->weight().dtype() == DType::s8);
  auto wq = i0->weight().to_vector<std::int8_t>();
  auto ws = i0->weight_scale().to_vector<float>();
  auto fw = fq_channel_ref(q0->weight(), q0->weight_fake_quant().scale(), q0->weight_fake_quant().zero_point(), 0,
                           -128, 127)
                .to_vector<float>();
  for (std::size_t k = 0; k < wq.size(); ++k) CHECK(static_cast<float>(wq[k]) * ws[k / 12] == fw[k]);
  // Input qparams of layer 0 come from the stub, of layer 2 from layer 0's output fake quant.
  auto* stub = dynamic_cast<FakeQuantize*>((*m)[0].get());
  CHECK(bit_equal(i0->input_scale(), stub->scale()));
  auto* i2 = dynamic_cast<QuantizedLinear*>((*qm)[2].get());
  CHECK(bit_equal(i2->input_scale(), q0->activation_fake_quant().scale()));
  CHECK(bit_equal(i2->input_zero_point(), q0->activation_fake_quant().zero_point()));
  // Each converted layer computes the host reference: static activation
  // quant, exact int32 sums, f32 epilogue, output fake quant.
  Tensor x = randn({256, 12}, gen);
  {
    NoGradGuard ng;
    Tensor ref = fq_tensor_ref(qlinear_ref(x, i0->weight(), i0->weight_scale(), i0->bias(), i0->input_scale(),
                                           i0->input_zero_point(), 0, 127),
                               i0->output_scale(), i0->output_zero_point(), 0, 127);
    CHECK(bit_equal(i0->forward(x), ref));
    // The fake-quant stub and QATLinear against their references.
    Tensor xs = stub->forward(x);
    CHECK(bit_equal(xs, fq_tensor_ref(x, stub->scale(), stub->zero_point(), 0, 127)));
    Tensor wq_ref = quantize_channel_ref(q0->weight(), q0->weight_fake_quant().scale(),
                                         q0->weight_fake_quant().zero_point(), 0, DType::s8);
    CHECK(bit_equal(i0->weight(), wq_ref));
  }
  // Predictions agree; outputs agree to within one output quantization step.
  Tensor yf = m->forward(x), yq = qm->forward(x);
  auto pf = argmax_rows(yf), pq = argmax_rows(yq);
  int agree = 0;
  for (std::size_t i = 0; i < pf.size(); ++i) agree += pf[i] == pq[i];
  CHECK(agree >= 253);  // rare ties at a rounding boundary may flip
  const double out_step = dynamic_cast<QATLinear*>((*m)[5].get())->activation_fake_quant().scale().item();
  CHECK(qgrad::testing::max_abs_diff(yf, yq) <= out_step * 1.0001 * 3);
  // The converted model is independent of further training.
  const auto before = i0->input_scale().clone();
  enable_observer(*m, true);
  m->forward(mul(randn({8, 12}, gen), 10.0));
  CHECK(bit_equal(i0->input_scale(), before));
}

TEST_CASE("convert errors") {
  Generator gen(9);
  auto m = mlp(gen);
  CHECK_THROWS_AS(convert(*m), qgrad::Error);  // not prepared
  prepare_qat(*m);
  struct Odd : Module {
    Tensor forward(const Tensor& x) override { return x; }
    std::string type_name() const override { return "Odd"; }
  };
  m->push_back(std::make_shared<Odd>());
  CHECK_THROWS_AS(convert(*m), qgrad::Error);
}

// ---- training and QAT end to end (also on CUDA) ----

namespace {

std::shared_ptr<Sequential> small_mlp(Generator& gen, Device dev) {
  auto m = std::make_shared<Sequential>();
  m->emplace_back<Linear>(20, 32, gen);
  m->emplace_back<ReLU>();
  m->emplace_back<Linear>(32, 5, gen);
  m->to(dev);
  return m;
}

// A learnable toy problem: the label is the argmax of a fixed projection.
void toy_batch(Generator& gen, Device dev, Tensor& x, Tensor& y) {
  Tensor xh = randn({64, 20}, gen);
  auto xv = xh.to_vector<float>();
  std::vector<std::int64_t> lab(64);
  for (int i = 0; i < 64; ++i) {
    int best = 0;
    for (int c = 1; c < 5; ++c)
      if (xv[i * 20 + c] > xv[i * 20 + best]) best = c;
    lab[i] = best;
  }
  x = xh.to(dev);
  y = Tensor::from_vector(lab, {64}, dev);
}

double train_steps(Sequential& m, Optimizer& opt, Device dev, int steps, std::uint64_t seed) {
  Generator gen(seed);
  double last = 0;
  for (int s = 0; s < steps; ++s) {
    Tensor x, y;
    toy_batch(gen, dev, x, y);
    Tensor loss = cross_entropy(m.forward(x), y);
    opt.zero_grad();
    loss.backward();
    opt.step();
    last = loss.item();
  }
  return last;
}

void check_training(Device dev) {
  Generator gen(1);
  auto m = small_mlp(gen, dev);
  AdamW opt(m->named_parameters(), AdamWOptions{1e-2});
  Generator g0(77);
  Tensor x, y;
  toy_batch(g0, dev, x, y);
  const double first = cross_entropy(m->forward(x), y).item();
  const double last = train_steps(*m, opt, dev, 150, 5);
  CHECK(last < first * 0.5);
}

void check_qat(Device dev) {
  Generator gen(2);
  auto m = small_mlp(gen, dev);
  SGD opt(m->named_parameters(), SGDOptions{0.05, 0.9});
  train_steps(*m, opt, dev, 30, 6);
  prepare_qat(*m);
  SGD qopt(m->named_parameters(), SGDOptions{0.02, 0.9});
  train_steps(*m, qopt, dev, 30, 7);
  // Gradients reached the shared weights through the fake quant.
  CHECK(m->named_parameters()[0].second.grad().defined());
  enable_observer(*m, false);
  auto qm = convert(*m);
  Generator g(8);
  Tensor x, y;
  toy_batch(g, dev, x, y);
  NoGradGuard ng;
  Tensor pf = argmax(m->forward(x), 1), pq = argmax(qm->forward(x), 1);
  auto a = pf.cpu().to_vector<std::int64_t>(), b = pq.cpu().to_vector<std::int64_t>();
  int agree = 0;
  for (std::size_t i = 0; i < a.size(); ++i) agree += a[i] == b[i];
  CHECK(agree >= 62);  // of 64; a flip needs a value within float eps of a rounding boundary
}

}  // namespace

TEST_CASE("Linear forward = x W^T + b, and backward reaches W and b") {
  Generator gen(3);
  Linear l(6, 4, gen);
  Tensor x = randn({3, 6}, gen);
  Tensor y = l.forward(x);
  auto xv = x.to_vector<float>(), wv = l.weight().to_vector<float>(), bv = l.bias().to_vector<float>();
  auto yv = y.to_vector<float>();
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j) {
      double acc = bv[j];
      for (int k = 0; k < 6; ++k) acc += double(xv[i * 6 + k]) * wv[j * 6 + k];
      CHECK(yv[i * 4 + j] == doctest::Approx(acc).epsilon(1e-5));
    }
  sum(y).backward();
  CHECK(l.weight().grad().defined());
  CHECK(l.bias().grad().defined());
}

TEST_CASE("training with AdamW lowers the loss (CPU)") { check_training(Device::cpu()); }
TEST_CASE("training with AdamW lowers the loss (CUDA)") {
  QGRAD_REQUIRE_GPU();
  check_training(Device::cuda(0));
}
TEST_CASE("QAT then convert: int8 predictions agree with the fake-quant model (CPU)") { check_qat(Device::cpu()); }
TEST_CASE("QAT then convert: int8 predictions agree with the fake-quant model (CUDA)") {
  QGRAD_REQUIRE_GPU();
  check_qat(Device::cuda(0));
}

TEST_CASE("FakeQuantize on CUDA matches CPU bit for bit") {
  QGRAD_REQUIRE_GPU();
  Generator gen(4);
  Tensor x = randn({128, 64}, gen);
  QConfig q = default_qat_qconfig();
  FakeQuantize a(q.activation), b(q.activation);
  b.to(Device::cuda(0));
  Tensor ya = a.forward(x), yb = b.forward(x.cuda());
  CHECK(bit_equal(ya, yb));
  CHECK(bit_equal(a.scale(), b.scale()));
  CHECK(bit_equal(a.zero_point(), b.zero_point()));
}

TEST_CASE("LearnableFakeQuantize: scale and zero point receive gradients") {
  Generator gen(5);
  ObserverOptions o;
  LearnableFakeQuantize lfq(o, true);
  Tensor x = randn({16, 8}, gen);
  lfq.enable_static_estimate();
  lfq.forward(x);  // observer sets the qparams
  lfq.enable_param_learning();
  Tensor xr = x.detach();
  xr.set_requires_grad(true);
  sum(lfq.forward(xr)).backward();
  CHECK(lfq.scale().grad().defined());
  CHECK(lfq.zero_point().grad().defined());
  CHECK(xr.grad().defined());
}
