// Integer (s8 / u8) pooling: max_pool2d (exact, with indices), avg_pool2d
// and adaptive_avg_pool2d with PyTorch's quantized rounding, against host
// references (the exact window maximum; the documented float formula, and
// the exact f64 mean within half a step), edge values (exact halves, the ends
// of the range), wrong dtypes, CPU/CUDA identity. PyTorch parity itself:
// tests/test_qconv_golden.cpp.
#include <algorithm>
#include <cmath>

#include "helpers.h"

using namespace qgrad;
using namespace qgrad::testing;

namespace {

Tensor ints(const Shape& shape, DType dt, std::uint64_t seed) {
  Generator g(seed);
  return dt == DType::s8 ? randint(-128, 128, shape, g, TensorOptions{}.with_dtype(dt))
                         : randint(0, 256, shape, g, TensorOptions{}.with_dtype(dt));
}

struct Win {
  std::int64_t h0, h1, w0, w1, div;
};

// avg_pool2d's window (PyTorch's cpu_avg_pool / avg_pool2d_out_frame).
Win avg_win(std::int64_t oh, std::int64_t ow, std::int64_t H, std::int64_t W, Size2 k, Size2 s, Size2 p, bool cip) {
  std::int64_t h0 = oh * s.h - p.h, w0 = ow * s.w - p.w;
  std::int64_t h1 = std::min(h0 + k.h, H + p.h), w1 = std::min(w0 + k.w, W + p.w);
  const std::int64_t padded = (h1 - h0) * (w1 - w0);
  h0 = std::max<std::int64_t>(h0, 0), w0 = std::max<std::int64_t>(w0, 0);
  h1 = std::min(h1, H), w1 = std::min(w1, W);
  return {h0, h1, w0, w1, cip ? padded : (h1 - h0) * (w1 - w0)};
}

double clamp_to(DType dt, double v) { return dt == DType::s8 ? std::clamp(v, -128.0, 127.0) : std::clamp(v, 0.0, 255.0); }

void check_average(const Tensor& x, const Tensor& y, const std::function<Win(std::int64_t, std::int64_t)>& window,
                   bool adaptive) {
  const auto xv = values(x), yv = values(y);
  const std::int64_t planes = x.size(0) * x.size(1), H = x.size(2), W = x.size(3), OH = y.size(2), OW = y.size(3);
  bool formula = true, near = true;
  for (std::int64_t pl = 0; pl < planes; ++pl)
    for (std::int64_t oh = 0; oh < OH; ++oh)
      for (std::int64_t ow = 0; ow < OW; ++ow) {
        const Win w = window(oh, ow);
        std::int64_t sum = 0;
        for (std::int64_t h = w.h0; h < w.h1; ++h)
          for (std::int64_t c = w.w0; c < w.w1; ++c) sum += static_cast<std::int64_t>(xv[static_cast<std::size_t>((pl * H + h) * W + c)]);
        const float m = adaptive ? (1.0f / static_cast<float>(w.h1 - w.h0)) / static_cast<float>(w.w1 - w.w0)
                                 : static_cast<float>(1.0 / static_cast<double>(w.div));
        const float prod = static_cast<float>(sum) * m;
        const double want = clamp_to(x.dtype(), std::nearbyint(prod));
        const double got = yv[static_cast<std::size_t>((pl * OH + oh) * OW + ow)];
        formula = formula && got == want;
        const double mean = static_cast<double>(sum) / static_cast<double>(w.div);
        near = near && std::fabs(got - clamp_to(x.dtype(), mean)) <= 0.5 + 1e-6;
      }
  CHECK(formula);
  CHECK(near);
}

}  // namespace

TEST_CASE("int8 max_pool2d: exact maxima and first-index ties, every geometry") {
  for (DType dt : {DType::s8, DType::u8}) {
    const Tensor x = ints({2, 3, 9, 10}, dt, 1);
    const Tensor few = full({1, 2, 6, 7}, 3.0, TensorOptions{}.with_dtype(dt));  // ties everywhere
    for (const Tensor& in : {x, few}) {
      for (auto [k, s, p, d, ceil] : {std::tuple<Size2, Size2, Size2, Size2, bool>{3, 2, 1, 1, true},
                                      {2, 2, 0, 1, false}, {{3, 2}, {1, 3}, {1, 0}, 2, false}}) {
        const MaxPool2dResult r = max_pool2d_with_indices(in, k, s, p, d, ceil);
        const MaxPool2dResult f = max_pool2d_with_indices(in.to(DType::f64), k, s, p, d, ceil);  // values exact in f64
        CHECK(r.output.dtype() == dt);
        CHECK(values(r.output) == values(f.output));
        CHECK(values(r.indices) == values(f.indices));
        CHECK(bit_equal(max_pool2d(in, k, s, p, d, ceil), r.output));
      }
    }
  }
}

TEST_CASE("int8 avg_pool2d: PyTorch's quantized rounding, within half a step of the exact mean") {
  for (DType dt : {DType::s8, DType::u8}) {
    const Tensor x = ints({2, 3, 11, 9}, dt, 3);
    for (auto row : {std::tuple<Size2, Size2, Size2, bool, bool>{3, 2, 1, true, true},
                                      {3, 2, 1, true, false}, {2, 2, 0, false, true}, {{2, 3}, {1, 2}, {1, 0}, false, false},
                                      {{3, 2}, {2, 1}, {1, 1}, true, false}, {5, 3, 2, true, true}}) {
      const auto& k = std::get<0>(row);
      const auto& s = std::get<1>(row);
      const auto& p = std::get<2>(row);
      const auto& ceil = std::get<3>(row);
      const auto& cip = std::get<4>(row);
      INFO(dtype_name(dt), " k ", k.h, "x", k.w, " s ", s.h, "x", s.w, " p ", p.h, "x", p.w, " ceil ", ceil, " cip ", cip);
      const Tensor y = avg_pool2d(x, k, s, p, ceil, cip);
      CHECK(y.dtype() == dt);
      CHECK(y.shape() == avg_pool2d(x.to(DType::f32), k, s, p, ceil, cip).shape());
      check_average(x, y, [&](std::int64_t oh, std::int64_t ow) { return avg_win(oh, ow, 11, 9, k, s, p, cip); }, false);
    }
  }
}

TEST_CASE("int8 adaptive_avg_pool2d: uneven windows, upsampling, global") {
  for (DType dt : {DType::s8, DType::u8}) {
    const Tensor x = ints({2, 3, 7, 9}, dt, 4);
    for (Size2 o : {Size2{3, 4}, Size2{1, 1}, Size2{5, 11}, Size2{7, 9}, Size2{2, 2}}) {
      const Tensor y = adaptive_avg_pool2d(x, o);
      CHECK(y.dtype() == dt);
      check_average(x, y, [&](std::int64_t oh, std::int64_t ow) {
        const std::int64_t h0 = oh * 7 / o.h, h1 = ((oh + 1) * 7 + o.h - 1) / o.h;
        const std::int64_t w0 = ow * 9 / o.w, w1 = ((ow + 1) * 9 + o.w - 1) / o.w;
        return Win{h0, h1, w0, w1, (h1 - h0) * (w1 - w0)};
      }, true);
    }
  }
}

TEST_CASE("int8 averages: exact halves round to even and the ends of the range stay in range") {
  // 2 x 2 windows of sums 2 (mod 4): means k + 0.5.
  const Tensor h = Tensor::from_vector(std::vector<double>{1, 1, 3, 3, 0, 0, 2, 2, 2, 3, 5, 6, 0, 0, 0, 0}, {1, 1, 4, 4});
  for (DType dt : {DType::s8, DType::u8}) {
    const auto y = values(avg_pool2d(h.to(dt), 2));
    // windows: {1,1,0,0} = 0.5 -> 0; {3,3,2,2} = 2.5 -> 2; {2,3,0,0} = 1.25 -> 1; {5,6,0,0} = 2.75 -> 3
    CHECK(y == std::vector<double>{0, 2, 1, 3});
  }
  const Tensor neg = Tensor::from_vector(std::vector<double>{-1, -2, 0, 0}, {1, 1, 2, 2}).to(DType::s8);
  CHECK(values(avg_pool2d(neg, 2)) == std::vector<double>{-1});  // -0.75 -> -1
  const Tensor odd = Tensor::from_vector(std::vector<double>{-1, -2, 0, -1}, {1, 1, 2, 2}).to(DType::s8);
  CHECK(values(avg_pool2d(odd, 2)) == std::vector<double>{-1});  // -1.0
  const Tensor half = Tensor::from_vector(std::vector<double>{-1, -1, -1, 1}, {1, 1, 2, 2}).to(DType::s8);
  CHECK(values(avg_pool2d(half, 2)) == std::vector<double>{-0.0});  // -0.5 -> -0 -> 0
  for (DType dt : {DType::s8, DType::u8}) {
    const double top = dt == DType::s8 ? 127 : 255, bottom = dt == DType::s8 ? -128 : 0;
    for (double v : {top, bottom}) {
      const Tensor x = full({1, 2, 7, 9}, v, TensorOptions{}.with_dtype(dt));
      for (const Tensor& y : {adaptive_avg_pool2d(x, {3, 4}), adaptive_avg_pool2d(x, 1), avg_pool2d(x, 3, Size2{2}, 1, true, false)}) {
        const auto yv = values(y);
        CHECK(std::all_of(yv.begin(), yv.end(), [&](double e) { return e == v; }));
      }
    }
  }
}

TEST_CASE("int8 pooling rejects other integer dtypes, naming the op and x") {
  for (DType dt : {DType::s32, DType::s64, DType::boolean}) {
    const Tensor x = zeros({1, 1, 4, 4}).to(dt);
    CHECK_THROWS_WITH_AS(max_pool2d(x, 2), doctest::Contains("max_pool2d: argument 'x'"), Error);
    CHECK_THROWS_WITH_AS(avg_pool2d(x, 2), doctest::Contains("avg_pool2d: argument 'x'"), Error);
    CHECK_THROWS_WITH_AS(adaptive_avg_pool2d(x, 1), doctest::Contains("adaptive_avg_pool2d: argument 'x'"), Error);
  }
}

TEST_CASE("int8 pooling on CUDA matches the CPU bit for bit") {
  QGRAD_REQUIRE_GPU();
  for (DType dt : {DType::s8, DType::u8}) {
    const Tensor x = ints({3, 4, 13, 12}, dt, 9), xg = x.cuda();
    const MaxPool2dResult a = max_pool2d_with_indices(x, 3, Size2{2}, 1, 1, true),
                          b = max_pool2d_with_indices(xg, 3, Size2{2}, 1, 1, true);
    CHECK(bit_equal(a.output, b.output));
    CHECK(bit_equal(a.indices, b.indices));
    CHECK(bit_equal(avg_pool2d(x, 3, Size2{2}, 1, true, false), avg_pool2d(xg, 3, Size2{2}, 1, true, false)));
    CHECK(bit_equal(avg_pool2d(x, 2), avg_pool2d(xg, 2)));
    for (Size2 o : {Size2{1, 1}, Size2{5, 7}, Size2{20, 20}})
      CHECK(bit_equal(adaptive_avg_pool2d(x, o), adaptive_avg_pool2d(xg, o)));
  }
}
