// Parity of the int8 convolution and the int8 poolings with PyTorch 2.11's
// quantized CPU kernels: golden data from
// tests/python/gen_qconv_golden.py (its docstring states what is recorded),
// checked on the CPU and, with a GPU present, on CUDA.
//   pooling (s8 / u8, zero point 0): max_pool2d, avg_pool2d and
//     adaptive_avg_pool2d equal torch's int_repr bit for bit;
//   quantized_conv2d: the f32 output equals bit for bit the f32 epilogue of
//     the exact integer convolution of torch's quantized activation (a_q) —
//     qgrad's quantization and zero-point padding are torch's; it is within
//     1e-5 relative of torch's float64 convolution of the dequantized
//     operands; requantized with torch's output qparams it is within 1 LSB of
//     torch.ops.quantized.conv2d (x86 engine for reduce_range activations,
//     QNNPACK for full-range ones, where x86 saturates; each requantizes with
//     its own float multiplier), and the 1-LSB differences are counted.
#include <algorithm>
#include <array>
#include <cstring>
#include <fstream>

#include "golden.h"
#include "helpers.h"

using namespace qgrad;
using namespace qgrad::testing;
using json = nlohmann::json;

namespace {

const char* kGoldenPath = QGRAD_SOURCE_DIR "/tests/data/golden_qconv.json";

#define REQUIRE_GOLDEN(doc) QGRAD_REQUIRE_GOLDEN(doc, kGoldenPath, "gen_qconv_golden.py")

Shape shape_of(const json& j) { return golden_shape(j); }

std::vector<std::int64_t> ints_of(const json& j) { return j.get<std::vector<std::int64_t>>(); }

template <class Bits, class T>
std::vector<T> from_hex(const json& arr) {
  std::vector<T> v;
  for (const auto& e : arr) {
    const Bits b = static_cast<Bits>(std::stoull(e.get<std::string>(), nullptr, 16));
    T t;
    std::memcpy(&t, &b, sizeof t);
    v.push_back(t);
  }
  return v;
}

Tensor int_tensor(const std::vector<std::int64_t>& v, const Shape& shape, DType dt) {
  std::vector<double> d(v.begin(), v.end());
  return Tensor::from_vector(d, shape).to(dt);
}

std::vector<std::int64_t> ints(const Tensor& t) {
  std::vector<std::int64_t> r;
  for (double v : values(t)) r.push_back(static_cast<std::int64_t>(v));
  return r;
}

}  // namespace

TEST_CASE("int8 pooling equals PyTorch's quantized max / avg / adaptive avg pooling bit for bit") {
  REQUIRE_GOLDEN(doc);
  std::size_t checked = 0;
  for (const Device dev : test_devices()) {
    for (const auto& c : doc["pool"]) {
      const DType dt = c["dtype"] == "u8" ? DType::u8 : DType::s8;
      const Tensor x = int_tensor(ints_of(c["x"]), shape_of(c["shape"]), dt).to(dev);
      for (const auto& op : c["ops"]) {
        const std::string kind = op["op"];
        INFO(dev.str(), " ", dtype_name(dt), " ", shape_str(x.shape()), " ", op.dump().substr(0, 80));
        Tensor y;
        if (kind == "avg") {
          const auto k = ints_of(op["k"]), s = ints_of(op["s"]), p = ints_of(op["p"]);
          y = avg_pool2d(x, {k[0], k[1]}, Size2{s[0], s[1]}, {p[0], p[1]}, op["ceil"].get<bool>(),
                         op["cip"].get<bool>());
        } else if (kind == "adaptive") {
          const auto o = ints_of(op["out"]);
          y = adaptive_avg_pool2d(x, {o[0], o[1]});
        } else {
          const auto k = ints_of(op["k"]), s = ints_of(op["s"]), p = ints_of(op["p"]), d = ints_of(op["d"]);
          y = max_pool2d(x, {k[0], k[1]}, Size2{s[0], s[1]}, {p[0], p[1]}, {d[0], d[1]}, op["ceil"].get<bool>());
        }
        CHECK(y.dtype() == dt);
        CHECK(y.shape() == shape_of(op["shape"]));
        CHECK(ints(y) == ints_of(op["y"]));
        ++checked;
      }
    }
  }
  CHECK(checked > 0);
}

TEST_CASE("quantized_conv2d against torch.ops.quantized.conv2d (x86 and QNNPACK engines)") {
  REQUIRE_GOLDEN(doc);
  for (const Device dev : test_devices()) {
    std::size_t outputs = 0, one_lsb = 0;
    for (const auto& c : doc["conv"]) {
      const Shape xs = shape_of(c["x_shape"]), ws = shape_of(c["w_shape"]), ys = shape_of(c["y_shape"]);
      const auto st = ints_of(c["stride"]), pd = ints_of(c["padding"]), dl = ints_of(c["dilation"]);
      const std::int64_t groups = c["groups"];
      const float sa = from_hex<std::uint32_t, float>(json::array({c["sa"]}))[0];
      const int za = c["za"], qmin = c["qmin"], qmax = c["qmax"];
      const Tensor x = Tensor::from_vector(from_hex<std::uint32_t, float>(c["x"]), xs, dev);
      const Tensor w_q = int_tensor(ints_of(c["w_q"]), ws, DType::s8).to(dev);
      const std::vector<float> sw = from_hex<std::uint32_t, float>(c["w_scale"]);
      const std::vector<float> bias = from_hex<std::uint32_t, float>(c["bias"]);
      const ActivationQuant act = ActivationQuant::fixed(Tensor::from_vector(std::vector<float>{sa}, {1}),
                                                         Tensor::from_vector(std::vector<std::int32_t>{za}, {1}), qmin, qmax);
      INFO(dev.str(), " x ", shape_str(xs), " w ", shape_str(ws), " groups ", groups, " za ", za, " torch engine ",
           c["engine"].get<std::string>());
      const Tensor y = quantized_conv2d(x, w_q, Tensor::from_vector(sw, {ws[0]}, dev),
                                        Tensor::from_vector(bias, {ws[0]}, dev), act, {st[0], st[1]}, {pd[0], pd[1]},
                                        {dl[0], dl[1]}, groups);
      REQUIRE(y.shape() == ys);
      const std::vector<float> yv = y.cpu().to_vector<float>();
      // 1. The f32 epilogue of the exact convolution of torch's a_q.
      const auto aq = ints_of(c["a_q"]), wq = ints_of(c["w_q"]);
      const std::int64_t N = xs[0], C = xs[1], H = xs[2], W = xs[3], O = ws[0], Cg = ws[1], kh = ws[2], kw = ws[3];
      const std::int64_t OH = ys[2], OW = ys[3], Og = O / groups;
      bool exact = true;
      for (std::int64_t n = 0; n < N; ++n)
        for (std::int64_t o = 0; o < O; ++o)
          for (std::int64_t oh = 0; oh < OH; ++oh)
            for (std::int64_t ow = 0; ow < OW; ++ow) {
              std::int64_t acc = 0;
              for (std::int64_t ci = 0; ci < Cg; ++ci)
                for (std::int64_t i = 0; i < kh; ++i)
                  for (std::int64_t j = 0; j < kw; ++j) {
                    const std::int64_t ih = oh * st[0] - pd[0] + i * dl[0], iw = ow * st[1] - pd[1] + j * dl[1];
                    if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;  // torch pads with za: (a_q - za) = 0
                    const std::int64_t ch = (o / Og) * Cg + ci;
                    acc += (aq[static_cast<std::size_t>(((n * C + ch) * H + ih) * W + iw)] - za) *
                           wq[static_cast<std::size_t>(((o * Cg + ci) * kh + i) * kw + j)];
                  }
              const float ref = static_cast<float>(acc) * (sa * sw[static_cast<std::size_t>(o)]) +
                                bias[static_cast<std::size_t>(o)];
              const float got = yv[static_cast<std::size_t>(((n * O + o) * OH + oh) * OW + ow)];
              exact = exact && std::memcmp(&ref, &got, sizeof ref) == 0;
            }
      CHECK(exact);
      // 2. Torch's float64 reference.
      const std::vector<double> y64 = from_hex<std::uint64_t, double>(c["y64"]);
      double worst = 0;
      for (std::size_t i = 0; i < y64.size(); ++i)
        worst = std::max(worst, std::fabs(yv[i] - y64[i]) / (1 + std::fabs(y64[i])));
      CHECK(worst < 1e-5);
      // 3. Torch's requantized output.
      const double so = c["out_scale"];
      const int zo = c["out_zero_point"];
      const auto qt = ints_of(c["q_out"]);
      std::int64_t worst_lsb = 0;
      for (std::size_t i = 0; i < qt.size(); ++i) {
        const double q = std::clamp(std::nearbyint(yv[i] / so) + zo, 0.0, 255.0);
        const std::int64_t d = std::llabs(static_cast<std::int64_t>(q) - qt[i]);
        worst_lsb = std::max(worst_lsb, d);
        one_lsb += d != 0;
      }
      outputs += qt.size();
      CHECK(worst_lsb <= 1);
    }
    MESSAGE(dev.str(), ": requantized outputs differing from torch.ops.quantized.conv2d by 1 LSB: ", one_lsb, " of ",
            outputs);
    CHECK(one_lsb * 100 <= outputs);  // at most 1%
  }
}
