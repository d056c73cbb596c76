// Optimizers and schedules against PyTorch's update sequences.
#include <cmath>

#include "helpers.h"
#include "qgrad/nn/layers.h"
#include "qgrad/nn/optim.h"

using namespace qgrad;
using namespace qgrad::nn;
using qgrad::testing::bit_equal;

namespace {

Tensor param_from(const std::vector<float>& v, const std::string& name, Device dev = Device::cpu()) {
  Tensor p = Tensor::from_vector(v, {static_cast<std::int64_t>(v.size())}, dev);
  p.set_parameter(name);
  return p;
}

void set_grad(Tensor& p, const std::vector<float>& g) {
  p.set_grad(Tensor::from_vector(g, p.shape(), p.device()));
}

// PyTorch _single_tensor_sgd for one element, every op rounded to float.
struct SgdRef {
  float p, buf = 0;
  bool has_buf = false;
  void step(float g, float lr, float mom, float damp, float wd, bool nesterov) {
    float d = g;
    if (wd != 0) d = d + wd * p;
    if (mom != 0) {
      if (!has_buf) {
        buf = d;
        has_buf = true;
      } else {
        buf = buf * mom;
        buf = buf + (1.0f - damp) * d;
      }
      d = nesterov ? d + mom * buf : buf;
    }
    p = p + (-lr) * d;
  }
};

// PyTorch _single_tensor_adam(decoupled wd) for one element in float.
struct AdamWRef {
  float p, m = 0, v = 0;
  int t = 0;
  void step(float g, double lr, double b1, double b2, double eps, double wd) {
    ++t;
    p = p * static_cast<float>(1.0 - lr * wd);
    const float w = static_cast<float>(1.0 - b1);
    m = m + w * (g - m);  // lerp, |w| < 0.5
    v = v * static_cast<float>(b2);
    v = v + (static_cast<float>(1.0 - b2) * g) * g;
    const double bc1 = 1.0 - std::pow(b1, t), bc2 = 1.0 - std::pow(b2, t);
    const float denom = std::sqrt(v) / static_cast<float>(std::sqrt(bc2)) + static_cast<float>(eps);
    p = p + (static_cast<float>(-(lr / bc1)) * m) / denom;
  }
};

}  // namespace

TEST_CASE("SGD plain: p -= lr * g") {
  Tensor p = param_from({1.0f, -2.0f}, "w");
  SGD opt({{"w", p}}, SGDOptions{0.1});
  set_grad(p, {0.5f, -1.0f});
  opt.step();
  auto v = p.to_vector<float>();
  CHECK(v[0] == doctest::Approx(0.95).epsilon(1e-7));
  CHECK(v[1] == doctest::Approx(-1.9).epsilon(1e-7));
  CHECK(opt.step_count() == 1);
}

TEST_CASE("SGD momentum: hand-computed PyTorch sequence") {
  // p=1, g=0.5 constant, lr 0.1, momentum 0.9: buf 0.5, 0.95, 1.355; p 0.95, 0.855, 0.7195.
  Tensor p = param_from({1.0f}, "w");
  SGD opt({{"w", p}}, SGDOptions{0.1, 0.9});
  const double expect[] = {0.95, 0.855, 0.7195};
  for (double e : expect) {
    set_grad(p, {0.5f});
    opt.step();
    CHECK(p.item() == doctest::Approx(e).epsilon(1e-6));
  }
  auto sd = opt.state_dict();
  bool found = false;
  for (auto& [n, t] : sd)
    if (n == "w.momentum_buffer") {
      found = true;
      CHECK(t.item() == doctest::Approx(1.355).epsilon(1e-6));
    }
  CHECK(found);
}

TEST_CASE("SGD Nesterov: hand-computed PyTorch sequence") {
  // step1: buf 0.5, d = 0.5 + 0.9*0.5 = 0.95, p 0.905; step2: buf 0.95, d = 0.5 + 0.855, p 0.7695.
  Tensor p = param_from({1.0f}, "w");
  SGD opt({{"w", p}}, SGDOptions{0.1, 0.9, 0.0, 0.0, true});
  set_grad(p, {0.5f});
  opt.step();
  CHECK(p.item() == doctest::Approx(0.905).epsilon(1e-6));
  set_grad(p, {0.5f});
  opt.step();
  CHECK(p.item() == doctest::Approx(0.7695).epsilon(1e-6));
}

TEST_CASE("SGD weight decay and dampening: exact float emulation over random steps") {
  Generator gen(11);
  const int n = 37;
  auto p0 = rand({n}, gen, {}, -1, 1).to_vector<float>();
  Tensor p = param_from(p0, "w");
  SGD opt({{"w", p}}, SGDOptions{0.05, 0.8, 0.3, 0.01, false});
  std::vector<SgdRef> ref(n);
  for (int i = 0; i < n; ++i) ref[i].p = p0[i];
  for (int s = 0; s < 5; ++s) {
    auto g = rand({n}, gen, {}, -2, 2).to_vector<float>();
    set_grad(p, g);
    opt.step();
    for (int i = 0; i < n; ++i) ref[i].step(g[i], 0.05f, 0.8f, 0.3f, 0.01f, false);
  }
  auto v = p.to_vector<float>();
  for (int i = 0; i < n; ++i) CHECK(v[i] == ref[i].p);
}

TEST_CASE("SGD Nesterov + weight decay: exact float emulation") {
  Generator gen(12);
  const int n = 50;
  auto p0 = rand({n}, gen, {}, -1, 1).to_vector<float>();
  Tensor p = param_from(p0, "w");
  SGD opt({{"w", p}}, SGDOptions{0.1, 0.9, 0.0, 5e-4, true});
  std::vector<SgdRef> ref(n);
  for (int i = 0; i < n; ++i) ref[i].p = p0[i];
  for (int s = 0; s < 4; ++s) {
    auto g = rand({n}, gen, {}, -1, 1).to_vector<float>();
    set_grad(p, g);
    opt.step();
    for (int i = 0; i < n; ++i) ref[i].step(g[i], 0.1f, 0.9f, 0.0f, 5e-4f, true);
  }
  auto v = p.to_vector<float>();
  for (int i = 0; i < n; ++i) CHECK(v[i] == ref[i].p);
}

// Past the CPU's parallel grain (many chunks of the f32 loop, split over the
// threads) and for each SGD variant the fast loop specialises: the bits of the
// scalar emulation, every element.
TEST_CASE("SGD on a large parameter, every variant: exact float emulation") {
  struct Variant {
    float mom, damp, wd;
    bool nesterov;
  };
  const Variant variants[] = {{0, 0, 0, false}, {0, 0, 1e-2f, false}, {0.9f, 0, 0, false},
                              {0.8f, 0.3f, 1e-2f, false}, {0.9f, 0, 5e-4f, true}};
  Generator gen(13);
  const int n = 100003;  // 25 chunks of 4096 and a tail
  for (const Variant& v : variants) {
    CAPTURE(v.mom);
    CAPTURE(v.wd);
    CAPTURE(v.nesterov);
    auto p0 = rand({n}, gen, {}, -1, 1).to_vector<float>();
    Tensor p = param_from(p0, "w");
    SGD opt({{"w", p}}, SGDOptions{0.05, v.mom, v.damp, v.wd, v.nesterov});
    std::vector<SgdRef> ref(n);
    for (int i = 0; i < n; ++i) ref[i].p = p0[i];
    for (int s = 0; s < 3; ++s) {
      auto g = rand({n}, gen, {}, -2, 2).to_vector<float>();
      set_grad(p, g);
      opt.step();
      for (int i = 0; i < n; ++i) ref[i].step(g[i], 0.05f, v.mom, v.damp, v.wd, v.nesterov);
    }
    const auto got = p.to_vector<float>();
    int wrong = 0;
    for (int i = 0; i < n; ++i) wrong += got[i] != ref[i].p;
    CHECK(wrong == 0);
  }
}

TEST_CASE("AdamW: hand-computed PyTorch sequence with constant gradient") {
  // p=1, g=0.5, lr 0.1, wd 0.01: step1 p = 0.999 - 0.1 = 0.899; step2 p = 0.899*0.999 - 0.1 = 0.798101.
  Tensor p = param_from({1.0f}, "w");
  AdamW opt({{"w", p}}, AdamWOptions{0.1, 0.9, 0.999, 1e-8, 0.01});
  set_grad(p, {0.5f});
  opt.step();
  CHECK(p.item() == doctest::Approx(0.899).epsilon(1e-6));
  set_grad(p, {0.5f});
  opt.step();
  CHECK(p.item() == doctest::Approx(0.798101).epsilon(1e-6));
}

TEST_CASE("AdamW: exact float emulation over random steps, and double reference") {
  Generator gen(13);
  const int n = 41;
  auto p0 = rand({n}, gen, {}, -1, 1).to_vector<float>();
  Tensor p = param_from(p0, "w");
  AdamWOptions o{3e-3, 0.85, 0.99, 1e-6, 0.05};
  AdamW opt({{"w", p}}, o);
  std::vector<AdamWRef> ref(n);
  std::vector<double> dp(p0.begin(), p0.end()), dm(n, 0), dv(n, 0);
  for (int i = 0; i < n; ++i) ref[i].p = p0[i];
  for (int s = 1; s <= 6; ++s) {
    auto g = rand({n}, gen, {}, -1, 1).to_vector<float>();
    set_grad(p, g);
    opt.step();
    for (int i = 0; i < n; ++i) {
      ref[i].step(g[i], o.lr, o.beta1, o.beta2, o.eps, o.weight_decay);
      dp[i] *= 1 - o.lr * o.weight_decay;
      dm[i] = o.beta1 * dm[i] + (1 - o.beta1) * g[i];
      dv[i] = o.beta2 * dv[i] + (1 - o.beta2) * g[i] * g[i];
      const double mh = dm[i] / (1 - std::pow(o.beta1, s)), vh = dv[i] / (1 - std::pow(o.beta2, s));
      dp[i] -= o.lr * mh / (std::sqrt(vh) + o.eps);
    }
  }
  auto v = p.to_vector<float>();
  for (int i = 0; i < n; ++i) {
    CHECK(v[i] == ref[i].p);
    CHECK(v[i] == doctest::Approx(dp[i]).epsilon(1e-5));
  }
}

TEST_CASE("Optimizer: parameters without a gradient are skipped; f64 parameters") {
  Tensor a = param_from({1.0f, 2.0f}, "a");
  Tensor b = param_from({3.0f}, "b");
  Tensor c = Tensor::from_vector<double>({1.0, -1.0}, {2});
  c.set_parameter("c");
  SGD opt({{"a", a}, {"b", b}, {"c", c}}, SGDOptions{0.5, 0.9});
  set_grad(a, {1.0f, 1.0f});
  c.set_grad(Tensor::from_vector<double>({2.0, 4.0}, {2}));
  opt.step();
  CHECK(a.to_vector<float>() == std::vector<float>{0.5f, 1.5f});
  CHECK(b.item() == 3.0);
  CHECK(c.to_vector<double>() == std::vector<double>{0.0, -3.0});
  auto sd = opt.state_dict();
  int bufs = 0;
  for (auto& [n, t] : sd) bufs += n.find("momentum_buffer") != std::string::npos;
  CHECK(bufs == 2);  // b never had a gradient
  opt.zero_grad();
  CHECK_FALSE(a.grad().defined());
}

TEST_CASE("Optimizer state_dict round trip continues identically") {
  Generator gen(14);
  for (int kind = 0; kind < 2; ++kind) {
    auto p0 = rand({16}, gen, {}, -1, 1).to_vector<float>();
    Tensor p1 = param_from(p0, "w"), p2 = param_from(p0, "w");
    std::unique_ptr<Optimizer> o1, o2;
    if (kind == 0) {
      o1 = std::make_unique<SGD>(NamedTensors{{"w", p1}}, SGDOptions{0.1, 0.9, 0.1, 0.01});
      o2 = std::make_unique<SGD>(NamedTensors{{"w", p2}}, SGDOptions{0.1, 0.9, 0.1, 0.01});
    } else {
      o1 = std::make_unique<AdamW>(NamedTensors{{"w", p1}}, AdamWOptions{});
      o2 = std::make_unique<AdamW>(NamedTensors{{"w", p2}}, AdamWOptions{});
    }
    std::vector<std::vector<float>> grads;
    for (int s = 0; s < 4; ++s) grads.push_back(rand({16}, gen, {}, -1, 1).to_vector<float>());
    for (int s = 0; s < 2; ++s) {
      set_grad(p1, grads[s]);
      o1->step();
    }
    // Copy the state (not the shared handles) into the second optimizer.
    NamedTensors sd;
    for (auto& [n, t] : o1->state_dict()) sd.emplace_back(n, t.clone());
    p2.detach().copy_(p1);
    o2->load_state_dict(sd);
    CHECK(o2->step_count() == 2);
    for (int s = 2; s < 4; ++s) {
      set_grad(p1, grads[s]);
      set_grad(p2, grads[s]);
      o1->step();
      o2->step();
    }
    CHECK(bit_equal(p1, p2));
  }
}

TEST_CASE("Optimizer errors") {
  Tensor p = param_from({1.0f}, "w");
  CHECK_THROWS_AS(SGD({}, SGDOptions{}), qgrad::Error);
  CHECK_THROWS_AS(SGD({{"w", p}}, SGDOptions{-0.1}), qgrad::Error);
  CHECK_THROWS_AS(SGD({{"w", p}, {"w", p}}, SGDOptions{}), qgrad::Error);
  CHECK_THROWS_AS(SGD({{"w", p}}, SGDOptions{0.1, 0.0, 0.0, 0.0, true}), qgrad::Error);
  CHECK_THROWS_AS(AdamW({{"w", p}}, AdamWOptions{0.1, 1.0}), qgrad::Error);
  Tensor nograd = Tensor::from_vector<float>({1.0f}, {1});
  CHECK_THROWS_AS(SGD({{"x", nograd}}, SGDOptions{}), qgrad::Error);
  SGD opt({{"w", p}}, SGDOptions{0.1, 0.9});
  CHECK_THROWS_AS(opt.set_lr(NAN), qgrad::Error);
  CHECK_THROWS_AS(opt.load_state_dict({}), qgrad::Error);
  CHECK_THROWS_AS(opt.load_state_dict({{"step", Tensor::scalar<std::int64_t>(1)},
                                       {"w.step", Tensor::scalar<std::int64_t>(1)},
                                       {"w.momentum_buffer", Tensor::from_vector<float>({1, 2}, {2})}}),
                  qgrad::Error);
  CHECK_THROWS_AS(opt.load_state_dict({{"step", Tensor::scalar<std::int64_t>(1)},
                                       {"w.step", Tensor::scalar<std::int64_t>(1)},
                                       {"bogus", Tensor::scalar<std::int64_t>(1)}}),
                  qgrad::Error);
}

TEST_CASE("CosineSchedule with warmup and StepSchedule") {
  CosineSchedule cos(0.1, 110, 10, 0.001);
  CHECK(cos.lr_at(0) == doctest::Approx(0.01));
  CHECK(cos.lr_at(9) == doctest::Approx(0.1));
  CHECK(cos.lr_at(10) == doctest::Approx(0.1));
  CHECK(cos.lr_at(60) == doctest::Approx(0.001 + 0.099 * 0.5));
  CHECK(cos.lr_at(110) == doctest::Approx(0.001));
  CosineSchedule plain(1.0, 4);
  CHECK(plain.lr_at(2) == doctest::Approx(0.5));
  StepSchedule st(1.0, 3, 0.5);
  CHECK(st.lr_at(2) == 1.0);
  CHECK(st.lr_at(3) == 0.5);
  CHECK(st.lr_at(7) == 0.25);
  Tensor p = param_from({1.0f}, "w");
  SGD opt({{"w", p}}, SGDOptions{1.0});
  st.apply(opt);
  CHECK(opt.lr() == 1.0);
  CHECK_THROWS_AS(CosineSchedule(0.1, 10, 10), qgrad::Error);
  CHECK_THROWS_AS(StepSchedule(0.1, 0), qgrad::Error);
}

namespace {
// Many parameters (more than one CUDA chunk) of assorted sizes and dtypes.
void run_many(Device dev, DType dt, int kind, std::vector<Tensor>& out) {
  Generator gen(99);
  NamedTensors ps;
  for (int i = 0; i < 40; ++i) {
    const std::int64_t n = 1 + (i * 977) % 3000;
    Tensor p = rand({n}, gen, TensorOptions{}.with_dtype(dt), -1, 1).to(dev);
    std::string name = "p";
    name += std::to_string(i);
    p.set_parameter(name);
    ps.emplace_back(name, p);
  }
  std::unique_ptr<Optimizer> opt;
  if (kind == 0) opt = std::make_unique<SGD>(ps, SGDOptions{0.05, 0.9, 0.0, 1e-3, true});
  else opt = std::make_unique<AdamW>(ps, AdamWOptions{1e-2});
  for (int s = 0; s < 3; ++s) {
    for (auto& [n, p] : ps) p.set_grad(rand(p.shape(), gen, TensorOptions{}.with_dtype(dt), -1, 1).to(dev));
    opt->step();
  }
  out.clear();
  for (auto& [n, p] : ps) out.push_back(p.detach().cpu());
  for (auto& [n, t] : opt->state_dict()) out.push_back(t.cpu());
}
}  // namespace

TEST_CASE("CUDA optimizers match CPU bit for bit (multi-tensor launch)") {
  QGRAD_REQUIRE_GPU();
  for (DType dt : {DType::f32, DType::bf16, DType::f64})
    for (int kind = 0; kind < 2; ++kind) {
      std::vector<Tensor> c, g;
      run_many(Device::cpu(), dt, kind, c);
      run_many(Device::cuda(0), dt, kind, g);
      REQUIRE(c.size() == g.size());
      for (std::size_t i = 0; i < c.size(); ++i) CHECK(bit_equal(c[i], g[i]));
    }
}

TEST_CASE("CUDA: an optimizer built before Module::to follows its parameters") {
  QGRAD_REQUIRE_GPU();
  Generator gen(21);
  Linear a(8, 4, gen);
  Generator gen2(21);
  Linear b(8, 4, gen2);
  AdamW oa(a.named_parameters(), AdamWOptions{});
  AdamW ob(b.named_parameters(), AdamWOptions{});
  b.to(Device::cuda(0));
  for (int s = 0; s < 2; ++s) {
    for (std::size_t i = 0; i < 2; ++i) {
      Tensor g = rand(a.parameters()[i].shape(), gen, {}, -1, 1);
      a.parameters()[i].set_grad(g);
      b.parameters()[i].set_grad(g.cuda());
    }
    oa.step();
    ob.step();
  }
  for (std::size_t i = 0; i < 2; ++i) CHECK(bit_equal(a.parameters()[i], b.parameters()[i]));
}

TEST_CASE("16-bit parameters update in float and round once per state write") {
  // bf16 p = 1, g = 0.5, SGD lr 0.1: p = bf16(1 - 0.05) = bf16(0.95) = 0.94921875.
  Tensor p = Tensor::from_vector<float>({1.0f}, {1}).to(DType::bf16);
  p.set_parameter("w");
  SGD opt({{"w", p}}, SGDOptions{0.1});
  p.set_grad(Tensor::from_vector<float>({0.5f}, {1}).to(DType::bf16));
  opt.step();
  CHECK(p.item() == 0.94921875);
  Tensor h = Tensor::from_vector<float>({1.0f}, {1}).to(DType::f16);
  h.set_parameter("h");
  AdamW ah({{"h", h}}, AdamWOptions{0.1, 0.9, 0.999, 1e-8, 0.0});
  h.set_grad(Tensor::from_vector<float>({0.5f}, {1}).to(DType::f16));
  ah.step();
  CHECK(h.item() == doctest::Approx(0.9).epsilon(1e-3));  // one Adam step moves by lr
}
