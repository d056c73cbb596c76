// bf16 mixed precision (nn::Module::set_compute_dtype): a small MLP trains
// with bf16 matmuls and activations, f32 master weights, f32 gradients and
// f32 optimizer state, and ends close to the same run in f32; on the CPU and
// on CUDA (skipped without a GPU).
#include <cmath>

#include "helpers.h"
#include "qgrad/nn/layers.h"
#include "qgrad/nn/optim.h"
#include "qgrad/nn/qat.h"

using namespace qgrad;
using namespace qgrad::nn;
using namespace qgrad::testing;

namespace {

// Four Gaussian blobs in 16 dimensions (seeded), labels 0..3.
struct Blobs {
  Tensor x, y;
  explicit Blobs(Device dev) {
    Generator gen(0xb10b);
    const std::int64_t n = 256, d = 16;
    Tensor centers = randn({4, d}, gen, {}, 0.0, 0.4);  // overlapping: the loss stays well above 0
    std::vector<float> xs;
    std::vector<std::int64_t> ys;
    const std::vector<float> c = centers.to_vector<float>();
    const std::vector<float> noise = randn({n, d}, gen).to_vector<float>();
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t k = i % 4;
      ys.push_back(k);
      for (std::int64_t j = 0; j < d; ++j)
        xs.push_back(c[static_cast<std::size_t>(k * d + j)] + noise[static_cast<std::size_t>(i * d + j)]);
    }
    x = Tensor::from_vector(xs, {n, d}, dev);
    y = Tensor::from_vector(ys, {n}, dev);
  }
};

std::shared_ptr<Sequential> mlp(Device dev) {
  Generator gen(0x31f);
  auto m = std::make_shared<Sequential>();
  m->emplace_back<Linear>(16, 32, gen);
  m->emplace_back<ReLU>();
  m->emplace_back<Linear>(32, 32, gen);
  m->emplace_back<ReLU>();
  m->emplace_back<Linear>(32, 4, gen);
  m->to(dev);
  return m;
}

struct Run {
  double first_loss = 0, last_loss = 0;
  std::shared_ptr<Sequential> model;
  std::unique_ptr<AdamW> opt;
};

Run train(Device dev, std::optional<DType> compute, int steps = 40) {
  Run r;
  r.model = mlp(dev);
  r.model->set_compute_dtype(compute);
  AdamWOptions o;
  o.lr = 3e-3;
  r.opt = std::make_unique<AdamW>(r.model->named_parameters(), o);
  const Blobs data(dev);
  for (int s = 0; s < steps; ++s) {
    r.opt->zero_grad();
    Tensor logits = r.model->forward(data.x);
    if (compute) REQUIRE(logits.dtype() == *compute);
    // The loss in f32: cross_entropy on the upcast logits.
    Tensor loss = cross_entropy(logits.to(DType::f32), data.y);
    REQUIRE(loss.dtype() == DType::f32);
    loss.backward();
    clip_grad_norm(*r.opt, 5.0);
    r.opt->step();
    const double l = loss.item();
    if (s == 0) r.first_loss = l;
    r.last_loss = l;
  }
  return r;
}

void check_master_state(const Run& r) {
  for (const auto& row : r.model->named_parameters()) {
    const auto& n = std::get<0>(row);
    const auto& p = std::get<1>(row);
    INFO(n);
    CHECK(p.dtype() == DType::f32);
    REQUIRE(p.grad().defined());
    CHECK(p.grad().dtype() == DType::f32);
  }
  for (const auto& row : r.opt->state_dict()) {
    const auto& n = std::get<0>(row);
    const auto& t = std::get<1>(row);
    INFO(n);
    if (n.find("exp_avg") != std::string::npos) CHECK(t.dtype() == DType::f32);
  }
}

void check_close_to_f32(Device dev) {
  const Run f32 = train(dev, std::nullopt), bf16 = train(dev, DType::bf16);
  check_master_state(bf16);
  MESSAGE(dev.str(), ": loss f32 ", f32.first_loss, " -> ", f32.last_loss, ", bf16 ", bf16.first_loss, " -> ",
          bf16.last_loss);
  CHECK(bf16.last_loss < 0.6 * bf16.first_loss);
  // Tolerances: the losses within 0.01 (measured on the CPU: 1.3785 -> 0.6249
  // in f32, 1.3785 -> 0.6251 in bf16), and what training changed in each
  // parameter (final - initial) within 10% relative Frobenius norm of the f32
  // run's change (measured: at most 3.1% on the CPU, 6.7% on the H100, whose
  // bf16 cuBLAS GEMMs accumulate in another order).
  CHECK(std::fabs(bf16.first_loss - f32.first_loss) < 0.01);
  CHECK(std::fabs(bf16.last_loss - f32.last_loss) < 0.01);
  const NamedTensors a = f32.model->named_parameters(), b = bf16.model->named_parameters();
  const NamedTensors w0 = mlp(dev)->named_parameters();
  for (std::size_t i = 0; i < a.size(); ++i) {
    INFO(a[i].first);
    // What training changed, in bf16 against f32.
    std::vector<double> da = testing::values(a[i].second), db = testing::values(b[i].second);
    const std::vector<double> v0 = testing::values(w0[i].second);
    for (std::size_t j = 0; j < v0.size(); ++j) {
      da[j] -= v0[j];
      db[j] -= v0[j];
    }
    const double rel = testing::rel_fro(db, da);
    INFO("update relative difference " << rel);
    CHECK(rel < 0.10);
  }
}

}  // namespace

// to_batch: Tensor::to's values and gradients for every tensor (leaves,
// whose gradients' casts back are deferred, a non-leaf, one already in the
// dtype, an integer one), on every device; errors before anything runs.
TEST_CASE("to_batch gives Tensor::to's values and gradients, one output per tensor") {
  for (const Device d : test_devices()) {
    CAPTURE(d.str());
    Generator gen(0x70b);
    const Tensor base = randn({37, 5}, gen, TensorOptions{}.with_device(d));
    const Tensor small = randn({3}, gen, TensorOptions{}.with_device(d));
    const Tensor as_bf16 = randn({4, 4}, gen, TensorOptions{}.with_device(d)).to(DType::bf16);
    const Tensor ints = Tensor::from_vector<std::int32_t>({1, -2, 3}, {3}).to(d);
    auto run = [&](bool batched) {
      Tensor a = base.clone(), s = small.clone(), h = as_bf16.clone();
      a.set_requires_grad(true);
      s.set_requires_grad(true);
      h.set_requires_grad(true);
      const Tensor mid = mul(a, 3.0);  // a non-leaf
      const std::vector<Tensor> in = {a, s, mid, h, ints};
      std::vector<Tensor> out;
      if (batched) {
        out = to_batch(in, DType::bf16);
      } else {
        for (const Tensor& t : in) out.push_back(t.to(DType::bf16));
      }
      REQUIRE(out.size() == in.size());
      CHECK(out[3].impl() == h.impl());  // already bf16: as is
      Tensor loss = add(sum(mul(out[0].to(DType::f32), out[2].to(DType::f32))), sum(mul(out[1], out[1])).to(DType::f32));
      loss = add(loss, sum(out[3]).to(DType::f32));
      loss.backward();
      return std::vector<Tensor>{out[0], out[1], out[2], out[4], a.grad(), s.grad(), h.grad()};
    };
    const auto want = run(false), got = run(true);
    for (std::size_t i = 0; i < want.size(); ++i) {
      CAPTURE(i);
      REQUIRE(got[i].defined());
      CHECK(got[i].dtype() == want[i].dtype());
      CHECK(bit_equal(got[i], want[i]));
    }
    CHECK(got[4].dtype() == DType::f32);
    check_error([&] { to_batch({base, Tensor()}, DType::bf16); }, "to_batch", "xs[1]");
    CHECK(to_batch({}, DType::f32).empty());
  }
}

TEST_CASE("bf16 mixed precision trains an MLP close to f32 (CPU)") { check_close_to_f32(Device::cpu()); }

TEST_CASE("CUDA: bf16 mixed precision trains an MLP close to f32") {
  QGRAD_REQUIRE_GPU();
  check_close_to_f32(Device::cuda());
}

TEST_CASE("set_compute_dtype: the casts are differentiable, off by default, carried by prepare_qat") {
  auto m = mlp(Device::cpu());
  CHECK_FALSE(m->compute_dtype().has_value());
  Tensor x = ones({2, 16});
  CHECK(m->forward(x).dtype() == DType::f32);
  m->set_compute_dtype(DType::bf16);
  CHECK((*m)[0]->compute_dtype() == DType::bf16);
  CHECK(m->forward(x).dtype() == DType::bf16);
  // QAT under bf16: the weight fake quant runs on the f32 master, the linear in bf16.
  prepare_qat(*m);
  CHECK((*m)[1]->type_name() == "QATLinear");
  CHECK((*m)[1]->compute_dtype() == DType::bf16);
  Tensor out = m->forward(x);
  CHECK(out.dtype() == DType::bf16);
  cross_entropy(out.to(DType::f32), zeros({2}, TensorOptions{}.with_dtype(DType::s64))).backward();
  for (const auto& row : m->named_parameters()) {
    const auto& n = std::get<0>(row);
    const auto& p = std::get<1>(row);
    INFO(n);
    CHECK(p.dtype() == DType::f32);
    if (p.grad().defined()) CHECK(p.grad().dtype() == DType::f32);
  }
  m->set_compute_dtype(std::nullopt);
  CHECK(m->forward(x).dtype() == DType::f32);
  CHECK_THROWS_AS(m->set_compute_dtype(DType::s32), Error);
}
