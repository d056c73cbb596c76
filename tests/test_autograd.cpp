// The tape: recording, accumulation, retain_graph, grad mode, gradcheck.
#include "helpers.h"
#include "qgrad/kernels/bitmask.h"
#include "qgrad/kernels/deferred.h"

using namespace qgrad;
using namespace qgrad::testing;

namespace {
Tensor leaf(std::vector<double> v, Shape s) {
  Tensor t = Tensor::from_vector(v, s);
  t.set_requires_grad(true);
  return t;
}
}  // namespace

TEST_CASE("a tensor used twice accumulates both contributions") {
  Tensor x = leaf({2.0, -3.0}, {2});
  Tensor y = mul(x, x);  // dy/dx = 2x
  Tensor z = add(y, x);  // + 1
  z.backward(ones({2}, TensorOptions{}.with_dtype(DType::f64)));
  CHECK(x.grad().to_vector<double>() == std::vector<double>{5.0, -5.0});
}

TEST_CASE("gradients accumulate across backward calls until zero_grad") {
  Tensor x = leaf({1.5}, {1});
  mul(x, 2.0).backward();
  mul(x, 2.0).backward();
  CHECK(x.grad().to_vector<double>()[0] == 4.0);
  x.zero_grad();
  CHECK(!x.grad().defined());
}

TEST_CASE("a second backward through a freed graph is a clear error") {
  Tensor x = leaf({1.0, 2.0}, {2});
  Tensor y = mul(x, x);
  Tensor s = mul(y, 3.0);
  Tensor g = ones({2}, TensorOptions{}.with_dtype(DType::f64));
  s.backward(g);
  CHECK_THROWS_WITH_AS(s.backward(g), doctest::Contains("retain_graph"), Error);
  Tensor x2 = leaf({1.0}, {1});
  Tensor y2 = mul(x2, x2);
  y2.backward(Tensor(), true);
  y2.backward();
  CHECK(x2.grad().to_vector<double>()[0] == 4.0);
}

TEST_CASE("NoGradGuard and detach record nothing") {
  Tensor x = leaf({1.0}, {1});
  {
    NoGradGuard guard;
    Tensor y = mul(x, x);
    CHECK(!y.requires_grad());
    CHECK(y.grad_fn() == nullptr);
  }
  Tensor d = x.detach();
  CHECK(!d.requires_grad());
  CHECK(d.data_ptr() == x.data_ptr());
  CHECK(!mul(d, d).requires_grad());
  Tensor z = mul(d, d);
  CHECK_THROWS_AS(z.backward(), Error);  // nothing to differentiate
}

TEST_CASE("broadcasting ops reduce gradients to each input's shape") {
  Tensor a = leaf({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = leaf({10, 20, 30}, {3});
  Tensor c = mul(add(a, b), b);
  c.backward(ones({2, 3}, TensorOptions{}.with_dtype(DType::f64)));
  CHECK(a.grad().to_vector<double>() == std::vector<double>{10, 20, 30, 10, 20, 30});
  // d/db (a+b)*b = a + 2b, summed over rows
  CHECK(b.grad().to_vector<double>() == std::vector<double>{1 + 4 + 40, 2 + 5 + 80, 3 + 6 + 120});
}

TEST_CASE("deep graphs need no recursion") {
  Tensor x = leaf({1.0}, {1});
  Tensor y = x;
  for (int i = 0; i < 200000; ++i) y = add(y, 0.0);
  y.backward();
  CHECK(x.grad().to_vector<double>()[0] == 1.0);
}

TEST_CASE("gradcheck passes for arithmetic and reports a wrong backward") {
  Generator g(3);
  Tensor a = randn({3, 4}, g, TensorOptions{}.with_dtype(DType::f64));
  Tensor b = rand({4}, g, TensorOptions{}.with_dtype(DType::f64), 0.5, 2.0);
  a.set_requires_grad(true);
  b.set_requires_grad(true);
  auto fn = [](const std::vector<Tensor>& in) { return div(mul(add(in[0], in[1]), in[0]), sub(in[1], in[0] * 0.1)); };
  auto r = gradcheck(fn, {a, b});
  CHECK_MESSAGE(r.ok, r.message);
  GradcheckOptions fast;
  fast.fast_mode = true;
  auto rf = gradcheck(fn, {a, b}, fast);
  CHECK_MESSAGE(rf.ok, rf.message);
  CHECK(!a.grad().defined());  // the caller's tensors are untouched

  // A deliberately wrong backward rule must fail.
  auto wrong = [](const std::vector<Tensor>& in) {
    Tensor out = in[0].detach().clone();
    if (any_requires_grad({in[0]}))
      record("wrong", out, {in[0]}, [](const Tensor& gy) { return std::vector<Tensor>{mul(gy, 2.0)}; });
    return out;
  };
  auto rw = gradcheck(wrong, {a});
  CHECK(!rw.ok);
  CHECK(rw.max_abs_error == doctest::Approx(1.0));
  CHECK(!gradcheck(wrong, {a}, fast).ok);
}

namespace {
// What a folding rule was offered, over its calls.
struct Offers {
  int calls = 0;
  bool first = false, second = false;
};

// out = a + b, recorded with a folding rule that folds input 0's pending
// gradient where offered (pending + g, the engine's add) and, with `lie`,
// claims a fold of input 1 as well.
Tensor probe(const Tensor& a, const Tensor& b, std::shared_ptr<Offers> seen, bool lie = false) {
  Tensor out;
  {
    NoGradGuard no_grad;
    out = add(a, b);
  }
  record_folding("probe", out, {a, b},
                 [seen, lie](const Tensor& g, const std::vector<Tensor>& pending, std::vector<char>& folded) {
                   ++seen->calls;
                   seen->first = !pending.empty() && pending[0].defined();
                   seen->second = pending.size() > 1 && pending[1].defined();
                   Tensor g0 = g;
                   if (seen->first) {
                     g0 = add(pending[0], g);
                     folded[0] = 1;
                   }
                   if (lie && folded.size() > 1) folded[1] = 1;
                   return std::vector<Tensor>{g0, g};
                 });
  return out;
}
}  // namespace

TEST_CASE("folding rules: offered a non-leaf input's pending gradient, never a leaf's; the sum is unchanged") {
  for (const bool fold : {true, false}) {
    CAPTURE(fold);
    set_gradient_folding(fold);
    Tensor x = leaf({1.5, -2.0}, {2});
    Tensor h = mul(x, 3.0);
    auto seen = std::make_shared<Offers>();
    // z = h + (h + x): the residual add passes h its gradient before probe runs.
    const std::uint64_t before = folded_gradient_count();
    add(h, probe(h, x, seen)).backward(ones({2}, TensorOptions{}.with_dtype(DType::f64)));
    set_gradient_folding(true);
    CHECK(seen->calls == 1);
    CHECK(seen->first == fold);
    CHECK_FALSE(seen->second);  // x is a leaf
    CHECK(folded_gradient_count() - before == (fold ? 1u : 0u));
    CHECK(x.grad().to_vector<double>() == std::vector<double>{7.0, 7.0});  // dz/dx = 3 + 3 + 1
  }
}

TEST_CASE("folding rules: no offer where one producer feeds two inputs; a fold without an offer is an error") {
  Tensor x = leaf({0.5}, {1});
  Tensor h = mul(x, 2.0);
  auto seen = std::make_shared<Offers>();
  add(h, probe(h, h, seen)).backward();  // h twice: a fold of either would count the other's share
  CHECK(seen->calls == 1);
  CHECK_FALSE(seen->first);
  CHECK_FALSE(seen->second);
  CHECK(x.grad().to_vector<double>()[0] == 6.0);  // z = h + 2h = 6x

  Tensor y = leaf({0.5}, {1});
  Tensor k = mul(y, 2.0), m = mul(y, 4.0);
  auto liar = std::make_shared<Offers>();
  CHECK_THROWS_AS(add(k, probe(k, m, liar, true)).backward(), Error);  // m has no pending gradient
}

namespace {
// out = x, recorded with a rule that queues its gradient's mask pass
// (dx = g * bit) on the engine's deferred passes whatever x is: what lets
// this test reach every place the engine must run the queue.
Tensor deferring_probe(const Tensor& x, const Tensor& mask) {
  Tensor out;
  {
    NoGradGuard no_grad;
    out = mul(x, 1.0);
  }
  record("deferring_probe", out, {x}, [mask](const Tensor& g) {
    Tensor dx = Tensor::empty(g.shape(), TensorOptions{}.with_dtype(g.dtype()).with_device(g.device()));
    kernels::masked_gradient(g, mask, dx, deferred_gradient_passes());
    return std::vector<Tensor>{dx};
  });
  return out;
}

// The mask of n elements with bit i = (i % 3 != 0), and g * bit on the host.
Tensor probe_mask(std::int64_t n) {
  std::vector<std::uint32_t> words(static_cast<std::size_t>(bitmask_words(n)), 0u);
  for (std::int64_t i = 0; i < n; ++i) bitmask_set(words.data(), i, i % 3 != 0);
  return Tensor::from_vector(std::vector<std::int32_t>(words.begin(), words.end()),
                             {static_cast<std::int64_t>(words.size())});
}
std::vector<double> masked(const std::vector<double>& g, double times = 1.0) {
  std::vector<double> out(g.size());
  for (std::size_t i = 0; i < g.size(); ++i) out[i] = i % 3 != 0 ? times * g[i] : 0.0;
  return out;
}
}  // namespace

TEST_CASE("deferred gradient passes: run before any reader (another rule, an add, a hook) and at the end; "
          "the same values on or off") {
  const std::int64_t n = 300;
  const Tensor mask = probe_mask(n);
  Generator gen(7);
  const Tensor g = randn({n}, gen, TensorOptions{}.with_dtype(DType::f64));
  const std::vector<double> gv = g.to_vector<double>(), want = masked(gv), want2 = masked(gv, 2.0);
  auto fresh_leaf = [&] { return leaf(std::vector<double>(static_cast<std::size_t>(n), 0.25), {n}); };
  for (const bool on : {true, false}) {
    CAPTURE(on);
    set_gradient_deferral(on);
    const std::uint64_t deferred = on ? 1u : 0u;
    {  // a leaf with no gradient yet: queued, run at the end of the pass
      Tensor x = fresh_leaf();
      const std::uint64_t before = deferred_gradient_pass_count();
      deferring_probe(x, mask).backward(g);
      CHECK(deferred_gradient_pass_count() - before == deferred);
      CHECK(x.grad().to_vector<double>() == want);
    }
    {  // bound for another node: run before that node's rule reads it
      Tensor x = fresh_leaf();
      Tensor h = mul(x, 2.0);
      const std::uint64_t before = deferred_gradient_pass_count();
      deferring_probe(h, mask).backward(g);
      CHECK(deferred_gradient_pass_count() - before == deferred);
      CHECK(x.grad().to_vector<double>() == want2);
    }
    {  // one leaf reached twice: the second arrival's add reads the first
      Tensor x = fresh_leaf();
      const std::uint64_t before = deferred_gradient_pass_count();
      add(deferring_probe(x, mask), deferring_probe(x, mask)).backward(g);
      CHECK(deferred_gradient_pass_count() - before == 2 * deferred);
      CHECK(x.grad().to_vector<double>() == want2);
    }
    {  // a gradient already there from an earlier backward: the add reads the new one
      Tensor x = fresh_leaf();
      deferring_probe(x, mask).backward(g);
      deferring_probe(x, mask).backward(g);
      CHECK(x.grad().to_vector<double>() == want2);
    }
    {  // a post-accumulate hook reads the leaf's gradient: run before it
      Tensor x = fresh_leaf();
      std::vector<double> seen;
      add_post_accumulate_grad_hook(x, [&] { seen = x.grad().to_vector<double>(); });
      Tensor y = leaf(std::vector<double>(static_cast<std::size_t>(n), 0.5), {n});
      add(deferring_probe(x, mask), deferring_probe(y, mask)).backward(g);
      CHECK(seen == want);
      CHECK(y.grad().to_vector<double>() == want);
    }
  }
  set_gradient_deferral(true);
  // Outside a backward no queue is current.
  CHECK(deferred_gradient_passes() == nullptr);
}
