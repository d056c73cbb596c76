// log_softmax and cross_entropy: references, gradcheck, CUDA vs CPU, errors,
// and a tiny MLP whose loss must fall.
#include "qgrad/kernels/reduce.h"
#include "qgrad/kernels/softmax.h"
#include "train_ops_helpers.h"

using namespace qgrad;
using namespace qgrad::testing;

namespace {

Tensor labels_for(std::int64_t b, std::int64_t c, std::uint64_t seed, DType d = DType::s64) {
  Generator g(seed);
  return randint(0, c, {b}, g, opts(d));
}

// log_softmax of each row of a [rows, n] matrix, in double (logsumexp with max).
std::vector<double> ref_log_softmax(const std::vector<double>& x, std::size_t rows, std::size_t n) {
  std::vector<double> y(x.size());
  for (std::size_t r = 0; r < rows; ++r) {
    double mx = -INFINITY, s = 0;
    for (std::size_t c = 0; c < n; ++c) mx = std::max(mx, x[r * n + c]);
    for (std::size_t c = 0; c < n; ++c) s += std::exp(x[r * n + c] - mx);
    for (std::size_t c = 0; c < n; ++c) y[r * n + c] = x[r * n + c] - mx - std::log(s);
  }
  return y;
}

// The loss value and the gradient (on the host) of loss_fn(scores, labels).
template <class LossFn>
std::pair<double, Tensor> loss_and_grad(LossFn loss_fn, const Tensor& scores, const Tensor& labels) {
  Tensor p = param(scores.detach());
  Tensor loss = loss_fn(p, labels);
  loss.backward();
  return {loss.item(), p.grad().cpu()};
}
Tensor log_softmax_grad(const Tensor& x, const Tensor& g) {
  Tensor p = param(x.detach());
  log_softmax(p).backward(g);
  return p.grad().cpu();
}
auto ce = [](const Tensor& l, const Tensor& y) { return cross_entropy(l, y); };
auto nll = [](const Tensor& l, const Tensor& y) { return nll_loss(l, y); };

double ref_cross_entropy(const Tensor& logits, const Tensor& labels) {
  const auto b = static_cast<std::size_t>(logits.size(0)), c = static_cast<std::size_t>(logits.size(1));
  auto ls = ref_log_softmax(values(logits), b, c);
  auto lab = values(labels);
  double acc = 0;
  for (std::size_t i = 0; i < b; ++i) acc -= ls[i * c + static_cast<std::size_t>(lab[i])];
  return acc / static_cast<double>(b);
}

}  // namespace

// ---------------------------------------------------------------- log_softmax

TEST_CASE("log_softmax over the last axis matches a double reference") {
  Tensor x = rnd({6, 9}, 1, DType::f32, 3.0);
  check_near(values(log_softmax(x)), ref_log_softmax(values(x), 6, 9), 1e-5);
}

TEST_CASE("log_softmax over a middle axis matches the transposed reference") {
  Tensor x = rnd({3, 5, 4}, 2);
  Tensor y = log_softmax(x, 1);
  Tensor yt = transpose(log_softmax(transpose(x, 1, 2), -1), 1, 2);
  check_near(values(y), values(yt), 1e-12);
}

TEST_CASE("log_softmax is stable for large logits") {
  Tensor x = Tensor::from_vector<float>({1000.f, 1001.f, 1002.f, -1000.f, -1001.f, -1002.f}, {2, 3});
  auto y = values(log_softmax(x));
  auto want = ref_log_softmax({1000, 1001, 1002, -1000, -1001, -1002}, 2, 3);
  check_near(y, want, 1e-5);
}

TEST_CASE("log_softmax in f16 and bf16 stays near f32") {
  Tensor x = rnd({4, 10}, 3, DType::f32);
  for (DType d : {DType::f16, DType::bf16}) {
    Tensor y = log_softmax(x.to(d));
    CHECK(y.dtype() == d);
    CHECK(max_abs_diff(y.to(DType::f32), log_softmax(x.to(d).to(DType::f32))) < (d == DType::f16 ? 1e-2 : 5e-2));
  }
}

TEST_CASE("gradcheck log_softmax (last axis, axis 0, middle axis)") {
  for (int axis : {-1, 0, 1})
    check_grad([axis](const std::vector<Tensor>& in) { return log_softmax(in[0], axis); }, {param(rnd({3, 4, 2}, 4))});
}

TEST_CASE("log_softmax saves its output") {
  Tensor x = param(rnd({3, 4}, 5));
  CHECK(log_softmax(x).grad_fn()->saved_bytes == 12 * 8);
}

TEST_CASE("log_softmax rejects bad inputs") {
  CHECK_THROWS_AS(log_softmax(Tensor()), Error);
  CHECK_THROWS_AS(log_softmax(arange(0, 3, 1, opts(DType::s64))), Error);
  CHECK_THROWS_AS(log_softmax(rnd({2, 3}, 6), 2), Error);
  CHECK_THROWS_AS(log_softmax(Tensor::scalar(1.0)), Error);
}

// ---------------------------------------------------------------- cross_entropy

TEST_CASE("cross_entropy with s64 labels matches a double reference") {
  Tensor logits = rnd({8, 5}, 10, DType::f32, 2.0);
  Tensor labels = labels_for(8, 5, 11);
  Tensor loss = cross_entropy(logits, labels);
  CHECK(loss.shape() == Shape{});
  CHECK(loss.dtype() == DType::f32);
  CHECK(loss.item() == doctest::Approx(ref_cross_entropy(logits, labels)).epsilon(1e-5));
}

TEST_CASE("cross_entropy with s32 labels equals s64 labels") {
  Tensor logits = rnd({8, 5}, 12);
  Tensor labels = labels_for(8, 5, 13);
  CHECK(cross_entropy(logits, labels).item() == cross_entropy(logits, labels.to(DType::s32)).item());
  CHECK(cross_entropy(logits, labels).item() == doctest::Approx(ref_cross_entropy(logits, labels)).epsilon(1e-12));
}

TEST_CASE("cross_entropy equals -mean of log_softmax at the labels") {
  Tensor logits = rnd({4, 3}, 14);
  Tensor labels = Tensor::from_vector<std::int64_t>({0, 2, 1, 2}, {4});
  auto ls = values(log_softmax(logits));
  const double want = -(ls[0] + ls[5] + ls[7] + ls[11]) / 4;
  CHECK(cross_entropy(logits, labels).item() == doctest::Approx(want).epsilon(1e-12));
}

TEST_CASE("cross_entropy backward is (softmax - onehot) / B") {
  Tensor logits = param(rnd({3, 4}, 15));
  Tensor labels = Tensor::from_vector<std::int64_t>({3, 0, 1}, {3});
  cross_entropy(logits, labels).backward();
  auto g = values(logits.grad());
  auto ls = values(log_softmax(logits.detach()));
  const std::vector<int> lab{3, 0, 1};
  for (std::size_t b = 0; b < 3; ++b)
    for (std::size_t c = 0; c < 4; ++c)
      CHECK(g[b * 4 + c] ==
            doctest::Approx((std::exp(ls[b * 4 + c]) - (static_cast<int>(c) == lab[b] ? 1.0 : 0.0)) / 3).epsilon(1e-12));
}

TEST_CASE("cross_entropy in f16 and bf16 stays near f32") {
  Tensor logits = rnd({16, 10}, 16, DType::f32);
  Tensor labels = labels_for(16, 10, 17);
  for (DType d : {DType::f16, DType::bf16}) {
    Tensor l = cross_entropy(logits.to(d), labels);
    CHECK(l.dtype() == d);
    CHECK(l.item() == doctest::Approx(cross_entropy(logits.to(d).to(DType::f32), labels).item()).epsilon(2e-2));
  }
}

TEST_CASE("gradcheck cross_entropy (s64 labels)") {
  Tensor labels = labels_for(5, 4, 18);
  check_grad([labels](const std::vector<Tensor>& in) { return cross_entropy(in[0], labels); }, {param(rnd({5, 4}, 19))});
}

TEST_CASE("gradcheck cross_entropy (s32 labels) composed with a scale") {
  Tensor labels = labels_for(3, 6, 20, DType::s32);
  check_grad([labels](const std::vector<Tensor>& in) { return mul(cross_entropy(in[0], labels), 3.0); },
             {param(rnd({3, 6}, 21))});
}

TEST_CASE("cross_entropy saves the probabilities and the labels") {
  Tensor logits = param(rnd({4, 3}, 22, DType::f32));
  Tensor labels = labels_for(4, 3, 23);
  CHECK(cross_entropy(logits, labels).grad_fn()->saved_bytes == 4 * 3 * 4 + 4 * 8);
}

TEST_CASE("cross_entropy rejects out-of-range labels on the CPU") {
  Tensor logits = rnd({3, 4}, 24);
  CHECK_THROWS_AS(cross_entropy(logits, Tensor::from_vector<std::int64_t>({0, 4, 1}, {3})), Error);
  CHECK_THROWS_AS(cross_entropy(logits, Tensor::from_vector<std::int32_t>({0, -1, 1}, {3})), Error);
}

TEST_CASE("cross_entropy rejects bad inputs") {
  Tensor logits = rnd({3, 4}, 25);
  Tensor labels = labels_for(3, 4, 26);
  CHECK_THROWS_AS(cross_entropy(Tensor(), labels), Error);
  CHECK_THROWS_AS(cross_entropy(logits, Tensor()), Error);
  CHECK_THROWS_AS(cross_entropy(logits, labels.to(DType::f32)), Error);   // label dtype
  CHECK_THROWS_AS(cross_entropy(logits, labels.to(DType::u8)), Error);
  CHECK_THROWS_AS(cross_entropy(logits.to(DType::s32), labels), Error);   // logits dtype
  CHECK_THROWS_AS(cross_entropy(rnd({12}, 27), labels), Error);           // logits rank
  CHECK_THROWS_AS(cross_entropy(logits, labels_for(2, 4, 28)), Error);    // batch mismatch
  CHECK_THROWS_AS(cross_entropy(logits, labels.reshape({3, 1})), Error);  // labels rank
  CHECK_THROWS_AS(cross_entropy(Tensor::empty({0, 4}, opts()), Tensor::empty({0}, opts(DType::s64))), Error);
  CHECK_THROWS_AS(cross_entropy(Tensor::empty({3, 0}, opts()), labels), Error);
}

// ---------------------------------------------------------------- nll_loss

TEST_CASE("nll_loss of log_softmax equals cross_entropy") {
  Tensor logits = rnd({7, 5}, 60);
  Tensor labels = labels_for(7, 5, 61);
  CHECK(nll_loss(log_softmax(logits), labels).item() ==
        doctest::Approx(cross_entropy(logits, labels).item()).epsilon(1e-12));
}

TEST_CASE("nll_loss matches -mean of the picked entries (s32 labels)") {
  Tensor logp = rnd({4, 3}, 62, DType::f32);
  Tensor labels = Tensor::from_vector<std::int32_t>({2, 0, 0, 1}, {4});
  auto v = values(logp);
  CHECK(nll_loss(logp, labels).item() == doctest::Approx(-(v[2] + v[3] + v[6] + v[10]) / 4).epsilon(1e-6));
}

TEST_CASE("nll_loss backward puts -g/B at the labels") {
  Tensor logp = param(rnd({2, 3}, 63));
  Tensor labels = Tensor::from_vector<std::int64_t>({1, 2}, {2});
  mul(nll_loss(logp, labels), 4.0).backward();
  CHECK(values(logp.grad()) == std::vector<double>{0, -2, 0, 0, 0, -2});
}

TEST_CASE("gradcheck nll_loss") {
  Tensor labels = labels_for(4, 5, 64);
  check_grad([labels](const std::vector<Tensor>& in) { return nll_loss(in[0], labels); }, {param(rnd({4, 5}, 65))});
}

TEST_CASE("gradcheck nll_loss of log_softmax") {
  Tensor labels = labels_for(3, 4, 66, DType::s32);
  check_grad([labels](const std::vector<Tensor>& in) { return nll_loss(log_softmax(in[0]), labels); },
             {param(rnd({3, 4}, 67))});
}

TEST_CASE("nll_loss rejects bad inputs") {
  Tensor logp = rnd({3, 4}, 68);
  Tensor labels = labels_for(3, 4, 69);
  CHECK_THROWS_AS(nll_loss(logp, labels.to(DType::f64)), Error);
  CHECK_THROWS_AS(nll_loss(logp, Tensor::from_vector<std::int64_t>({0, 1, 4}, {3})), Error);
  CHECK_THROWS_AS(nll_loss(rnd({3}, 70), labels), Error);
  CHECK_THROWS_AS(nll_loss(logp, labels_for(4, 4, 71)), Error);
  CHECK_THROWS_AS(nll_loss(logp.to(DType::s64), labels), Error);
}

// ---------------------------------------------------------------- training

TEST_CASE("a tiny MLP trained with SGD lowers its loss") {
  Generator g(30);
  Tensor x = randn({64, 4}, g, opts(DType::f32));
  // Labels from a fixed rule: the sign pattern of two coordinates.
  auto xv = x.to_vector<float>();
  std::vector<std::int64_t> lab(64);
  for (std::size_t i = 0; i < 64; ++i) lab[i] = (xv[i * 4] > 0 ? 1 : 0) + (xv[i * 4 + 1] > 0 ? 2 : 0);
  Tensor y = Tensor::from_vector(lab, {64});
  Tensor w1 = param(randn({16, 4}, g, opts(DType::f32), 0.0, 0.5));
  Tensor b1 = param(zeros({16}, opts(DType::f32)));
  Tensor w2 = param(randn({4, 16}, g, opts(DType::f32), 0.0, 0.25));
  Tensor b2 = param(zeros({4}, opts(DType::f32)));
  std::vector<Tensor> params{w1, b1, w2, b2};
  double first = 0, last = 0;
  for (int step = 0; step < 60; ++step) {
    Tensor loss = cross_entropy(linear(relu(linear(x, w1, b1)), w2, b2), y);
    if (step == 0) first = loss.item();
    last = loss.item();
    loss.backward();
    NoGradGuard no_grad;
    for (Tensor& p : params) {
      p.copy_(sub(p, mul(p.grad(), 0.5)));
      p.zero_grad();
    }
  }
  CHECK(last < 0.6 * first);
  Tensor pred = argmax(linear(relu(linear(x, w1, b1)), w2, b2), 1);
  int correct = 0;
  auto pv = pred.to_vector<std::int64_t>();
  for (std::size_t i = 0; i < 64; ++i) correct += pv[i] == lab[i];
  CHECK(correct > 48);
}

// ---------------------------------------------------------------- CUDA

TEST_CASE("cuda log_softmax and its backward match the CPU") {
  QGRAD_REQUIRE_GPU();
  Tensor x = rnd({33, 10}, 40, DType::f32, 3.0);
  Tensor xc = x.cuda();
  prepoison({33, 10}, DType::f32);
  CHECK(max_abs_diff(log_softmax(xc), log_softmax(x)) < 1e-5);
  CHECK(max_abs_diff(log_softmax(xc, 0), log_softmax(x, 0)) < 1e-5);
  Tensor g = rnd({33, 10}, 41, DType::f32);
  CHECK(max_abs_diff(log_softmax_grad(xc, g.cuda()), log_softmax_grad(x, g)) < 1e-5);
}

TEST_CASE("cuda cross_entropy loss and gradient match the CPU") {
  QGRAD_REQUIRE_GPU();
  Tensor logits = rnd({100, 7}, 42, DType::f32, 2.0);
  for (DType ld : {DType::s64, DType::s32}) {
    Tensor labels = labels_for(100, 7, 43, ld);
    auto [lc, gc] = loss_and_grad(ce, logits.cuda(), labels.cuda());
    auto [lh, gh] = loss_and_grad(ce, logits, labels);
    CHECK(lc == doctest::Approx(lh).epsilon(1e-5));
    CHECK(max_abs_diff(gc, gh) < 1e-6);
  }
}

// B <= 256 short rows take one launch for the rows and their mean
// (kernels::cross_entropy_mean); it must give the bits of the two-launch path
// (the rows, then sum_axis's mean) on either side of the mean's order switch
// at kSumThreadPerRowMax = 128 rows, and B = 257 takes the two launches.
TEST_CASE("cuda cross_entropy in one launch gives the bits of its rows and their mean") {
  QGRAD_REQUIRE_GPU();
  for (DType d : {DType::f32, DType::f64, DType::bf16}) {
    for (std::int64_t b : {1, 7, 128, 129, 200, 256, 257}) {
      CAPTURE(dtype_name(d));
      CAPTURE(b);
      const Tensor logits = rnd({b, 10}, 60 + static_cast<std::uint64_t>(b), DType::f32, 3.0).to(d).cuda();
      const Tensor labels = labels_for(b, 10, 61, b % 2 == 0 ? DType::s64 : DType::s32).cuda();
      const DType math = d == DType::f64 ? DType::f64 : DType::f32;
      // The two-launch path, by hand: the rows (and the softmax), then sum_axis's mean.
      const Tensor rows = Tensor::empty({b}, opts(math, Device::cuda()));
      const Tensor probs = Tensor::empty({b, 10}, opts(d, Device::cuda()));
      const Tensor mean = Tensor::empty({}, opts(math, Device::cuda()));
      kernels::cross_entropy_forward(logits, labels, probs, rows);
      kernels::sum_axis(rows, mean, kernels::AxisLayout{1, b, 1}, true);
      const Tensor dref = Tensor::empty({b, 10}, opts(d, Device::cuda()));
      kernels::cross_entropy_backward(probs, labels, ones({}, opts(d, Device::cuda())), dref);
      prepoison({}, math);
      prepoison({b, 10}, d);
      Tensor p = param(logits.detach());
      const Tensor loss = cross_entropy(p, labels);
      CHECK(bit_equal(loss, mean.to(d)));
      loss.backward();  // dlogits from the saved softmax: the same bits only if the softmax is
      CHECK(bit_equal(p.grad(), dref));
      CHECK(bit_equal(cross_entropy(logits, labels), mean.to(d)));  // no softmax saved
    }
  }
}

TEST_CASE("cuda log_softmax over wide rows (one warp per row) matches the CPU") {
  QGRAD_REQUIRE_GPU();
  for (std::int64_t n : {33, 1000}) {
    Tensor x = rnd({20, n}, 52, DType::f32, 3.0);
    Tensor xc = x.cuda();
    prepoison({20, n}, DType::f32);
    CHECK(max_abs_diff(log_softmax(xc), log_softmax(x)) < 1e-5);
    Tensor g = rnd({20, n}, 53, DType::f32);
    CHECK(max_abs_diff(log_softmax_grad(xc, g.cuda()), log_softmax_grad(x, g)) < 1e-4);
  }
}

TEST_CASE("cuda cross_entropy over wide rows (one warp per row) matches the CPU") {
  QGRAD_REQUIRE_GPU();
  Tensor logits = rnd({64, 1000}, 54, DType::f32, 2.0);
  Tensor labels = labels_for(64, 1000, 55);
  auto [lc, gc] = loss_and_grad(ce, logits.cuda(), labels.cuda());
  auto [lh, gh] = loss_and_grad(ce, logits, labels);
  CHECK(lc == doctest::Approx(lh).epsilon(1e-5));
  CHECK(max_abs_diff(gc, gh) < 1e-7);
  CHECK(cross_entropy(logits.to(DType::bf16).cuda(), labels.cuda()).item() ==
        doctest::Approx(cross_entropy(logits.to(DType::bf16), labels).item()).epsilon(1e-2));
  Tensor bad = labels.clone();
  bad.copy_(Tensor::from_vector(std::vector<std::int64_t>(64, 1000), {64}));
  CHECK(std::isnan(cross_entropy(logits.cuda(), bad.cuda()).item()));
}

TEST_CASE("cuda gradcheck log_softmax and cross_entropy over wide rows") {
  QGRAD_REQUIRE_GPU();
  check_grad([](const std::vector<Tensor>& in) { return log_softmax(in[0]); }, {param(rnd({2, 40}, 56).cuda())});
  Tensor labels = labels_for(3, 40, 57).cuda();
  check_grad([labels](const std::vector<Tensor>& in) { return cross_entropy(in[0], labels); },
             {param(rnd({3, 40}, 58).cuda())});
}

TEST_CASE("cuda cross_entropy with an out-of-range label gives NaN, not a crash") {
  QGRAD_REQUIRE_GPU();
  Tensor logits = param(rnd({3, 4}, 44).cuda());
  Tensor labels = Tensor::from_vector<std::int64_t>({0, 7, 1}, {3}).cuda();
  Tensor loss = cross_entropy(logits, labels);
  CHECK(std::isnan(loss.item()));
  loss.backward();
  auto g = values(logits.grad());
  CHECK(std::isnan(g[4]));   // the bad row
  CHECK(!std::isnan(g[0]));  // the good rows
  cuda_synchronize();
}

TEST_CASE("cuda cross_entropy in f16 and bf16 stays near the CPU") {
  QGRAD_REQUIRE_GPU();
  Tensor logits = rnd({16, 10}, 45, DType::f32);
  Tensor labels = labels_for(16, 10, 46);
  for (DType d : {DType::f16, DType::bf16}) {
    CHECK(cross_entropy(logits.to(d).cuda(), labels.cuda()).item() ==
          doctest::Approx(cross_entropy(logits.to(d), labels).item()).epsilon(1e-2));
  }
}

TEST_CASE("cuda nll_loss and its gradient match the CPU") {
  QGRAD_REQUIRE_GPU();
  Tensor logp = rnd({50, 6}, 72, DType::f32);
  Tensor labels = labels_for(50, 6, 73);
  auto [lc, gc] = loss_and_grad(nll, logp.cuda(), labels.cuda());
  auto [lh, gh] = loss_and_grad(nll, logp, labels);
  CHECK(lc == doctest::Approx(lh).epsilon(1e-6));
  CHECK(bit_equal(gc, gh));
  Tensor bad = Tensor::from_vector<std::int64_t>({0, -3}, {2}).cuda();
  CHECK(std::isnan(nll_loss(rnd({2, 6}, 74).cuda(), bad).item()));
  check_grad([lab = labels_for(4, 5, 75).cuda()](const std::vector<Tensor>& in) { return nll_loss(in[0], lab); },
             {param(rnd({4, 5}, 76).cuda())});
}

TEST_CASE("cuda gradcheck log_softmax") {
  QGRAD_REQUIRE_GPU();
  check_grad([](const std::vector<Tensor>& in) { return log_softmax(in[0], 1); }, {param(rnd({3, 4, 2}, 47).cuda())});
}

TEST_CASE("cuda gradcheck cross_entropy") {
  QGRAD_REQUIRE_GPU();
  Tensor labels = labels_for(5, 4, 48).cuda();
  check_grad([labels](const std::vector<Tensor>& in) { return cross_entropy(in[0], labels); },
             {param(rnd({5, 4}, 49).cuda())});
}

TEST_CASE("cross_entropy and log_softmax reject mixed devices") {
  QGRAD_REQUIRE_GPU();
  Tensor logits = rnd({3, 4}, 50);
  Tensor labels = labels_for(3, 4, 51);
  CHECK_THROWS_AS(cross_entropy(logits.cuda(), labels), Error);
  CHECK_THROWS_AS(cross_entropy(logits, labels.cuda()), Error);
}
