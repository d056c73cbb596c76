// matmul, linear, transpose: host references, gradcheck, CUDA vs CPU, errors.
#include "qgrad/kernels/formulas/cast.h"
#include "qgrad/kernels/linalg.h"
#include "train_ops_helpers.h"

using namespace qgrad;
using namespace qgrad::testing;

namespace {

// c[b, i, j] = sum_k op(a)[i, k] op(b)[k, j] in double.
std::vector<double> ref_gemm(const std::vector<double>& a, const std::vector<double>& b, std::int64_t batch,
                             std::int64_t m, std::int64_t n, std::int64_t k, bool trans_b) {
  std::vector<double> c(static_cast<std::size_t>(batch * m * n));
  for (std::int64_t t = 0; t < batch; ++t)
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) {
        double acc = 0;
        for (std::int64_t p = 0; p < k; ++p) {
          const double bv = trans_b ? b[static_cast<std::size_t>(t * n * k + j * k + p)]
                                    : b[static_cast<std::size_t>(t * k * n + p * n + j)];
          acc += a[static_cast<std::size_t>(t * m * k + i * k + p)] * bv;
        }
        c[static_cast<std::size_t>(t * m * n + i * n + j)] = acc;
      }
  return c;
}

double max_err(const std::vector<double>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  double m = 0;
  for (std::size_t i = 0; i < got.size(); ++i) m = std::max(m, std::fabs(got[i] - want[i]));
  return m;
}
double max_abs(const Tensor& t) {
  double m = 0;
  for (double v : values(t)) m = std::max(m, std::fabs(v));
  return m;
}
// |a - b| <= rtol * max(1, max|b|) everywhere.
void check_close(const Tensor& a, const Tensor& b, double rtol) {
  CHECK(a.shape() == b.shape());
  CHECK(a.dtype() == b.dtype());
  CHECK(max_abs_diff(a, b) <= rtol * std::max(1.0, max_abs(b)));
}

}  // namespace

// ---------------------------------------------------------------- values

TEST_CASE("matmul 2-D f64 matches a double-loop reference") {
  Tensor a = rnd({5, 7}, 1), b = rnd({7, 3}, 2);
  Tensor c = matmul(a, b);
  CHECK(c.shape() == Shape{5, 3});
  CHECK(max_err(values(c), ref_gemm(values(a), values(b), 1, 5, 3, 7, false)) < 1e-12);
}

TEST_CASE("matmul 2-D f32 matches a double-loop reference") {
  Tensor a = rnd({33, 65}, 3, DType::f32), b = rnd({65, 17}, 4, DType::f32);
  Tensor c = matmul(a, b);
  CHECK(c.dtype() == DType::f32);
  CHECK(max_err(values(c), ref_gemm(values(a), values(b), 1, 33, 17, 65, false)) < 1e-4);
}

TEST_CASE("matmul batched matches a double-loop reference") {
  Tensor a = rnd({3, 4, 6}, 5), b = rnd({3, 6, 2}, 6);
  Tensor c = matmul(a, b);
  CHECK(c.shape() == Shape{3, 4, 2});
  CHECK(max_err(values(c), ref_gemm(values(a), values(b), 3, 4, 2, 6, false)) < 1e-12);
}

TEST_CASE("matmul with an empty inner dimension gives zeros") {
  Tensor a = Tensor::empty({3, 0}, opts()), b = Tensor::empty({0, 2}, opts());
  Tensor c = matmul(a, b);
  CHECK(values(c) == std::vector<double>(6, 0.0));
  CHECK(matmul(Tensor::empty({0, 4}, opts()), rnd({4, 2}, 1)).shape() == Shape{0, 2});
}

TEST_CASE("linear with bias matches x·wᵀ + b") {
  Tensor x = rnd({2, 3, 5}, 7), w = rnd({4, 5}, 8), b = rnd({4}, 9);
  Tensor y = linear(x, w, b);
  CHECK(y.shape() == Shape{2, 3, 4});
  auto want = ref_gemm(values(x), values(w), 1, 6, 4, 5, true);
  auto bv = values(b);
  for (std::size_t i = 0; i < want.size(); ++i) want[i] += bv[i % 4];
  CHECK(max_err(values(y), want) < 1e-12);
}

TEST_CASE("linear without bias matches x·wᵀ") {
  Tensor x = rnd({6, 5}, 10, DType::f32), w = rnd({3, 5}, 11, DType::f32);
  Tensor y = linear(x, w);
  CHECK(max_err(values(y), ref_gemm(values(x), values(w), 1, 6, 3, 5, true)) < 1e-5);
}

TEST_CASE("transpose swaps two dims of a 3-D tensor") {
  Tensor x = rnd({2, 3, 4}, 12);
  Tensor y = transpose(x, 0, -1);
  CHECK(y.shape() == Shape{4, 3, 2});
  auto xv = values(x), yv = values(y);
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 4; ++k) CHECK(yv[static_cast<std::size_t>(k * 6 + j * 2 + i)] == xv[static_cast<std::size_t>(i * 12 + j * 4 + k)]);
}

TEST_CASE("transpose of integers and of a dim with itself") {
  Tensor x = arange(0, 6, 1, opts(DType::s64)).reshape({2, 3});
  CHECK(transpose(x, 0, 1).to_vector<std::int64_t>() == std::vector<std::int64_t>{0, 3, 1, 4, 2, 5});
  Tensor same = transpose(x, 1, 1);
  CHECK(same.to_vector<std::int64_t>() == x.to_vector<std::int64_t>());
  CHECK(same.data_ptr() != x.data_ptr());
}

TEST_CASE("matmul and linear in f16 and bf16 stay near the f32 result") {
  for (DType d : {DType::f16, DType::bf16}) {
    Tensor a = rnd({16, 32}, 13, DType::f32).to(d), b = rnd({32, 8}, 14, DType::f32).to(d);
    Tensor c = matmul(a, b);
    CHECK(c.dtype() == d);
    Tensor ref = matmul(a.to(DType::f32), b.to(DType::f32));
    const double tol = d == DType::f16 ? 1e-2 : 6e-2;
    CHECK(max_abs_diff(c.to(DType::f32), ref) <= tol * std::max(1.0, max_abs(ref)));
    Tensor w = rnd({8, 32}, 15, DType::f32).to(d), bias = rnd({8}, 16, DType::f32).to(d);
    Tensor y = linear(a, w, bias);
    Tensor yref = linear(a.to(DType::f32), w.to(DType::f32), bias.to(DType::f32));
    CHECK(max_abs_diff(y.to(DType::f32), yref) <= tol * std::max(1.0, max_abs(yref)));
  }
}

namespace {
// kernels::gemm for every transpose combination against a double reference
// (materialising op(a) and op(b) with transpose first), on `dev`.
void check_gemm_flags(Device dev, DType d, double tol) {
  const std::int64_t batch = 2, m = 5, n = 4, k = 3;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      Tensor a = rnd(ta ? Shape{batch, k, m} : Shape{batch, m, k}, 110 + ta, d);
      Tensor b = rnd(tb ? Shape{batch, n, k} : Shape{batch, k, n}, 120 + tb, d);
      Tensor opa = ta ? transpose(a, 1, 2) : a, opb = tb ? transpose(b, 1, 2) : b;
      auto want = ref_gemm(values(opa), values(opb), batch, m, n, k, false);
      Tensor c = Tensor::empty({batch, m, n}, opts(d, dev));
      poison(c);
      kernels::gemm(kernels::GemmShape{batch, m, n, k, ta, tb}, a.to(dev), b.to(dev), c);
      CHECK_MESSAGE(max_err(values(c), want) < tol, "trans_a ", ta, " trans_b ", tb);
      // accumulate adds onto what is there
      kernels::gemm(kernels::GemmShape{batch, m, n, k, ta, tb}, a.to(dev), b.to(dev), c, true);
      for (double& v : want) v *= 2;
      CHECK_MESSAGE(max_err(values(c), want) < 2 * tol, "accumulate, trans_a ", ta, " trans_b ", tb);
    }
}
}  // namespace

TEST_CASE("gemm kernel: all transpose flags, batched, with accumulate (CPU)") {
  check_gemm_flags(Device::cpu(), DType::f64, 1e-12);
  check_gemm_flags(Device::cpu(), DType::f32, 1e-5);
}

TEST_CASE("gemm kernel: all transpose flags, batched, with accumulate (CUDA)") {
  QGRAD_REQUIRE_GPU();
  check_gemm_flags(Device::cuda(), DType::f64, 1e-12);
  check_gemm_flags(Device::cuda(), DType::f32, 1e-5);
}

// ---------------------------------------------------------------- gradients

TEST_CASE("gradcheck matmul 2-D (both inputs)") {
  check_grad([](const std::vector<Tensor>& in) { return matmul(in[0], in[1]); },
             {param(rnd({3, 4}, 20)), param(rnd({4, 5}, 21))});
}

TEST_CASE("gradcheck matmul with only one input requiring grad") {
  Tensor b = rnd({4, 2}, 23);
  check_grad([b](const std::vector<Tensor>& in) { return matmul(in[0], b); }, {param(rnd({3, 4}, 22))});
  Tensor a = rnd({3, 4}, 24);
  check_grad([a](const std::vector<Tensor>& in) { return matmul(a, in[0]); }, {param(rnd({4, 2}, 25))});
}

TEST_CASE("gradcheck matmul batched") {
  check_grad([](const std::vector<Tensor>& in) { return matmul(in[0], in[1]); },
             {param(rnd({2, 3, 4}, 26)), param(rnd({2, 4, 3}, 27))});
}

TEST_CASE("gradcheck linear with bias (x, w, bias)") {
  check_grad([](const std::vector<Tensor>& in) { return linear(in[0], in[1], in[2]); },
             {param(rnd({4, 3}, 28)), param(rnd({5, 3}, 29)), param(rnd({5}, 30))});
}

TEST_CASE("gradcheck linear without bias and with a 3-D input") {
  check_grad([](const std::vector<Tensor>& in) { return linear(in[0], in[1]); },
             {param(rnd({2, 3, 4}, 31)), param(rnd({2, 4}, 32))});
}

TEST_CASE("gradcheck linear bias only") {
  Tensor x = rnd({3, 2}, 33), w = rnd({4, 2}, 34);
  check_grad([x, w](const std::vector<Tensor>& in) { return linear(x, w, in[0]); }, {param(rnd({4}, 35))});
}

TEST_CASE("gradcheck transpose") {
  check_grad([](const std::vector<Tensor>& in) { return transpose(in[0], 2, 0); }, {param(rnd({2, 3, 4}, 36))});
}

TEST_CASE("linear saves only the tensors its backward needs") {
  Tensor x = rnd({4, 3}, 37), w = param(rnd({2, 3}, 38));
  Tensor y = linear(x, w);
  CHECK(y.grad_fn()->saved_bytes == x.nbytes());  // x only: dW = dyᵀ·x
  Tensor x2 = param(rnd({4, 3}, 39));
  CHECK(linear(x2, rnd({2, 3}, 40)).grad_fn()->saved_bytes == 2 * 3 * 8);
}

TEST_CASE("linear_relu equals relu(linear) in value and gradient") {
  Tensor x = rnd({6, 5}, 83), w = rnd({4, 5}, 84), b = rnd({4}, 85);
  auto run = [&](bool fused) {
    Tensor px = param(x.detach().clone()), pw = param(w.detach().clone()), pb = param(b.detach().clone());
    Tensor y = fused ? linear_relu(px, pw, pb) : relu(linear(px, pw, pb));
    y.backward(ones_like(y));
    return std::vector<Tensor>{y, px.grad(), pw.grad(), pb.grad()};
  };
  auto fused = run(true), plain = run(false);
  for (std::size_t i = 0; i < 4; ++i) CHECK(bit_equal(fused[i], plain[i]));
}

TEST_CASE("CUDA: linear forks dW and db onto the side stream only where its dx GEMM leaves SMs idle") {
  // ops/linalg.cpp: a dx GEMM ([m, k]) with a 128 x 128 output tile for
  // every SM runs with dW and db on the main stream; one tile fewer forks.
  // Either way the gradients are the CPU's (f64, different summation order).
  QGRAD_REQUIRE_GPU();
  SideStream side_stream(true);
  const std::int64_t sms = cuda_multiprocessor_count(), k = 128, n = 24;
  for (const std::int64_t tiles : {sms - 1, sms}) {
    CAPTURE(tiles);
    const std::int64_t m = 128 * tiles - 5;  // the last row tile partial: still counted
    Tensor x = rnd({m, k}, 700 + static_cast<std::uint64_t>(tiles)), w = rnd({n, k}, 701), b = rnd({n}, 702);
    Tensor dy = rnd({m, n}, 703);
    auto run = [&](Device d) {
      Tensor px = param(x.to(d).clone()), pw = param(w.to(d).clone()), pb = param(b.to(d).clone());
      linear(px, pw, pb).backward(dy.to(d));
      return std::vector<Tensor>{px.grad().cpu(), pw.grad().cpu(), pb.grad().cpu()};
    };
    const std::uint64_t forks = cuda_side_stream_fork_count();
    const auto got = run(Device::cuda());
    const bool forked = cuda_side_stream_fork_count() > forks;
    CHECK(forked == (tiles < sms || cuda_side_stream_every_linear()));
    const auto want = run(Device::cpu());
    for (std::size_t i = 0; i < want.size(); ++i) {
      CAPTURE(i);
      check_close(got[i], want[i], 1e-12);
    }
  }
}

// linear_add's value is add(add(x · wᵀ, residual), bias) bit for bit (the
// residual before the bias); its gradients are those of
// add(linear(x, w, bias), residual) bit for bit (the same rule).
TEST_CASE("linear_add is ((x wᵀ) + residual) + bias, with linear + residual's gradients") {
  for (DType d : {DType::f64, DType::f32}) {
    CAPTURE(dtype_name(d));
    Tensor x = rnd({2, 6, 5}, 183, d), w = rnd({4, 5}, 184, d), b = rnd({4}, 185, d), r = rnd({2, 6, 4}, 186, d);
    for (bool with_bias : {true, false}) {
      CAPTURE(with_bias);
      auto run = [&](bool fused) {
        Tensor px = param(x.detach().clone()), pw = param(w.detach().clone()), pr = param(r.detach().clone());
        Tensor pb = with_bias ? param(b.detach().clone()) : Tensor();
        Tensor y = fused ? linear_add(px, pw, pb, pr) : add(linear(px, pw, pb), pr);
        y.backward(rnd(y.shape(), 187, d));
        return std::vector<Tensor>{y, px.grad(), pw.grad(), pr.grad(), with_bias ? pb.grad() : Tensor()};
      };
      auto fused = run(true), plain = run(false);
      Tensor formula = add(linear(x, w), r);
      if (with_bias) formula = add(formula, b);
      CHECK(bit_equal(fused[0], formula));
      CHECK(max_abs_diff(fused[0], plain[0]) <= (d == DType::f64 ? 1e-13 : 1e-5));
      for (std::size_t i = 1; i < 4; ++i) CHECK(bit_equal(fused[i], plain[i]));
      if (with_bias) CHECK(bit_equal(fused[4], plain[4]));
    }
  }
}

// On every device and in 16-bit dtypes too: the residual and the bias go in
// with one pass (CUDA: four elements an index where rows are a multiple of
// 4, one otherwise; the CPU a row at a time), the bits of the two adds; a
// bf16 GEMM past the cuBLASLt threshold (2^27 multiply-adds), whose fused
// epilogue rounds once and so fails its check, takes that pass as well.
TEST_CASE("linear_add's one pass of residual and bias gives add(add(x wᵀ, residual), bias) on every device") {
  struct Case {
    std::int64_t M, K, N;
  };
  for (const Device dev : test_devices())
    for (const DType d : {DType::f32, DType::bf16, DType::f16})
      for (const Case c : {Case{12, 5, 8}, Case{7, 6, 5}, Case{4096, 128, 256}}) {
        if (c.M == 4096 && (!dev.is_cuda() || d != DType::bf16)) continue;
        CAPTURE(dev.str());
        CAPTURE(dtype_name(d));
        CAPTURE(c.N);
        const std::uint64_t seed = 300 + static_cast<std::uint64_t>(c.N);
        const Tensor x = rnd({c.M, c.K}, seed, d).to(dev), w = rnd({c.N, c.K}, seed + 1, d).to(dev);
        const Tensor b = rnd({c.N}, seed + 2, d).to(dev), r = rnd({c.M, c.N}, seed + 3, d).to(dev);
        const Tensor want = add(add(linear(x, w), r), b);
        if (dev.is_cuda()) prepoison({c.M, c.N}, d);
        const Tensor got = linear_add(x, w, b, r);
        CHECK(bit_equal(got.cpu(), want.cpu()));
      }
}

TEST_CASE("gradcheck linear_add (x, w, bias, residual)") {
  check_grad([](const std::vector<Tensor>& in) { return linear_add(in[0], in[1], in[2], in[3]); },
             {param(rnd({4, 3}, 188)), param(rnd({5, 3}, 189)), param(rnd({5}, 190)), param(rnd({4, 5}, 191))});
}

TEST_CASE("linear_add rejects a residual of another shape, dtype or device before writing") {
  Tensor x = rnd({3, 4}, 192), w = rnd({5, 4}, 193), b = rnd({5}, 194);
  CHECK_THROWS_AS(linear_add(x, w, b, Tensor()), Error);
  CHECK_THROWS_AS(linear_add(x, w, b, rnd({5, 3}, 195)), Error);
  CHECK_THROWS_AS(linear_add(x, w, b, rnd({3, 5}, 196, DType::f32)), Error);
  try {
    linear_add(x, w, b, rnd({15}, 197));
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(std::string(e.op()) == "linear_add");
    CHECK(std::string(e.arg()) == "residual");
  }
}

TEST_CASE("linear_relu saves x, w and a bit mask") {
  Tensor x = param(rnd({6, 5}, 86)), w = param(rnd({40, 5}, 87));
  CHECK(linear_relu(x, w).grad_fn()->saved_bytes == x.nbytes() + w.nbytes() + 8 * 4);
  NoGradGuard no_grad;
  CHECK(linear_relu(x, w).grad_fn() == nullptr);
}

TEST_CASE("gradcheck linear_relu (x, w, bias)") {
  check_grad([](const std::vector<Tensor>& in) { return linear_relu(in[0], in[1], in[2]); },
             {param(rnd({4, 3}, 88)), param(rnd({5, 3}, 89)), param(rnd({5}, 90))});
}

// ---------------------------------------------------------------- errors

TEST_CASE("matmul rejects bad inputs") {
  Tensor a = rnd({3, 4}, 41), b = rnd({4, 2}, 42);
  CHECK_THROWS_AS(matmul(Tensor(), b), Error);
  CHECK_THROWS_AS(matmul(a.to(DType::s32), b), Error);           // dtype
  CHECK_THROWS_AS(matmul(a, b.to(DType::f32)), Error);           // mixed dtypes
  CHECK_THROWS_AS(matmul(a, rnd({3, 2}, 43)), Error);            // inner mismatch
  CHECK_THROWS_AS(matmul(rnd({4}, 44), b), Error);               // rank 1
  CHECK_THROWS_AS(matmul(a, rnd({2, 3, 2}, 45)), Error);         // inner mismatch, batched b
  CHECK_THROWS_AS(matmul(rnd({2, 3, 4}, 46), rnd({3, 4, 2}, 47)), Error);  // batch dims do not broadcast
  CHECK_THROWS_AS(matmul(rnd({1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, 48), rnd({1, 1}, 49)), Error);  // 8 batch dims
  // Broadcast batch dims (torch.matmul): valid now.
  CHECK(matmul(a, rnd({2, 4, 2}, 45)).shape() == Shape{2, 3, 2});
  CHECK(matmul(rnd({1, 1, 1, 1}, 48), rnd({1, 1, 1, 1}, 49)).shape() == Shape{1, 1, 1, 1});
}

TEST_CASE("linear rejects bad inputs") {
  Tensor x = rnd({3, 4}, 50), w = rnd({2, 4}, 51), b = rnd({2}, 52);
  CHECK_THROWS_AS(linear(x, rnd({2, 3}, 53), b), Error);        // K mismatch
  CHECK_THROWS_AS(linear(x, rnd({4}, 54)), Error);              // w rank
  CHECK_THROWS_AS(linear(x, w, rnd({3}, 55)), Error);           // bias shape
  CHECK_THROWS_AS(linear(x, w, rnd({1, 2}, 56)), Error);        // bias rank
  CHECK_THROWS_AS(linear(x, w, b.to(DType::f32)), Error);       // bias dtype
  CHECK_THROWS_AS(linear(x, w.to(DType::f32), b), Error);       // w dtype
  CHECK_THROWS_AS(linear(Tensor::scalar(1.0), w), Error);       // x scalar
  CHECK_THROWS_AS(linear(x.to(DType::s64), w), Error);          // integer x
}

TEST_CASE("linear_relu rejects what linear rejects") {
  Tensor x = rnd({3, 4}, 91), w = rnd({2, 4}, 92);
  CHECK_THROWS_AS(linear_relu(x, rnd({2, 3}, 93)), Error);
  CHECK_THROWS_AS(linear_relu(x, w, rnd({3}, 94)), Error);
  CHECK_THROWS_AS(linear_relu(x.to(DType::f32), w), Error);
  CHECK_THROWS_AS(linear_relu(Tensor(), w), Error);
}

TEST_CASE("transpose rejects bad dims") {
  Tensor x = rnd({2, 3}, 57);
  CHECK_THROWS_AS(transpose(x, 0, 2), Error);
  CHECK_THROWS_AS(transpose(x, -3, 0), Error);
  CHECK_THROWS_AS(transpose(Tensor::scalar(1.0), 0, 0), Error);
  CHECK_THROWS_AS(transpose(Tensor(), 0, 1), Error);
}

// ---------------------------------------------------------------- CUDA

TEST_CASE("cuda matmul f32 matches the CPU") {
  QGRAD_REQUIRE_GPU();
  Tensor a = rnd({67, 129}, 60, DType::f32), b = rnd({129, 33}, 61, DType::f32);
  Tensor ac = a.cuda(), bc = b.cuda();
  prepoison({67, 33}, DType::f32);
  Tensor c = matmul(ac, bc);
  CHECK(c.is_cuda());
  check_close(c.cpu(), matmul(a, b), 1e-5);
}

TEST_CASE("cuda matmul batched and f64 match the CPU") {
  QGRAD_REQUIRE_GPU();
  Tensor a = rnd({3, 9, 17}, 62), b = rnd({3, 17, 5}, 63);
  check_close(matmul(a.cuda(), b.cuda()).cpu(), matmul(a, b), 1e-12);
  Tensor af = a.to(DType::f32), bf = b.to(DType::f32);
  check_close(matmul(af.cuda(), bf.cuda()).cpu(), matmul(af, bf), 1e-5);
}

TEST_CASE("cuda linear with bias matches the CPU (f32, f16, bf16)") {
  QGRAD_REQUIRE_GPU();
  Tensor x = rnd({2, 31, 40}, 64, DType::f32), w = rnd({24, 40}, 65, DType::f32), b = rnd({24}, 66, DType::f32);
  check_close(linear(x.cuda(), w.cuda(), b.cuda()).cpu(), linear(x, w, b), 1e-5);
  check_close(linear(x.cuda(), w.cuda()).cpu(), linear(x, w), 1e-5);
  for (DType d : {DType::f16, DType::bf16}) {
    Tensor y = linear(x.to(d).cuda(), w.to(d).cuda(), b.to(d).cuda()).cpu().to(DType::f32);
    Tensor ref = linear(x.to(d).to(DType::f32), w.to(d).to(DType::f32), b.to(d).to(DType::f32));
    CHECK(max_abs_diff(y, ref) <= (d == DType::f16 ? 1e-2 : 6e-2) * std::max(1.0, max_abs(ref)));
  }
}

// From 2^27 multiply-adds the bias rides in cuBLASLt's epilogue where it has
// an algorithm (odd rows of 16-bit types may have none), below that fill +
// GEMM runs: every shape class against the CPU, the output poisoned
// beforehand by a NaN-filled block the caching allocator hands back; and a
// second call, after the plan's one-time tuning, bit for bit the first.
TEST_CASE("cuda linear with bias over shapes the epilogue path does and does not take") {
  QGRAD_REQUIRE_GPU();
  struct Case {
    Shape x;
    std::int64_t n;
  };
  const Case cases[] = {{{1, 64}, 32},     {{256, 784}, 256},    {{256, 256}, 10},    {{7, 17}, 9},
                        {{3, 5, 33}, 40},  {{2048, 256}, 256},   {{3, 1000, 520}, 260}, {{4099, 129}, 255},
                        {{12544, 128}, 384}};
  std::uint64_t seed = 700;
  for (const Case& c : cases) {
    CAPTURE(shape_str(c.x));
    CAPTURE(c.n);
    Tensor x = rnd(c.x, seed++, DType::f32), w = rnd({c.n, c.x.back()}, seed++, DType::f32),
           b = rnd({c.n}, seed++, DType::f32);
    for (DType d : {DType::f32, DType::bf16, DType::f16}) {
      CAPTURE(dtype_name(d));
      Shape out_shape = c.x;
      out_shape.back() = c.n;
      {
        // Poison: the next allocation of this size reuses the NaN block.
        Tensor poison = full(out_shape, std::nan(""), opts(d, Device::cuda()));
      }
      Tensor y = linear(x.to(d).cuda(), w.to(d).cuda(), b.to(d).cuda()).cpu().to(DType::f32);
      Tensor ref = linear(x.to(d).to(DType::f32), w.to(d).to(DType::f32), b.to(d).to(DType::f32));
      const double tol = d == DType::f32 ? 1e-5 : d == DType::f16 ? 1e-2 : 6e-2;
      CHECK(max_abs_diff(y, ref) <= tol * std::max(1.0, max_abs(ref)));
      // The epilogue path's first call of a shape tunes its plan (the fastest
      // split-K-free algorithm with the first one's bytes): later calls give
      // the first call's bits.
      Tensor again = linear(x.to(d).cuda(), w.to(d).cuda(), b.to(d).cuda()).cpu().to(DType::f32);
      CHECK(bit_equal(again, y));
    }
  }
}

// linear_add on CUDA: the residual add rides in cuBLASLt's GEMM (C = the
// residual) only where the plan's first call checked linear_add's bits, so
// on every shape class (below and above the epilogue path's size, f32 / bf16
// / f16) the output equals add(add(linear(x, w, 0), r), b) on the device
// (the product from the same GEMMs) and every gradient that of
// add(linear(x, w, b), r), bit for bit, first call (the plan's check) and a
// later one alike, with the output's block poisoned first; and the output
// stays near the CPU's.
TEST_CASE("cuda linear_add gives its formula's bits, linear + residual's gradients, the CPU's values") {
  QGRAD_REQUIRE_GPU();
  struct Case {
    Shape x;
    std::int64_t n;
  };
  const Case cases[] = {{{7, 17}, 9}, {{2048, 256}, 256}, {{256, 49, 128}, 128}, {{12544, 512}, 128}};
  std::uint64_t seed = 900;
  for (const Case& c : cases) {
    CAPTURE(shape_str(c.x));
    CAPTURE(c.n);
    Shape out_shape = c.x;
    out_shape.back() = c.n;
    Tensor x = rnd(c.x, seed++, DType::f32), w = rnd({c.n, c.x.back()}, seed++, DType::f32),
           b = rnd({c.n}, seed++, DType::f32), r = rnd(out_shape, seed++, DType::f32),
           dy = rnd(out_shape, seed++, DType::f32);
    for (DType d : {DType::f32, DType::bf16, DType::f16}) {
      CAPTURE(dtype_name(d));
      auto run = [&](bool fused) {
        Tensor px = param(x.to(d).cuda()), pw = param(w.to(d).cuda()), pb = param(b.to(d).cuda()),
               pr = param(r.to(d).cuda());
        {
          Tensor poison = full(out_shape, std::nan(""), opts(d, Device::cuda()));
        }
        Tensor y = fused ? linear_add(px, pw, pb, pr) : add(linear(px, pw, pb), pr);
        y.backward(dy.to(d).cuda());
        return std::vector<Tensor>{y.cpu(), px.grad().cpu(), pw.grad().cpu(), pb.grad().cpu(), pr.grad().cpu()};
      };
      const Tensor xc = x.to(d).cuda(), wc = w.to(d).cuda(), bc = b.to(d).cuda(), rc = r.to(d).cuda();
      const Tensor formula = add(add(linear(xc, wc, zeros({c.n}, opts(d, Device::cuda()))), rc), bc).cpu();
      const auto plain = run(false);
      for (int call = 0; call < 2; ++call) {
        CAPTURE(call);
        const auto fused = run(true);
        CHECK(bit_equal(fused[0], formula));
        for (std::size_t i = 1; i < fused.size(); ++i) CHECK(bit_equal(fused[i], plain[i]));
      }
      const double tol = d == DType::f32 ? 1e-5 : d == DType::f16 ? 1e-2 : 6e-2;
      Tensor ref = add(linear(x, w, b), r);
      CHECK(max_abs_diff(formula.to(DType::f32), ref.to(DType::f32)) <= tol * std::max(1.0, max_abs(ref)));
    }
  }
}

// set_matmul_allow_tf32: f32 products on CUDA on TF32 tensor cores. The CPU,
// f64 and bf16 ignore it (the same bits on and off). On CUDA every f32 path
// (linear below and above the epilogue path's size, linear_add, their
// gradients' matmuls) stays within the TF32 bound of the
// f64 reference, gives the same bits run twice, and differs from the FMA
// result somewhere (the switch reached cuBLAS); off again, the FMA bits.
TEST_CASE("matmul with TF32 allowed: f32 on CUDA within the TF32 bound, deterministic; the CPU and other dtypes unchanged") {
  struct Restore {
    bool was = matmul_allow_tf32();
    ~Restore() { set_matmul_allow_tf32(was); }
  } restore;
  set_matmul_allow_tf32(true);
  CHECK(matmul_allow_tf32());
  set_matmul_allow_tf32(false);
  CHECK_FALSE(matmul_allow_tf32());
  auto abs_of = [](const Tensor& t) {
    std::vector<double> v = values(t);
    for (double& e : v) e = std::fabs(e);
    return Tensor::from_vector(v, t.shape());
  };
  // linear (with bias and a residual where given) forward and its x, w gradients.
  auto run = [](const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& r, const Tensor& dy) {
    Tensor px = param(x.detach()), pw = param(w.detach());  // fresh leaves: gradients not accumulated across runs
    Tensor y = r.defined() ? linear_add(px, pw, b, r) : linear(px, pw, b);
    y.backward(dy);
    return std::vector<Tensor>{y.cpu(), px.grad().cpu(), pw.grad().cpu()};
  };
  struct Case {
    Shape x;
    std::int64_t n;
    bool bias, residual;
  };
  // Below 2^27 multiply-adds (fill + cublasGemmEx) and above (cuBLASLt's epilogue).
  const Case cases[] = {{{67, 129}, 33, true, false}, {{2048, 256}, 256, true, false}, {{2048, 256}, 256, true, true},
                        {{3, 40, 96}, 24, false, false}};
  std::uint64_t seed = 1200;
  for (const Case& c : cases) {
    CAPTURE(shape_str(c.x));
    Shape out_shape = c.x;
    out_shape.back() = c.n;
    const Tensor x = rnd(c.x, seed++), w = rnd({c.n, c.x.back()}, seed++), b = c.bias ? rnd({c.n}, seed++) : Tensor(),
                 r = c.residual ? rnd(out_shape, seed++) : Tensor(), dy = rnd(out_shape, seed++);
    auto on = [&](DType d, Device dev) {
      auto to = [&](const Tensor& t) { return t.defined() ? t.to(d).to(dev) : Tensor(); };
      return run(to(x), to(w), to(b), to(r), to(dy));
    };
    // The CPU and f64 ignore the switch.
    for (DType d : {DType::f32, DType::f64}) {
      set_matmul_allow_tf32(false);
      const auto off = on(d, Device::cpu());
      set_matmul_allow_tf32(true);
      const auto with = on(d, Device::cpu());
      for (std::size_t i = 0; i < off.size(); ++i) CHECK(bit_equal(with[i], off[i]));
    }
    if (!cuda_available()) continue;
    const Device gpu = Device::cuda(0);
    for (DType d : {DType::f64, DType::bf16}) {
      CAPTURE(dtype_name(d));
      set_matmul_allow_tf32(false);
      const auto off = on(d, gpu);
      set_matmul_allow_tf32(true);
      const auto with = on(d, gpu);
      for (std::size_t i = 0; i < off.size(); ++i) CHECK(bit_equal(with[i], off[i]));
    }
    set_matmul_allow_tf32(false);
    const auto fma = on(DType::f32, gpu);
    set_matmul_allow_tf32(true);
    prepoison(out_shape, DType::f32);
    const auto tf32 = on(DType::f32, gpu);
    const auto again = on(DType::f32, gpu);
    // f64 references and the magnitudes of their terms: y = x wᵀ (+ r + b), dx = dy w, dw = dyᵀ x.
    const std::int64_t k = c.x.back(), m = x.numel() / k;
    const Tensor x2 = x.reshape({m, k}), dy2 = dy.reshape({m, c.n});
    Tensor y_ref = linear(x, w, b);
    if (c.residual) y_ref = add(y_ref, r);
    const Tensor want[] = {y_ref, matmul(dy2, w), matmul(transpose(dy2, 0, 1), x2)};
    const Tensor mag[] = {linear(abs_of(x), abs_of(w)), matmul(abs_of(dy2), abs_of(w)),
                          matmul(transpose(abs_of(dy2), 0, 1), abs_of(x2))};
    bool differs = false;
    for (std::size_t i = 0; i < tf32.size(); ++i) {
      CAPTURE(i);
      CHECK(bit_equal(again[i], tf32[i]));
      const std::vector<double> got = values(tf32[i]), ref = values(want[i]), size = values(mag[i]), f = values(fma[i]);
      REQUIRE(got.size() == ref.size());
      double worst = 0;
      for (std::size_t j = 0; j < got.size(); ++j) {
        // Each operand rounded to TF32's 10 mantissa bits: <= 2^-10 of a term
        // (2^-9 if cuBLAS truncates), plus f32 accumulation and the adds.
        worst = std::max(worst, std::fabs(got[j] - ref[j]) / (size[j] * 0x1p-9 + 1e-6 * (1 + std::fabs(ref[j]))));
        differs = differs || got[j] != f[j];
      }
      INFO("worst error in units of 2^-9 of the terms' magnitude: ", worst);
      CHECK(worst <= 2.0);
    }
    CHECK(differs);
    // Off again: the FMA bits.
    set_matmul_allow_tf32(false);
    const auto back = on(DType::f32, gpu);
    for (std::size_t i = 0; i < back.size(); ++i) CHECK(bit_equal(back[i], fma[i]));
  }
  if (!cuda_available()) MESSAGE("skipping the CUDA part: no GPU");
}

// tf32x3's operand split (kernels/formulas/cast.h): big + small == a
// exactly, big a TF32 value (low 13 bits clear) within half a TF32 unit of
// a (ties away from zero), small at most 2^-11 |a|; truncated where rounding
// would overflow; non-finite values kept whole.
TEST_CASE("tf32_split: a TF32 value and an exact remainder") {
  auto bits = [](float f) { return float_to_bits(f); };
  Generator gen(1301);
  std::vector<float> xs = {1.0f, -1.0f, 0.0f, -0.0f, 1.00048828125f /* 1 + 2^-11: a tie */, 3.1415927f,
                           std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(),
                           std::numeric_limits<float>::min(), std::numeric_limits<float>::denorm_min(), 1e-40f,
                           0x1.fffffep0f, 0x1.fff000p0f};
  for (double v : values(randn({2000}, gen)))  // every binade of the normal range, and subnormals
    xs.push_back(static_cast<float>(std::ldexp(v, static_cast<int>(std::clamp(v * 60.0, -140.0, 125.0)))));
  for (float a : xs) {
    CAPTURE(a);
    float big = 0, small = 0;
    formulas::tf32_split(a, big, small);
    CHECK((bits(big) & 0x1fffu) == 0u);
    CHECK(std::isfinite(big));
    CHECK(static_cast<double>(big) + static_cast<double>(small) == static_cast<double>(a));
    const double rest = std::fabs(static_cast<double>(small)), size = std::fabs(static_cast<double>(a));
    if (size < std::numeric_limits<float>::min()) CHECK(rest <= 0x1p-137);  // subnormal: half of 2^13 units of 2^-149
    else if (size < 0x1p127) CHECK(rest <= size * 0x1p-11);
    else CHECK(rest <= size * 0x1p-10);  // truncated near the top of the range
  }
  float big = 0, small = 0;
  formulas::tf32_split(1.00048828125f, big, small);  // the tie rounds away from zero
  CHECK(big == 1.0009765625f);
  formulas::tf32_split(std::numeric_limits<float>::max(), big, small);  // would round to inf: truncated
  CHECK(bits(big) == (bits(std::numeric_limits<float>::max()) & 0xffffe000u));
  for (float a : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                  std::numeric_limits<float>::quiet_NaN()}) {
    formulas::tf32_split(a, big, small);
    CHECK(bits(big) == bits(a));
    CHECK(small == 0.0f);
  }
}

// set_float32_matmul(tf32x3): from 2^27 multiply-adds on, f32 products on
// CUDA at f32's accuracy on TF32 tensor cores. Every path (linear with and
// without bias above and below the size, linear_add, batched matmul, the
// gradients' products) is deterministic; above the size its error against
// the f64 product is within a few times the ieee path's and far below
// TF32's, and its bits differ from ieee's somewhere (the path ran); below
// the size it gives the ieee bits. The CPU and f64 ignore the setting.
TEST_CASE("matmul with tf32x3: f32's accuracy on CUDA from 2^27 multiply-adds, the ieee bits below; the CPU unchanged") {
  struct Restore {
    Float32Matmul was = float32_matmul();
    ~Restore() { set_float32_matmul(was); }
  } restore;
  set_float32_matmul(Float32Matmul::tf32x3);
  CHECK(float32_matmul() == Float32Matmul::tf32x3);
  CHECK_FALSE(matmul_allow_tf32());
  set_matmul_allow_tf32(true);
  CHECK(float32_matmul() == Float32Matmul::tf32);
  set_matmul_allow_tf32(false);
  CHECK(float32_matmul() == Float32Matmul::ieee);
  auto abs_of = [](const Tensor& t) {
    std::vector<double> v = values(t);
    for (double& e : v) e = std::fabs(e);
    return Tensor::from_vector(v, t.shape());
  };
  // The forward (linear / linear_add, or matmul when w is rank 3) and both gradients.
  auto run = [](const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& r, const Tensor& dy) {
    Tensor px = param(x.detach()), pw = param(w.detach());
    Tensor y = w.dim() == 3 ? matmul(px, pw) : r.defined() ? linear_add(px, pw, b, r) : linear(px, pw, b);
    y.backward(dy);
    return std::vector<Tensor>{y.cpu(), px.grad().cpu(), pw.grad().cpu()};
  };
  struct Case {
    Shape x, w;
    bool bias, residual, large;  // large: every product >= 2^27 multiply-adds
  };
  const Case cases[] = {{{2048, 256}, {512, 256}, true, false, true},
                        {{2048, 256}, {512, 256}, false, false, true},
                        {{2048, 256}, {512, 256}, true, true, true},
                        {{4, 512, 256}, {4, 256, 512}, false, false, true},
                        {{1000, 300}, {500, 300}, true, false, true},  // partial 32 x 32 tiles of the transposing split
                        {{1000, 301}, {500, 301}, true, false, true},  // k % 4 != 0: the split's one-element path
                        {{256, 784}, {256, 784}, true, false, false}};
  std::uint64_t seed = 1310;
  for (const Case& c : cases) {
    CAPTURE(shape_str(c.x));
    CAPTURE(shape_str(c.w));
    const bool batched = c.w.size() == 3;
    Shape out_shape = c.x;
    out_shape.back() = batched ? c.w.back() : c.w.front();
    const Tensor x = rnd(c.x, seed++), w = rnd(c.w, seed++), b = c.bias ? rnd({c.w.front()}, seed++) : Tensor(),
                 r = c.residual ? rnd(out_shape, seed++) : Tensor(), dy = rnd(out_shape, seed++);
    auto on = [&](Float32Matmul math, DType d, Device dev) {
      set_float32_matmul(math);
      auto to = [&](const Tensor& t) { return t.defined() ? t.to(d).to(dev) : Tensor(); };
      return run(to(x), to(w), to(b), to(r), to(dy));
    };
    if (!c.large) {  // the CPU and f64 ignore the setting (once: the large shapes take long on the host)
      for (DType d : {DType::f32, DType::f64}) {
        const auto off = on(Float32Matmul::ieee, d, Device::cpu());
        const auto with = on(Float32Matmul::tf32x3, d, Device::cpu());
        for (std::size_t i = 0; i < off.size(); ++i) CHECK(bit_equal(with[i], off[i]));
      }
    }
    if (!cuda_available()) continue;
    const Device gpu = Device::cuda(0);
    const auto ieee = on(Float32Matmul::ieee, DType::f32, gpu);
    prepoison(out_shape, DType::f32);
    const auto x3 = on(Float32Matmul::tf32x3, DType::f32, gpu);
    const auto again = on(Float32Matmul::tf32x3, DType::f32, gpu);
    for (std::size_t i = 0; i < x3.size(); ++i) CHECK(bit_equal(again[i], x3[i]));
    if (!c.large) {
      for (std::size_t i = 0; i < x3.size(); ++i) CHECK(bit_equal(x3[i], ieee[i]));
      continue;
    }
    const auto tf32 = on(Float32Matmul::tf32, DType::f32, gpu);
    // f64 references and the magnitudes of their terms.
    std::vector<Tensor> want, mag;
    if (batched) {
      const Tensor wt = transpose(w, 1, 2), dyt = transpose(dy, 1, 2), xt = transpose(x, 1, 2);
      want = {matmul(x, w), matmul(dy, wt), matmul(xt, dy)};
      mag = {matmul(abs_of(x), abs_of(w)), matmul(abs_of(dy), abs_of(wt)), matmul(abs_of(xt), abs_of(dy))};
    } else {
      Tensor y_ref = linear(x, w, b);
      if (c.residual) y_ref = add(y_ref, r);
      want = {y_ref, matmul(dy, w), matmul(transpose(dy, 0, 1), x)};
      mag = {linear(abs_of(x), abs_of(w)), matmul(abs_of(dy), abs_of(w)),
             matmul(transpose(abs_of(dy), 0, 1), abs_of(x))};
    }
    // Worst |error| in units of 2^-24 of the terms' magnitude (plus the output's own rounding).
    auto worst = [&](const std::vector<Tensor>& got, std::size_t i) {
      const std::vector<double> g = values(got[i]), ref = values(want[i]), size = values(mag[i]);
      REQUIRE(g.size() == ref.size());
      double e = 0;
      for (std::size_t j = 0; j < g.size(); ++j)
        e = std::max(e, std::fabs(g[j] - ref[j]) / ((size[j] + std::fabs(ref[j])) * 0x1p-24 + 1e-30));
      return e;
    };
    bool differs = false;
    for (std::size_t i = 0; i < x3.size(); ++i) {
      CAPTURE(i);
      const double e_ieee = worst(ieee, i), e_x3 = worst(x3, i), e_tf32 = worst(tf32, i);
      MESSAGE("worst error (2^-24 of the terms' magnitude), output ", i, ": ieee ", e_ieee, ", tf32x3 ", e_x3,
              ", tf32 ", e_tf32);
      CHECK(e_x3 <= std::max(4.0 * e_ieee, 16.0));
      CHECK(e_x3 * 16.0 <= e_tf32);
      const std::vector<double> a = values(x3[i]), f = values(ieee[i]);
      for (std::size_t j = 0; j < a.size(); ++j) differs = differs || a[j] != f[j];
    }
    CHECK(differs);
  }
  if (!cuda_available()) MESSAGE("skipping the CUDA part: no GPU");
}

TEST_CASE("cuda matmul with an empty inner dimension gives zeros") {
  QGRAD_REQUIRE_GPU();
  Tensor c = matmul(Tensor::empty({3, 0}, opts(DType::f32, Device::cuda())),
                    Tensor::empty({0, 2}, opts(DType::f32, Device::cuda())));
  CHECK(values(c) == std::vector<double>(6, 0.0));
}

TEST_CASE("cuda transpose is bit-identical to the CPU") {
  QGRAD_REQUIRE_GPU();
  for (DType d : {DType::f32, DType::f16, DType::f64}) {
    Tensor x = rnd({5, 7, 3}, 67, DType::f32).to(d);
    CHECK(bit_equal(transpose(x.cuda(), 0, 2), transpose(x, 0, 2)));
    CHECK(bit_equal(transpose(x.cuda(), -1, 1), transpose(x, -1, 1)));
  }
}

TEST_CASE("cuda backward of matmul and linear matches the CPU") {
  QGRAD_REQUIRE_GPU();
  Tensor x = rnd({8, 6}, 68, DType::f32), w = rnd({4, 6}, 69, DType::f32), b = rnd({4}, 70, DType::f32);
  auto grads = [](Tensor xx, Tensor ww, Tensor bb) {
    xx = param(xx.detach());
    ww = param(ww.detach());
    bb = param(bb.detach());
    Tensor y = matmul(linear(xx, ww, bb), ww);
    y.backward(ones_like(y));
    return std::vector<Tensor>{xx.grad().cpu(), ww.grad().cpu(), bb.grad().cpu()};
  };
  auto gc = grads(x.cuda(), w.cuda(), b.cuda()), gh = grads(x, w, b);
  for (int i = 0; i < 3; ++i) check_close(gc[static_cast<std::size_t>(i)], gh[static_cast<std::size_t>(i)], 1e-5);
}

TEST_CASE("cuda gradcheck matmul") {
  QGRAD_REQUIRE_GPU();
  check_grad([](const std::vector<Tensor>& in) { return matmul(in[0], in[1]); },
             {param(rnd({3, 4}, 71).cuda()), param(rnd({4, 5}, 72).cuda())});
  check_grad([](const std::vector<Tensor>& in) { return matmul(in[0], in[1]); },
             {param(rnd({2, 3, 4}, 73).cuda()), param(rnd({2, 4, 2}, 74).cuda())});
}

TEST_CASE("cuda gradcheck linear") {
  QGRAD_REQUIRE_GPU();
  check_grad([](const std::vector<Tensor>& in) { return linear(in[0], in[1], in[2]); },
             {param(rnd({4, 3}, 75).cuda()), param(rnd({5, 3}, 76).cuda()), param(rnd({5}, 77).cuda())});
}

TEST_CASE("cuda linear_relu matches relu(linear) on the device and the CPU") {
  QGRAD_REQUIRE_GPU();
  Tensor x = rnd({37, 20}, 95, DType::f32), w = rnd({30, 20}, 96, DType::f32), b = rnd({30}, 97, DType::f32);
  Tensor xc = x.cuda(), wc = w.cuda(), bc = b.cuda();
  CHECK(bit_equal(linear_relu(xc, wc, bc), relu(linear(xc, wc, bc))));
  check_close(linear_relu(xc, wc, bc).cpu(), linear_relu(x, w, b), 1e-5);
  check_grad([](const std::vector<Tensor>& in) { return linear_relu(in[0], in[1], in[2]); },
             {param(rnd({4, 3}, 98).cuda()), param(rnd({5, 3}, 99).cuda()), param(rnd({5}, 100).cuda())});
}

TEST_CASE("cuda gradcheck transpose") {
  QGRAD_REQUIRE_GPU();
  check_grad([](const std::vector<Tensor>& in) { return transpose(in[0], 0, 1); }, {param(rnd({3, 4}, 78).cuda())});
}

TEST_CASE("matmul and linear reject mixed devices") {
  QGRAD_REQUIRE_GPU();
  Tensor a = rnd({3, 4}, 79), b = rnd({4, 2}, 80);
  CHECK_THROWS_AS(matmul(a.cuda(), b), Error);
  CHECK_THROWS_AS(linear(a, b.cuda()), Error);
  CHECK_THROWS_AS(linear(a, rnd({2, 4}, 81), rnd({2}, 82).cuda()), Error);
}
