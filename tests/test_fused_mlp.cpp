// nn::qat_mlp_loss_backward / qat_mlp_loss_backward_: a QAT MLP's forward,
// loss and backward as one CUDA kernel, against the composed ops (the same
// model, the same batches): the loss, every parameter gradient and every
// observer's state. The products are summed in another order than cuBLAS's,
// so values agree to float rounding, except where a value within that of a
// fake quant's rounding boundary lands on the neighbouring level: the
// gradients are compared by their relative Frobenius error, the observer
// states that do not depend on a product (the input's, the weights' first
// update) bit for bit. One such flip upstream moves a later layer's range by
// up to that fake quant's scale times a weight (0.4% of the logits' minimum
// seen at b256, H200), and the moved scale then re-levels most values after
// it: each step starts both paths from the same state (the composed model
// takes the fused one's gradients and observer states before the optimizer
// steps), so that one flip is checked in the step it happens and does not
// carry the paths apart.
#include <cmath>
#include <cstring>
#include <vector>

#include "../bench/qat_mlp.h"
#include "helpers.h"

using namespace qgrad;
using namespace qgrad::testing;

namespace {

// A prepared MLP dims[0]-dims[1]-...-dims.back() (ReLU after every layer but
// the last), its initial weights drawn from `seed`, on `dev`.
std::shared_ptr<nn::Sequential> make_mlp(Device dev, const std::vector<std::int64_t>& dims, std::uint64_t seed) {
  auto model = std::make_shared<nn::Sequential>();
  Generator gen(seed);
  for (std::size_t i = 0; i + 1 < dims.size(); ++i) {
    model->emplace_back<nn::Linear>(dims[i], dims[i + 1], gen);
    if (i + 2 < dims.size()) model->emplace_back<nn::ReLU>();
  }
  nn::prepare_qat(*model, nn::default_qat_qconfig());
  model->to(dev);
  model->train();
  return model;
}

// NaN blocks in the allocator's cache: a gradient the kernel does not write shows.
void poison_allocator(Device dev) {
  std::vector<Tensor> blocks;
  for (std::int64_t n : {1024, 16384, 262144, 1048576})
    blocks.push_back(full({n}, NAN, TensorOptions{}.with_device(dev)));
}

bool all_finite(const Tensor& t) {
  for (double v : values(t))
    if (!std::isfinite(v)) return false;
  return true;
}

// Steps of the fused and the composed path from the same model, SGD with
// momentum on each; checks after every step's backward.
void check_against_composed(const std::vector<std::int64_t>& dims, std::int64_t batch, int steps) {
  const Device dev = Device::cuda();
  auto fused = make_mlp(dev, dims, 0xf00d), composed = make_mlp(dev, dims, 0xf00d);
  {
    Generator g0(1);
    const Tensor x0 = randn({batch, dims[0]}, g0, TensorOptions{}.with_device(dev));
    const Tensor y0 = zeros({batch}, TensorOptions{}.with_dtype(DType::s64).with_device(dev));
    REQUIRE(nn::qat_mlp_fused_unsupported(*fused, x0, y0) == "");  // the kernel runs, not the composed ops
  }
  nn::SGDOptions o;
  o.lr = 0.05;
  o.momentum = 0.9;
  nn::SGD opt_fused(fused->named_parameters(), o), opt_composed(composed->named_parameters(), o);
  Generator gen(0xba7c4);
  for (int s = 0; s < steps; ++s) {
    INFO("step " << s);
    const Tensor x = randn({batch, dims[0]}, gen, TensorOptions{}.with_device(dev));
    const Tensor y = randint(0, dims.back(), {batch}, gen, TensorOptions{}.with_dtype(DType::s64).with_device(dev));
    opt_fused.zero_grad();
    opt_composed.zero_grad();
    poison_allocator(dev);
    const Tensor loss_fused = nn::qat_mlp_loss_backward(*fused, x, y);
    Tensor loss_composed = cross_entropy(composed->forward(x), y);
    loss_composed.backward();
    const double lf = values(loss_fused)[0], lc = values(loss_composed)[0];
    CHECK(std::fabs(lf - lc) <= 1e-4 * std::fabs(lc));
    const nn::NamedTensors pf = fused->named_parameters(), pc = composed->named_parameters();
    REQUIRE(pf.size() == pc.size());
    for (std::size_t i = 0; i < pf.size(); ++i) {
      INFO(pf[i].first);
      REQUIRE(pf[i].second.grad().defined());
      CHECK(all_finite(pf[i].second.grad()));
      const double err = rel_fro(values(pf[i].second.grad()), values(pc[i].second.grad()));
      MESSAGE("gradient relative error " << err);
      CHECK(err < 5e-3);
    }
    // Observer ranges and qparams. The input's and (at the first step, from
    // the same weights) the weights' do not depend on a product: bit for bit.
    const nn::NamedTensors bf = fused->named_buffers(), bc = composed->named_buffers();
    REQUIRE(bf.size() == bc.size());
    for (std::size_t i = 0; i < bf.size(); ++i) {
      const std::string& n = bf[i].first;
      INFO(n);
      const bool exact = n.rfind("quant.", 0) == 0 || (s == 0 && n.find("weight_fake_quant") != std::string::npos);
      if (exact) {
        CHECK(bit_equal(bf[i].second, bc[i].second));
      } else if (bf[i].second.dtype() == DType::s32) {
        CHECK(max_abs_diff(bf[i].second, bc[i].second) <= 1.0);
      } else {
        CHECK(rel_fro(values(bf[i].second), values(bc[i].second)) < 1e-2);  // a flip's reach (above)
      }
    }
    // The same state into the next step (above): the fused path's gradients and observer states.
    for (std::size_t i = 0; i < pf.size(); ++i) pc[i].second.grad().copy_(pf[i].second.grad());
    for (std::size_t i = 0; i < bf.size(); ++i) Tensor(bc[i].second).copy_(bf[i].second);  // a handle: same storage
    opt_fused.step();
    opt_composed.step();
  }
}

}  // namespace

TEST_CASE("CUDA: the fused QAT MLP step gives the composed ops' loss, gradients and observer states") {
  QGRAD_REQUIRE_GPU();
  SUBCASE("the benchmark's 784-256-256-10 at batch 256") { check_against_composed({784, 256, 256, 10}, 256, 4); }
  SUBCASE("odd shapes: partial tiles, one layer per phase split or not") {
    check_against_composed({50, 37, 70, 9}, 45, 3);
  }
  SUBCASE("four layers, a wide one, batch 500") { check_against_composed({300, 512, 96, 33, 10}, 500, 2); }
  SUBCASE("one layer, batch 3") { check_against_composed({20, 7}, 3, 2); }
}

TEST_CASE("CUDA: the fused step adds to gradients that exist, bit for bit") {
  QGRAD_REQUIRE_GPU();
  const Device dev = Device::cuda();
  const std::vector<std::int64_t> dims{64, 48, 10};
  auto fresh = make_mlp(dev, dims, 7), accumulated = make_mlp(dev, dims, 7);
  Generator gen(11);
  const Tensor x = randn({32, 64}, gen, TensorOptions{}.with_device(dev));
  const Tensor y = randint(0, 10, {32}, gen, TensorOptions{}.with_dtype(DType::s32).with_device(dev));
  std::vector<Tensor> before;
  for (auto& [n, p] : accumulated->named_parameters()) {
    before.push_back(randn(p.shape(), gen, TensorOptions{}.with_device(dev)));
    const_cast<Tensor&>(p).set_grad(before.back().clone());
  }
  nn::qat_mlp_loss_backward(*fresh, x, y);
  nn::qat_mlp_loss_backward(*accumulated, x, y);
  const nn::NamedTensors pf = fresh->named_parameters(), pa = accumulated->named_parameters();
  for (std::size_t i = 0; i < pf.size(); ++i) {
    INFO(pf[i].first);
    const std::vector<double> g = values(pf[i].second.grad()), a = values(pa[i].second.grad()), b = values(before[i]);
    bool same = true;
    for (std::size_t k = 0; k < g.size(); ++k)
      same = same && static_cast<float>(a[k]) == static_cast<float>(b[k]) + static_cast<float>(g[k]);
    CHECK(same);
  }
}

TEST_CASE("qat_mlp_loss_backward runs the composed ops where the fused kernel does not run") {
  // On the CPU, the same bits as the three calls it stands for.
  const std::vector<std::int64_t> dims{30, 16, 5};
  auto a = make_mlp(Device::cpu(), dims, 3), b = make_mlp(Device::cpu(), dims, 3);
  Generator gen(5);
  const Tensor x = randn({12, 30}, gen);
  const Tensor y = randint(0, 5, {12}, gen, TensorOptions{}.with_dtype(DType::s64));
  CHECK(nn::qat_mlp_fused_unsupported(*a, x, y).find("x") != std::string::npos);
  const Tensor la = nn::qat_mlp_loss_backward(*a, x, y);
  Tensor lb = cross_entropy(b->forward(x), y);
  lb.backward();
  CHECK(bit_equal(la, lb));
  const nn::NamedTensors pa = a->named_parameters(), pb = b->named_parameters();
  for (std::size_t i = 0; i < pa.size(); ++i) CHECK(bit_equal(pa[i].second.grad(), pb[i].second.grad()));
  // A model that is not the kernel's pattern (a ReLU first) says why.
  auto odd = std::make_shared<nn::Sequential>();
  Generator g2(1);
  odd->emplace_back<nn::ReLU>();
  odd->emplace_back<nn::Linear>(30, 5, g2);
  nn::prepare_qat(*odd, nn::default_qat_qconfig());
  CHECK(nn::qat_mlp_fused_unsupported(*odd, x, y).find("ReLU") != std::string::npos);
}

TEST_CASE("qat_mlp_loss_backward_ rejects bad arguments before writing anything (every device)") {
  for (const Device dev : test_devices()) {
    INFO(dev.str());
    const TensorOptions f32 = TensorOptions{}.with_device(dev);
    const TensorOptions s32 = TensorOptions{}.with_device(dev).with_dtype(DType::s32);
    const TensorOptions s64 = TensorOptions{}.with_device(dev).with_dtype(DType::s64);
    Generator gen(9);
    const auto quant = [&](std::int64_t c) {
      QatMlpQuant q;
      q.run_min = full({c}, INFINITY, f32);
      q.run_max = full({c}, -INFINITY, f32);
      q.scale = full({c}, 1.0, f32);
      q.zero_point = zeros({c}, s32);
      q.qmin = 0;
      q.qmax = 127;
      return q;
    };
    QatMlpLayer l;
    l.weight = randn({6, 8}, gen, f32);
    l.weight_grad = zeros({6, 8}, f32);
    l.bias = randn({6}, gen, f32);
    l.bias_grad = zeros({6}, f32);
    l.weight_quant = quant(6);
    l.weight_quant.symmetric = true;
    l.weight_quant.qmin = -128;
    l.output_quant = quant(1);
    const Tensor x = randn({4, 8}, gen, f32);
    const Tensor y = zeros({4}, s64);
    const QatMlpQuant in = quant(1);
    check_error([&] { qat_mlp_loss_backward_(x.to(DType::f64), y, in, {l}); }, "qat_mlp_loss_backward_", "x");
    if (dev.is_cuda())
      check_error([&] { qat_mlp_loss_backward_(x, y.cpu(), in, {l}); }, "qat_mlp_loss_backward_", "labels");
    check_error([&] { qat_mlp_loss_backward_(x, zeros({5}, s64), in, {l}); },
                "qat_mlp_loss_backward_", "labels");
    check_error([&] { qat_mlp_loss_backward_(x, y, in, {}); }, "qat_mlp_loss_backward_", "layers");
    QatMlpLayer wide = l;
    wide.weight = randn({6, 9}, gen, f32);
    check_error([&] { qat_mlp_loss_backward_(x, y, in, {wide}); }, "qat_mlp_loss_backward_", "weight");
    QatMlpLayer no_grad = l;
    no_grad.bias_grad = Tensor();
    check_error([&] { qat_mlp_loss_backward_(x, y, in, {no_grad}); }, "qat_mlp_loss_backward_", "bias_grad");
    QatMlpQuant bad_zp = quant(1);
    bad_zp.zero_point = zeros({1}, f32);
    check_error([&] { qat_mlp_loss_backward_(x, y, bad_zp, {l}); }, "qat_mlp_loss_backward_", "input_quant");
    if (dev.is_cpu()) {  // labels are read first on the CPU: the last layer has 6 outputs
      const Tensor bad_label = full({4}, 6.0, s64);
      check_error([&] { qat_mlp_loss_backward_(x, bad_label, in, {l}); }, "qat_mlp_loss_backward_", "labels");
    }
    // Nothing was written by any of them.
    CHECK(std::isinf(values(in.run_min)[0]));
    CHECK(std::isinf(values(l.weight_quant.run_min)[0]));
    CHECK(values(l.weight_grad)[0] == 0.0);
  }
}
