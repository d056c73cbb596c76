// relu and the bit-packed mask: references, gradcheck, CUDA vs CPU, errors.
#include <cmath>
#include <cstring>

#include "train_ops_helpers.h"
#include "qgrad/kernels/bitmask.h"

using namespace qgrad;
using namespace qgrad::testing;

namespace {

// relu's gradient for upstream g: the mask applied to g.
Tensor relu_grad(const Tensor& x, const Tensor& g) {
  Tensor xl = param(x.detach());
  relu(xl).backward(g);
  return xl.grad();
}

}  // namespace

// ---------------------------------------------------------------- bitmask

TEST_CASE("bitmask_words rounds up to 128-element blocks of 4 words") {
  CHECK(bitmask_words(0) == 0);
  CHECK(bitmask_words(1) == 4);
  CHECK(bitmask_words(128) == 4);
  CHECK(bitmask_words(129) == 8);
  CHECK(bitmask_words(1000) == 32);
}

TEST_CASE("bitmask set, get and pack agree, in the documented layout (element 128b + 4l + k: bit l of word 4b + k)") {
  const std::int64_t n = 300;
  std::vector<std::uint32_t> words(static_cast<std::size_t>(bitmask_words(n)), 0);
  for (std::int64_t i = 0; i < n; ++i) bitmask_set(words.data(), i, i % 3 == 0);
  for (std::int64_t i = 0; i < n; ++i) CHECK(bitmask_get(words.data(), i) == (i % 3 == 0));
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t b = i / 128, l = (i % 128) / 4, k = i % 4;
    CHECK(((words[static_cast<std::size_t>(4 * b + k)] >> l) & 1u) == (i % 3 == 0 ? 1u : 0u));
  }
  bitmask_set(words.data(), 3, false);
  CHECK(!bitmask_get(words.data(), 3));
  CHECK(bitmask_get(words.data(), 6));
  for (std::int64_t w = 0; w < bitmask_words(n); ++w) {
    const std::uint32_t packed = bitmask_pack_word(w, n, [](std::int64_t i) { return i % 3 == 0 && i != 3; });
    CHECK(packed == words[static_cast<std::size_t>(w)]);
  }
  // Block 2 holds elements 256..299: word 8 + k has bits l < 11 (4l + k < 44).
  CHECK(bitmask_pack_word(8, n, [](std::int64_t) { return true; }) == 0x7ffu);  // bits past n stay 0
  CHECK(bitmask_pack_word(11, n, [](std::int64_t) { return true; }) == 0x7ffu);
}

// ---------------------------------------------------------------- values

TEST_CASE("relu matches max(x, 0)") {
  Tensor x = rnd({7, 13}, 1, DType::f32);
  auto xv = values(x), yv = values(relu(x));
  for (std::size_t i = 0; i < xv.size(); ++i) CHECK(yv[i] == std::max(xv[i], 0.0));
}

TEST_CASE("relu propagates NaN and maps -0 and 0 to 0") {
  Tensor x = Tensor::from_vector<float>({NAN, -0.0f, 0.0f, -1.0f, 2.0f}, {5});
  auto y = relu(x).to_vector<float>();
  CHECK(std::isnan(y[0]));
  CHECK(y[1] == 0.0f);
  CHECK(y[2] == 0.0f);
  CHECK(y[3] == 0.0f);
  CHECK(y[4] == 2.0f);
}

TEST_CASE("relu in f16 and bf16 is exact") {
  for (DType d : {DType::f16, DType::bf16}) {
    Tensor x = rnd({100}, 2, DType::f32).to(d);
    CHECK(bit_equal(relu(x).to(DType::f32), relu(x.to(DType::f32))));
  }
}

TEST_CASE("relu backward passes the gradient where x > 0 (sizes around a word)") {
  for (std::int64_t n : {1, 31, 32, 33, 77, 1000}) {
    Tensor x = rnd({n}, static_cast<std::uint64_t>(n));
    Tensor g = rnd({n}, 1000 + static_cast<std::uint64_t>(n));
    auto dx = values(relu_grad(x, g)), xv = values(x), gv = values(g);
    for (std::size_t i = 0; i < xv.size(); ++i) CHECK(dx[i] == (xv[i] > 0 ? gv[i] : 0.0));
  }
}

// The CPU's f32 backward runs a mask block four lanes at a time: against the
// per-element rule bit for bit (+0 where the mask is clear, the gradient's
// own bits, -0 and NaN among them, where it is set), in whole blocks, a tail,
// and past the parallel grain.
TEST_CASE("relu backward in f32: the gradient's bits where x > 0, +0 elsewhere (blocks, tails, threads)") {
  for (std::int64_t n : {128, 300, 70001}) {
    CAPTURE(n);
    std::vector<float> x = rnd({n}, 7 + static_cast<std::uint64_t>(n)).to(DType::f32).to_vector<float>();
    std::vector<float> g = rnd({n}, 8 + static_cast<std::uint64_t>(n)).to(DType::f32).to_vector<float>();
    for (std::int64_t i = 0; i < n; i += 37) g[static_cast<std::size_t>(i)] = -0.0f;
    for (std::int64_t i = 5; i < n; i += 101) g[static_cast<std::size_t>(i)] = std::nanf("");
    const Tensor xt = Tensor::from_vector(x, {n}), gt = Tensor::from_vector(g, {n});
    const std::vector<float> dx = relu_grad(xt, gt).to_vector<float>();
    int wrong = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      const float want = x[i] > 0 ? g[i] : 0.0f;
      wrong += std::memcmp(&dx[i], &want, sizeof(float)) != 0;
    }
    CHECK(wrong == 0);
  }
}

TEST_CASE("relu saves one bit per element") {
  Tensor x = param(rnd({100}, 3, DType::f32));
  Tensor y = relu(x);
  CHECK(y.grad_fn()->saved_bytes == 4 * 4);  // 4 words of 32 bits
}

TEST_CASE("relu of an empty tensor") {
  Tensor x = param(Tensor::empty({0, 3}, opts()));
  Tensor y = relu(x);
  CHECK(y.shape() == Shape{0, 3});
}

TEST_CASE("gradcheck relu") {
  Tensor x = rnd({5, 6}, 4);
  for (double v : values(x)) REQUIRE(std::fabs(v) > 1e-4);  // away from the kink
  check_grad([](const std::vector<Tensor>& in) { return relu(in[0]); }, {param(x)});
}

TEST_CASE("relu rejects bad inputs") {
  CHECK_THROWS_AS(relu(Tensor()), Error);
  CHECK_THROWS_AS(relu(arange(0, 4, 1, opts(DType::s32))), Error);
  CHECK_THROWS_AS(relu(Tensor::empty({2}, opts(DType::u8))), Error);
}

// ---------------------------------------------------------------- CUDA

TEST_CASE("cuda relu is bit-identical to the CPU") {
  QGRAD_REQUIRE_GPU();
  for (DType d : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    Tensor x = rnd({1003}, 10, DType::f32).to(d);
    Tensor xc = x.cuda();
    prepoison({1003}, d);
    CHECK(bit_equal(relu(xc), relu(x)));
  }
}

TEST_CASE("cuda relu mask and backward are bit-identical to the CPU") {
  QGRAD_REQUIRE_GPU();
  // Sizes around the 128-element mask block and the kernel's 4-block unroll.
  for (DType d : {DType::f32, DType::f64, DType::f16, DType::bf16})
    for (std::int64_t n : {1, 31, 32, 33, 127, 128, 129, 511, 513, 1000, 100003}) {
      CAPTURE(n);
      Tensor x = rnd({n}, 11 + static_cast<std::uint64_t>(n), DType::f32).to(d);
      Tensor g = rnd({n}, 12 + static_cast<std::uint64_t>(n), DType::f32).to(d);
      Tensor xc = x.cuda(), gc = g.cuda();
      prepoison({n}, d);
      CHECK(bit_equal(relu_grad(xc, gc), relu_grad(x, g)));
    }
}

TEST_CASE("cuda gradcheck relu") {
  QGRAD_REQUIRE_GPU();
  Tensor x = rnd({5, 7}, 13);
  for (double v : values(x)) REQUIRE(std::fabs(v) > 1e-4);
  check_grad([](const std::vector<Tensor>& in) { return relu(in[0]); }, {param(x.cuda())});
}
