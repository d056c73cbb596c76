// Gradient clipping by global norm (ops/optim.h grad_norm / grad_scale_,
// nn::clip_grad_norm): against a host f64 reference, against PyTorch 2.11's
// torch.nn.utils.clip_grad_norm_ (tests/python/gen_clip_golden.py), edge
// values, the fused path through the optimizer step, error_if_nonfinite
// without a host sync, and CUDA against the CPU.
#include <cmath>
#include <cstring>

#include "helpers.h"
#include "qgrad/nn/layers.h"
#include "qgrad/nn/optim.h"

using namespace qgrad;
using namespace qgrad::nn;
using qgrad::testing::bit_equal;

namespace {

// The gradients of gen_clip_golden.py: exact f32 values from integers.
const std::vector<Shape> kGoldenShapes = {{70, 70}, {5, 3}, {0}, {300, 451}, {1}};

std::vector<Tensor> golden_grads(Device dev = Device::cpu()) {
  std::vector<Tensor> out;
  for (std::size_t k = 0; k < kGoldenShapes.size(); ++k) {
    const std::int64_t n = shape_numel(kGoldenShapes[k], "test");
    std::vector<float> v(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i)
      v[static_cast<std::size_t>(i)] =
          static_cast<float>(((i * 7919 + static_cast<std::int64_t>(k) * 104729) % 2001) - 1000) / 256.0f *
          std::ldexp(1.0f, static_cast<int>(k) - 3);
    out.push_back(Tensor::from_vector(v, kGoldenShapes[k], dev));
  }
  return out;
}

// The f64 host reference: per-tensor norms, then the norm of those.
double host_norm(const std::vector<Tensor>& ts, double p) {
  std::vector<double> norms;
  for (const Tensor& t : ts) {
    double acc = 0;
    for (double x : testing::values(t)) acc = std::isinf(p) ? std::max(acc, std::fabs(x)) : acc + std::pow(std::fabs(x), p);
    norms.push_back(std::isinf(p) ? acc : std::pow(acc, 1.0 / p));
  }
  double acc = 0;
  for (double n : norms) acc = std::isinf(p) ? std::max(acc, n) : acc + std::pow(n, p);
  return std::isinf(p) ? acc : std::pow(acc, 1.0 / p);
}

std::vector<Tensor> random_grads(Generator& gen, DType dt, Device dev = Device::cpu()) {
  const auto o = TensorOptions{}.with_dtype(dt).with_device(dev);
  return {randn({33, 129}, gen, o), randn({7}, gen, o, 0.0, 30.0), randn({2, 3, 4}, gen, o, 0.0, 1e-3),
          randn({50000}, gen, o, 0.0, 0.1), zeros({0}, o)};
}

}  // namespace

TEST_CASE("grad_norm against a host f64 reference (1, 2, inf in f32 and f64)") {
  Generator gen(0xc11f);
  for (DType dt : {DType::f32, DType::f64}) {
    const std::vector<Tensor> gs = random_grads(gen, dt);
    for (double p : {1.0, 2.0, double(INFINITY)}) {
      INFO(dtype_name(dt) << " p=" << p);
      const double want = host_norm(gs, p);
      const GradNorm n = grad_norm(gs, 1.5, p);
      CHECK(n.total_norm.shape() == Shape{});
      CHECK(n.total_norm.dtype() == dt);
      const double tol = dt == DType::f32 ? 2e-6 : 1e-13;
      CHECK(std::fabs(n.total_norm.item() - want) <= tol * want);
      const double coef = std::min(1.5 / (want + 1e-6), 1.0);
      CHECK(std::fabs(n.clip_coef.item() - coef) <= tol * coef);
    }
  }
}

TEST_CASE("grad_norm: the same bits on every run and 16-bit inputs accumulate in f32") {
  Generator gen(0xd37);
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    const std::vector<Tensor> gs = random_grads(gen, dt);
    const GradNorm a = grad_norm(gs, 1.0), b = grad_norm(gs, 1.0);
    CHECK(bit_equal(a.total_norm, b.total_norm));
    CHECK(bit_equal(a.clip_coef, b.clip_coef));
    // f32 accumulation: within the 16-bit rounding of the result.
    const double want = host_norm(gs, 2.0);
    CHECK(std::fabs(a.total_norm.item() - want) <= (dt == DType::bf16 ? 8e-3 : 1e-3) * want);
  }
}

TEST_CASE("clip_grad_norm matches PyTorch 2.11 golden values") {
  struct Golden {
    double norm_type, max_norm, total, coef;
    double samples[3];  // grads[0][123], grads[3][100000], grads[4][0] after clipping
  };
  // tests/python/gen_clip_golden.py (the inf case leaves the empty tensor out:
  // PyTorch raises for the inf-norm of an empty tensor; qgrad gives 0).
  const Golden golden[] = {
      {2.0, 5.0, 830.2386474609375, 0.00602236483246088,
       {0.001620274968445301, -0.016984950751066208, -0.013785569928586483}},
      {1.0, 1000000000.0, 265594.84375, 1.0, {0.26904296875, -2.8203125, -2.2890625}},
      {INFINITY, 0.5, 3.90625, 0.12799996137619019, {0.03443748876452446, -0.3609998822212219, -0.29299992322921753}},
      {2.0, 1000000000.0, 830.2386474609375, 1.0, {0.26904296875, -2.8203125, -2.2890625}},
  };
  for (const Golden& g : golden) {
    INFO("norm_type " << g.norm_type << " max_norm " << g.max_norm);
    NamedTensors params;
    const std::vector<Tensor> grads = golden_grads();
    for (std::size_t k = 0; k < grads.size(); ++k) {
      // Appended, not "p" + to_string(k): g++ 12 at -O3 flags that with a false -Wrestrict.
      std::string name = "p";
      name += std::to_string(k);
      Tensor p = zeros(grads[k].shape());
      p.set_parameter(name);
      if (grads[k].numel() > 0 || !std::isinf(g.norm_type)) p.set_grad(grads[k]);
      params.emplace_back(name, p);
    }
    std::vector<Tensor> used;
    for (const auto& [n, p] : params)
      if (p.grad().defined()) used.push_back(p.grad().clone());
    const double exact = host_norm(used, g.norm_type);
    const Tensor total = clip_grad_norm(params, g.max_norm, g.norm_type);
    // PyTorch's CPU vector_norm sums 135300 floats less accurately than the
    // lane order here (its 1-norm is 4.3e-5 below the exact sum, its 2-norm
    // 6.5e-6 above; ours are within 1e-6 of exact): agreement within 1e-4.
    CHECK(std::fabs(total.item() - g.total) <= 1e-4 * g.total);
    CHECK(std::fabs(total.item() - exact) <= 1e-6 * exact);
    const double got[3] = {testing::values(params[0].second.grad())[123],
                           testing::values(params[3].second.grad())[100000],
                           testing::values(params[4].second.grad())[0]};
    for (int i = 0; i < 3; ++i) CHECK(std::fabs(got[i] - g.samples[i]) <= 1e-4 * std::fabs(g.samples[i]));
    if (g.coef == 1.0) {  // not clipping: the gradients are unchanged, bit for bit
      for (int i = 0; i < 3; ++i) CHECK(got[i] == g.samples[i]);
    }
  }
}

TEST_CASE("grad_norm edge values: NaN, inf, -0, max_norm 0, coefficient clamped to 1") {
  const Tensor a = Tensor::from_vector(std::vector<float>{3.0f, -4.0f}, {2});
  SUBCASE("norms of a 3-4-5 triangle, coefficient clamped at 1") {
    CHECK(grad_norm({a}, 100.0).total_norm.item() == 5.0);
    CHECK(grad_norm({a}, 100.0).clip_coef.item() == 1.0);
    CHECK(grad_norm({a}, 1.0, 1.0).total_norm.item() == 7.0);
    CHECK(grad_norm({a}, 1.0, INFINITY).total_norm.item() == 4.0);
    // max_norm / (5 + 1e-6) in PyTorch's order, rounded to float.
    const float shifted = 5.0f + static_cast<float>(1e-6);
    const float coef = (1.0f / shifted) * 2.5f;
    CHECK(grad_norm({a}, 2.5).clip_coef.item() == static_cast<double>(coef));
    CHECK(grad_norm({a}, 0.0).clip_coef.item() == 0.0);
  }
  SUBCASE("signed zeros: the norm is +0 and the coefficient 1") {
    const Tensor z = Tensor::from_vector(std::vector<float>{-0.0f, 0.0f, -0.0f}, {3});
    for (double p : {1.0, 2.0, double(INFINITY)}) {
      const GradNorm n = grad_norm({z}, 1.0, p);
      const float t = n.total_norm.to_vector<float>()[0];
      CHECK(t == 0.0f);
      CHECK_FALSE(std::signbit(t));
      CHECK(n.clip_coef.item() == 1.0);
    }
  }
  SUBCASE("NaN propagates to the norm and the coefficient (every order)") {
    const Tensor n = Tensor::from_vector(std::vector<float>{1.0f, NAN, 2.0f}, {3});
    for (double p : {1.0, 2.0, double(INFINITY)}) {
      const GradNorm r = grad_norm({a, n}, 1.0, p);
      CHECK(std::isnan(r.total_norm.item()));
      CHECK(std::isnan(r.clip_coef.item()));
    }
  }
  SUBCASE("inf: norm inf, coefficient 0; the flag is set and stays set") {
    const Tensor i = Tensor::from_vector(std::vector<float>{1.0f, -INFINITY}, {2});
    Tensor flag = zeros({1}, TensorOptions{}.with_dtype(DType::s32));
    GradNorm r = grad_norm({a, i}, 1.0, 2.0, flag);
    CHECK(std::isinf(r.total_norm.item()));
    CHECK(r.clip_coef.item() == 0.0);
    CHECK(flag.item() == 1.0);
    r = grad_norm({a}, 1.0, 2.0, flag);  // finite: the flag is not cleared
    CHECK(flag.item() == 1.0);
    Tensor fresh = zeros({1}, TensorOptions{}.with_dtype(DType::s32));
    grad_norm({a}, 1.0, 2.0, fresh);
    CHECK(fresh.item() == 0.0);
  }
  SUBCASE("only empty tensors: norm 0") {
    const GradNorm r = grad_norm({zeros({0}), zeros({0, 3})}, 1.0, INFINITY);
    CHECK(r.total_norm.item() == 0.0);
    CHECK(r.clip_coef.item() == 1.0);
  }
}

TEST_CASE("grad_scale_ and nn::clip_grad_norm on parameters (in place, PyTorch's semantics)") {
  Generator gen(0x5ca1e);
  NamedTensors params;
  std::vector<Tensor> before;
  for (int k = 0; k < 3; ++k) {
    std::string name = "w";  // appended: see above (g++ 12 -Wrestrict)
    name += std::to_string(k);
    Tensor p = randn({4 + k, 3}, gen);
    p.set_parameter(name);
    if (k != 1) {  // a parameter without a gradient is left out
      p.set_grad(randn({4 + k, 3}, gen, {}, 0.0, 10.0));
      before.push_back(p.grad().clone());
    }
    params.emplace_back(name, p);
  }
  const double want = host_norm(before, 2.0);
  const Tensor total = clip_grad_norm(params, 1.0);
  CHECK(std::fabs(total.item() - want) <= 2e-6 * want);
  const float coef = (1.0f / static_cast<float>(static_cast<float>(total.item()) + static_cast<float>(1e-6))) * 1.0f;
  const std::vector<float> g0 = before[0].to_vector<float>(), s0 = params[0].second.grad().to_vector<float>();
  for (std::size_t i = 0; i < g0.size(); ++i) CHECK(s0[i] == g0[i] * coef);
  CHECK_FALSE(params[1].second.grad().defined());
  CHECK(std::fabs(host_norm({params[0].second.grad(), params[2].second.grad()}, 2.0) - 1.0) < 1e-5);

  // error_if_nonfinite on parameters syncs and throws before any gradient changes.
  Tensor bad = params[2].second.grad();
  bad.copy_(full(bad.shape(), NAN));
  const Tensor g0_before = params[0].second.grad().clone();
  CHECK_THROWS_AS(clip_grad_norm(params, 1.0, 2.0, true), Error);
  CHECK(bit_equal(g0_before, params[0].second.grad()));
  // Without it, the NaN coefficient reaches every gradient (PyTorch's behaviour).
  clip_grad_norm(params, 1.0);
  CHECK(std::isnan(testing::values(params[0].second.grad())[0]));
  // No gradient at all: a zero norm.
  NamedTensors none{{"x", zeros({2}).set_requires_grad()}};
  CHECK(clip_grad_norm(none, 1.0).item() == 0.0);
}

namespace {

// Two identical small models and optimizers; the gradients of a fixed batch.
struct Twin {
  std::shared_ptr<Sequential> model;
  std::unique_ptr<Optimizer> opt;
  Twin(bool adamw, Device dev) {
    Generator gen(0x7a1);
    model = std::make_shared<Sequential>();
    model->emplace_back<Linear>(12, 16, gen);
    model->emplace_back<ReLU>();
    model->emplace_back<Linear>(16, 5, gen);
    model->to(dev);
    if (adamw) {
      AdamWOptions o;
      o.lr = 1e-2;
      opt = std::make_unique<AdamW>(model->named_parameters(), o);
    } else {
      SGDOptions o;
      o.lr = 0.1;
      o.momentum = 0.9;
      opt = std::make_unique<SGD>(model->named_parameters(), o);
    }
  }
  void backward(int step, double grad_gain = 1.0) {
    Generator gen(0xba + static_cast<std::uint64_t>(step));
    const Device dev = model->named_parameters().front().second.device();
    Tensor x = mul(randn({8, 12}, gen, TensorOptions{}.with_device(dev)), grad_gain);
    Tensor y = randint(0, 5, {8}, gen, TensorOptions{}.with_dtype(DType::s64).with_device(dev));
    opt->zero_grad();
    cross_entropy(model->forward(x), y).backward();
  }
};

}  // namespace

TEST_CASE("clip_grad_norm on an optimizer: fused into the step, the same bits as clipping the gradients") {
  for (bool adamw : {false, true}) {
    INFO((adamw ? "AdamW" : "SGD"));
    Twin fused(adamw, Device::cpu()), plain(adamw, Device::cpu());
    for (int step = 0; step < 4; ++step) {
      fused.backward(step, 20.0);
      plain.backward(step, 20.0);
      const Tensor g_before = fused.model->named_parameters().front().second.grad().clone();
      const Tensor tf = clip_grad_norm(*fused.opt, 0.25);
      const Tensor tp = clip_grad_norm(plain.opt->params(), 0.25);
      CHECK(bit_equal(tf, tp));
      CHECK(tf.item() > 0.25);  // it clips
      // The fused path leaves the gradients alone; the step applies the coefficient.
      CHECK(bit_equal(g_before, fused.model->named_parameters().front().second.grad()));
      fused.opt->step();
      plain.opt->step();
    }
    const NamedTensors a = fused.model->state_dict(), b = plain.model->state_dict();
    for (std::size_t i = 0; i < a.size(); ++i) {
      INFO(a[i].first);
      CHECK(bit_equal(a[i].second, b[i].second));
    }
  }
}

TEST_CASE("clip_grad_norm on an optimizer: error_if_nonfinite skips the steps and reports at check_finite") {
  Twin t(true, Device::cpu());
  t.backward(0);
  clip_grad_norm(*t.opt, 1.0, 2.0, true);
  t.opt->step();
  t.opt->check_finite();  // finite: no error
  const NamedTensors good = t.model->state_dict();
  std::vector<Tensor> saved;
  for (const auto& [n, v] : good) saved.push_back(v.clone());
  // A NaN gradient: the step writes nothing, the error waits for the check.
  t.backward(1);
  Tensor g = t.model->named_parameters().front().second.grad();
  g.copy_(full(g.shape(), NAN));
  const Tensor total = clip_grad_norm(*t.opt, 1.0, 2.0, true);
  t.opt->step();
  t.backward(2);  // finite again, but the flag is sticky: still skipped
  clip_grad_norm(*t.opt, 1.0, 2.0, true);
  t.opt->step();
  const NamedTensors after = t.model->state_dict();
  for (std::size_t i = 0; i < after.size(); ++i) CHECK(bit_equal(saved[i], after[i].second));
  CHECK(std::isnan(total.item()));
  try {
    t.opt->check_finite();
    FAIL("check_finite did not throw");
  } catch (const Error& e) {
    CHECK(std::string(e.op()) == "clip_grad_norm");
    CHECK(std::string(e.arg()) == "error_if_nonfinite");
  }
  t.opt->check_finite();  // cleared
  t.backward(3);
  clip_grad_norm(*t.opt, 1.0, 2.0, true);
  t.opt->step();
  CHECK_FALSE(bit_equal(saved[0], t.model->state_dict()[0].second));
}

TEST_CASE("clip_grad_norm on an optimizer: once per step; zero_grad drops the pending coefficient") {
  Twin t(false, Device::cpu());
  t.backward(0);
  clip_grad_norm(*t.opt, 1.0);
  CHECK_THROWS_AS(clip_grad_norm(*t.opt, 1.0), Error);
  t.opt->zero_grad();
  CHECK_FALSE(t.opt->grad_scale().defined());
  t.backward(1);
  clip_grad_norm(*t.opt, 1.0);
  t.opt->step();
  CHECK_FALSE(t.opt->grad_scale().defined());
  CHECK_THROWS_AS(grad_norm({zeros({2})}, 1.0, 3.0), Error);
}

TEST_CASE("CUDA: grad_norm, grad_scale_ and the fused clipped step match the CPU bit for bit") {
  QGRAD_REQUIRE_GPU();
  const Device dev = Device::cuda();
  Generator gen(0xc0da);
  for (DType dt : {DType::f32, DType::f64, DType::bf16, DType::f16}) {
    INFO(dtype_name(dt));
    const std::vector<Tensor> cpu = random_grads(gen, dt);
    std::vector<Tensor> cuda;
    for (const Tensor& t : cpu) cuda.push_back(t.to(dev));
    for (double p : {1.0, 2.0, double(INFINITY)}) {
      const GradNorm a = grad_norm(cpu, 0.5, p), b = grad_norm(cuda, 0.5, p);
      CHECK(bit_equal(a.total_norm, b.total_norm));
      CHECK(bit_equal(a.clip_coef, b.clip_coef));
    }
    // Many tensors: more than one launch of 128.
    std::vector<Tensor> many_cpu, many_cuda;
    for (int k = 0; k < 300; ++k) {
      many_cpu.push_back(randn({1 + k % 7, 5000 * (k % 3)}, gen, TensorOptions{}.with_dtype(dt)));
      many_cuda.push_back(many_cpu.back().to(dev));
    }
    const GradNorm a = grad_norm(many_cpu, 0.5), b = grad_norm(many_cuda, 0.5);
    CHECK(bit_equal(a.total_norm, b.total_norm));
    grad_scale_(many_cpu, a.clip_coef);
    grad_scale_(many_cuda, b.clip_coef);
    for (std::size_t k = 0; k < many_cpu.size(); ++k) CHECK(bit_equal(many_cpu[k], many_cuda[k]));
  }
  for (bool adamw : {false, true}) {
    Twin c(adamw, Device::cpu()), g(adamw, dev);
    for (int step = 0; step < 3; ++step) {
      c.backward(step, 20.0);
      g.backward(step, 20.0);
      clip_grad_norm(*c.opt, 0.25, 2.0, true);
      clip_grad_norm(*g.opt, 0.25, 2.0, true);
      c.opt->step();
      g.opt->step();
    }
    g.opt->check_finite();
    // The forward/backward GEMMs differ by device (cuBLAS), so compare with a tolerance.
    const NamedTensors a = c.model->state_dict(), b = g.model->state_dict();
    for (std::size_t i = 0; i < a.size(); ++i) CHECK(testing::max_abs_diff(a[i].second, b[i].second) < 1e-4);
  }
}
