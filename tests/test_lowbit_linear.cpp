// linear_w4a16 and linear_w4a8 (ops/lowbit_linear.h): host references built
// from dequantize_int4 + f64 math (W4A16) and from dynamic_range_quantize +
// exact integer group sums + the documented f32 sequence (W4A8, bit for
// bit), M = 0 / 1 / odd shapes, group sizes, bias, dtypes, per-channel W4A8
// against quantized_linear on the widened weight, bad inputs naming op and
// argument, and CUDA against the CPU (bit for bit for W4A8).
#include <cmath>
#include <string>
#include <tuple>

#include "helpers.h"
#include "qgrad/kernels/lowbit_linear.h"  // the fragment order's pack and unpack

using namespace qgrad;
using namespace qgrad::testing;

namespace {

using I64 = std::int64_t;

struct W4 {
  Tensor q, scale, zp;  // zp undefined for s4
  I64 N, K, G;
};

W4 make_w4(I64 N, I64 K, I64 G, DType qtype, std::uint64_t seed) {
  Generator g(seed);
  W4 w;
  w.N = N;
  w.K = K;
  w.G = G;
  const bool s = qtype == DType::s4;
  w.q = randint(s ? -8 : 0, s ? 8 : 16, {N, K}, g, TensorOptions{}.with_dtype(DType::s32)).to(qtype);
  w.scale = rand({N, K / G}, g, {}, 0.005, 0.05);
  if (!s) w.zp = randint(0, 16, {N, K / G}, g, TensorOptions{}.with_dtype(DType::s32));
  return w;
}

Tensor make_x(const Shape& shape, DType dt, std::uint64_t seed) {
  Generator g(seed);
  return randn(shape, g, TensorOptions{}.with_dtype(dt), 0.0, 1.5);
}

W4 on_cuda(const W4& w) {
  W4 c = w;
  c.q = w.q.cuda();
  c.scale = w.scale.cuda();
  if (w.zp.defined()) c.zp = w.zp.cuda();
  return c;
}

double rel_ulp(DType dt) { return dt == DType::f32 ? 0x1p-23 : dt == DType::f16 ? 0x1p-10 : 0x1p-7; }

// W4A16 against dequantize_int4 (in x's dtype: the documented weight) and
// f64 sums: |y - ref| <= one ulp of the output dtype at |ref| plus f32
// accumulation error over sum |x w|.
void check_w4a16(const Tensor& x, const W4& w, const Tensor& bias, const Tensor& y) {
  const DType dt = x.dtype();
  const Tensor zp = w.zp.defined() ? w.zp : zeros({w.N, w.K / w.G}, TensorOptions{}.with_dtype(DType::s32));
  const auto W = values(dequantize_int4(w.q, w.scale, zp, w.G, dt));
  const auto xs = values(x), ys = values(y);
  const auto bs = bias.defined() ? values(bias.to(dt)) : std::vector<double>();
  const I64 M = x.numel() / w.K;
  REQUIRE(static_cast<I64>(ys.size()) == M * w.N);
  for (I64 m = 0; m < M; ++m)
    for (I64 n = 0; n < w.N; ++n) {
      double ref = 0, mag = 0;
      for (I64 k = 0; k < w.K; ++k) {
        const double p = xs[static_cast<std::size_t>(m * w.K + k)] * W[static_cast<std::size_t>(n * w.K + k)];
        ref += p;
        mag += std::fabs(p);
      }
      if (!bs.empty()) {
        ref += bs[static_cast<std::size_t>(n)];
        mag += std::fabs(bs[static_cast<std::size_t>(n)]);
      }
      const double got = ys[static_cast<std::size_t>(m * w.N + n)];
      const double tol = rel_ulp(dt) * std::fabs(ref) + 1e-6 * mag + 1e-30;
      CHECK_MESSAGE(std::fabs(got - ref) <= tol, "m=", m, " n=", n, " got ", got, " ref ", ref);
    }
}

// W4A8's documented sequence on the host: the activation quantization of
// dynamic_range_quantize (per token, s8), exact group sums in int64, the f32
// terms float(acc) * (sa * sw) added in increasing g, + bias, one rounding.
Tensor ref_w4a8(const Tensor& x, const W4& w, const Tensor& bias, QuantMode mode, DType out_dtype) {
  const I64 K = w.K, M = x.numel() / K, groups = K / w.G;
  const DynamicQuantized dq = dynamic_range_quantize(x.reshape({M, K}), QuantScope::per_token(), mode, DType::s8);
  const auto a = dq.q.to(DType::s32).to_vector<std::int32_t>();
  const auto sa = dq.scale.to_vector<float>();
  const auto za = dq.zero_point.to_vector<std::int32_t>();
  const auto wq = w.q.to(DType::s32).to_vector<std::int32_t>();
  const auto sw = w.scale.to_vector<float>();
  const auto b = bias.defined() ? bias.to(DType::f32).to_vector<float>() : std::vector<float>();
  std::vector<float> y(static_cast<std::size_t>(M * w.N));
  for (I64 m = 0; m < M; ++m)
    for (I64 n = 0; n < w.N; ++n) {
      float acc_f = 0;
      for (I64 g = 0; g < groups; ++g) {
        std::int64_t acc = 0;
        for (I64 k = g * w.G; k < (g + 1) * w.G; ++k)
          acc += static_cast<std::int64_t>(a[static_cast<std::size_t>(m * K + k)] - za[static_cast<std::size_t>(m)]) *
                 wq[static_cast<std::size_t>(n * K + k)];
        const float term = static_cast<float>(acc) * (sa[static_cast<std::size_t>(m)] *
                                                       sw[static_cast<std::size_t>(n * groups + g)]);
        acc_f = g == 0 ? term : acc_f + term;
      }
      y[static_cast<std::size_t>(m * w.N + n)] = b.empty() ? acc_f : acc_f + b[static_cast<std::size_t>(n)];
    }
  Shape s = x.shape();
  s.back() = w.N;
  return Tensor::from_vector(y, s).to(out_dtype);
}

template <class F>
void expect_error(F&& f, const std::string& op, const std::string& arg) {
  try {
    f();
    FAIL_CHECK("no error for ", op, " ", arg);
  } catch (const Error& e) {
    CHECK(e.op() == op);
    CHECK_MESSAGE(e.arg() == arg, e.what());
  }
}

const DType kAct[] = {DType::f32, DType::f16, DType::bf16};

}  // namespace

// ---- W4A16 ----

TEST_CASE("linear_w4a16 matches dequantize_int4 + f64 sums: s4 and u4, group sizes, bias, dtypes") {
  for (auto row : {std::tuple{1, 8, 64, 32}, std::tuple{3, 17, 128, 64}, std::tuple{5, 9, 256, 256},
                            std::tuple{2, 5, 34, 2}, std::tuple{1, 3, 6, 6}, std::tuple{7, 12, 96, 32}}) {
    const auto& M = std::get<0>(row);
    const auto& N = std::get<1>(row);
    const auto& K = std::get<2>(row);
    const auto& G = std::get<3>(row);
    CAPTURE(M);
    CAPTURE(N);
    CAPTURE(K);
    CAPTURE(G);
    for (DType qt : {DType::s4, DType::u4}) {
      const W4 w = make_w4(N, K, G, qt, 31);
      for (DType dt : kAct) {
        CAPTURE(dt);
        const Tensor x = make_x({M, K}, dt, 32);
        Generator g(33);
        const Tensor bias = randn({N}, g, TensorOptions{}.with_dtype(dt));
        const Tensor y = linear_w4a16(x, w.q, w.scale, w.zp, G, bias);
        CHECK(y.dtype() == dt);
        CHECK(y.shape() == (Shape{M, N}));
        check_w4a16(x, w, bias, y);
        check_w4a16(x, w, Tensor(), linear_w4a16(x, w.q, w.scale, w.zp, G));
      }
    }
  }
}

// A scale of x's dtype T is the same formula with s = float(scale): the
// bits of an f32 scale holding the same values.
TEST_CASE("linear_w4a16 with scales of x's dtype equals f32 scales of the same values") {
  struct Row {
    I64 M, N, K, G;
  };
  for (const Row r : {Row{1, 8, 64, 32}, Row{3, 17, 128, 64}, Row{7, 12, 96, 32}}) {
    const I64 M = r.M, N = r.N, K = r.K, G = r.G;  // plain locals: clang 14 cannot capture bindings
    INFO("M=", M, " N=", N, " K=", K, " G=", G);
    for (DType qt : {DType::s4, DType::u4}) {
      const W4 w = make_w4(N, K, G, qt, 34);
      for (DType dt : {DType::f16, DType::bf16}) {
        CAPTURE(dt);
        const Tensor x = make_x({M, K}, dt, 35);
        const Tensor st = w.scale.to(dt);
        CHECK(bit_equal(linear_w4a16(x, w.q, st, w.zp, G), linear_w4a16(x, w.q, st.to(DType::f32), w.zp, G)));
      }
    }
  }
}

TEST_CASE("linear_w4a16: batch dims, M = 0, a lone row, an f32 bias for 16-bit x") {
  const W4 w = make_w4(6, 64, 32, DType::s4, 41);
  const Tensor x = make_x({2, 3, 64}, DType::bf16, 42);
  const Tensor y = linear_w4a16(x, w.q, w.scale, Tensor(), 32);
  CHECK(y.shape() == (Shape{2, 3, 6}));
  CHECK(bit_equal(y.reshape({6, 6}), linear_w4a16(x.reshape({6, 64}), w.q, w.scale, Tensor(), 32)));
  const Tensor e = linear_w4a16(zeros({0, 64}), w.q, w.scale, Tensor(), 32);
  CHECK(e.shape() == (Shape{0, 6}));
  const Tensor e3 = linear_w4a16(zeros({2, 0, 64}, TensorOptions{}.with_dtype(DType::f16)), w.q, w.scale, Tensor(), 32);
  CHECK(e3.shape() == (Shape{2, 0, 6}));
  // An f32 bias is rounded to x's dtype first.
  Generator g(43);
  const Tensor b32 = randn({6}, g);
  CHECK(bit_equal(linear_w4a16(x, w.q, w.scale, Tensor(), 32, b32),
                  linear_w4a16(x, w.q, w.scale, Tensor(), 32, b32.to(DType::bf16))));
}

TEST_CASE("linear_w4a16: zero weights give the bias, NaN in x reaches its row only") {
  W4 w = make_w4(4, 32, 32, DType::s4, 51);
  w.q = zeros({4, 32}).to(DType::s4);
  Tensor x = make_x({2, 32}, DType::f32, 52);
  const Tensor bias = Tensor::from_vector(std::vector<float>{1.5f, -0.0f, 0.0f, -2.0f}, {4});
  auto y = values(linear_w4a16(x, w.q, w.scale, Tensor(), 32, bias));
  for (int m = 0; m < 2; ++m) {
    CHECK(y[static_cast<std::size_t>(m * 4)] == 1.5);
    CHECK(y[static_cast<std::size_t>(m * 4 + 3)] == -2.0);
  }
  const W4 w2 = make_w4(4, 32, 32, DType::s4, 53);
  std::vector<float> xv = x.to_vector<float>();
  xv[3] = NAN;
  const auto y2 = values(linear_w4a16(Tensor::from_vector(xv, {2, 32}), w2.q, w2.scale, Tensor(), 32));
  for (int n = 0; n < 4; ++n) {
    CHECK(std::isnan(y2[static_cast<std::size_t>(n)]));
    CHECK(std::isfinite(y2[static_cast<std::size_t>(4 + n)]));
  }
}

// ---- W4A8 ----

// pack_w4a16's fragment order, written out independently of
// kernels/formulas: nibble (n, k) of the plain weight sits in the 16-byte
// chunk of lane 4 (n % 8) + (k % 128) / 32 of half (n % 16) / 8 of unit
// (n / 16, k / 128), 32-bit word (k % 32) / 8, nibble 2i -> i, 2i + 1 -> i + 4.
std::vector<std::uint8_t> frag_reference(const Tensor& w) {
  const I64 N = w.shape()[0], K = w.shape()[1], Np = (N + 31) / 32 * 32, Kp = (K + 127) / 128 * 128;
  const std::uint8_t* src = static_cast<const std::uint8_t*>(w.data_ptr());
  std::vector<std::uint8_t> out(static_cast<std::size_t>(Np * Kp / 2), 0);
  for (I64 n = 0; n < N; ++n)
    for (I64 k = 0; k < K; ++k) {
      const unsigned nib = (src[(n * K + k) / 2] >> (4 * (k % 2))) & 0xfu;
      const I64 unit = (n / 16) * (Kp / 128) + k / 128, lane = 4 * (n % 8) + (k % 128) / 32;
      const I64 chunk = (unit * 2 + (n % 16) / 8) * 32 + lane;
      const I64 c = k % 8, pos = c % 2 == 0 ? c / 2 : c / 2 + 4;  // nibble in the word
      const I64 byte = chunk * 16 + ((k % 32) / 8) * 4 + pos / 2;
      out[static_cast<std::size_t>(byte)] |= static_cast<std::uint8_t>(nib << (4 * (pos % 2)));
    }
  return out;
}

std::vector<std::uint8_t> bytes_of(const Tensor& t) {
  const Tensor h = t.cpu();
  const auto* p = static_cast<const std::uint8_t*>(h.data_ptr());
  return std::vector<std::uint8_t>(p, p + h.numel());
}

TEST_CASE("pack_w4a16's fragment order: its bytes, its padding, and back; CUDA writes the same bytes") {
  for (auto row : {std::tuple{I64{5}, I64{64}}, std::tuple{I64{40}, I64{256}}, std::tuple{I64{33}, I64{96}},
                   std::tuple{I64{16}, I64{4096}}, std::tuple{I64{7}, I64{2}}}) {
    const I64 N = std::get<0>(row), K = std::get<1>(row);
    CAPTURE(N);
    CAPTURE(K);
    for (DType qt : {DType::s4, DType::u4}) {
      const W4 w = make_w4(N, K, 2, qt, 71);
      const auto ref = frag_reference(w.q);
      Tensor frag = full({static_cast<I64>(ref.size())}, 171.0, TensorOptions{}.with_dtype(DType::u8));  // poison
      kernels::w4a16_frag_pack(w.q, frag);
      CHECK(bytes_of(frag) == ref);
      Tensor back = full({N, K}, 3.0, TensorOptions{}.with_dtype(qt));  // poison
      kernels::w4a16_frag_unpack(frag, back);
      CHECK(bit_equal(back, w.q));
      if (!cuda_available()) continue;
      Tensor frag_c = full({static_cast<I64>(ref.size())}, 171.0, TensorOptions{}.with_dtype(DType::u8).with_device(Device::cuda(0)));
      kernels::w4a16_frag_pack(w.q.cuda(), frag_c);
      CHECK(bytes_of(frag_c) == ref);
      Tensor back_c = full({N, K}, 3.0, TensorOptions{}.with_dtype(qt).with_device(Device::cuda(0)));
      kernels::w4a16_frag_unpack(frag_c, back_c);
      CHECK(bit_equal(back_c.cpu(), w.q));
    }
  }
}

TEST_CASE("linear_w4a16 with a packed weight equals the plain weight on the CPU (batch dims, M = 0, bias)") {
  for (auto row : {std::tuple{I64{1}, I64{8}, I64{64}, I64{32}}, std::tuple{I64{5}, I64{33}, I64{96}, I64{32}},
                   std::tuple{I64{17}, I64{40}, I64{256}, I64{128}}, std::tuple{I64{3}, I64{4}, I64{6}, I64{2}}}) {
    const I64 M = std::get<0>(row), N = std::get<1>(row), K = std::get<2>(row), G = std::get<3>(row);
    CAPTURE(M);
    CAPTURE(N);
    CAPTURE(K);
    for (DType qt : {DType::s4, DType::u4}) {
      const W4 w = make_w4(N, K, G, qt, 72);
      const PackedW4A16 pw = pack_w4a16(w.q, w.scale, w.zp, G);
      CHECK(pw.out_features() == N);
      CHECK(pw.in_features() == K);
      CHECK(pw.group_size() == G);
      CHECK(pw.weight_dtype() == qt);
      CHECK(pw.nbytes() == (N + 31) / 32 * 32 * ((K + 127) / 128 * 128) / 2 + N * (K / G) * (qt == DType::u4 ? 8 : 4));
      for (DType dt : kAct) {
        CAPTURE(dt);
        const Tensor x = make_x({M, K}, dt, 73);
        Generator g(74);
        const Tensor bias = randn({N}, g, TensorOptions{}.with_dtype(dt));
        CHECK(bit_equal(linear_w4a16(x, pw, bias), linear_w4a16(x, w.q, w.scale, w.zp, G, bias)));
        const Tensor xb = x.reshape({1, M, K});
        CHECK(bit_equal(linear_w4a16(xb, pw), linear_w4a16(xb, w.q, w.scale, w.zp, G)));
        CHECK(linear_w4a16(zeros({0, K}, TensorOptions{}.with_dtype(dt)), pw).shape() == (Shape{0, N}));
        if (dt == DType::f32) continue;
        const PackedW4A16 pt = pack_w4a16(w.q, w.scale.to(dt), w.zp, G);  // scales of x's dtype
        CHECK(pt.scale_dtype() == dt);
        CHECK(bit_equal(linear_w4a16(x, pt, bias), linear_w4a16(x, w.q, w.scale.to(dt), w.zp, G, bias)));
      }
    }
  }
}

TEST_CASE("linear_w4a8 matches the documented sequence bit for bit: modes, groups, bias, out dtypes") {
  for (auto row : {std::tuple{1, 8, 64, 32}, std::tuple{5, 17, 128, 32}, std::tuple{3, 9, 256, 64},
                            std::tuple{4, 7, 30, 6}, std::tuple{2, 5, 34, 34}, std::tuple{9, 16, 64, 64}}) {
    const auto& M = std::get<0>(row);
    const auto& N = std::get<1>(row);
    const auto& K = std::get<2>(row);
    const auto& G = std::get<3>(row);
    CAPTURE(M);
    CAPTURE(N);
    CAPTURE(K);
    CAPTURE(G);
    const W4 w = make_w4(N, K, G, DType::s4, 61);
    Generator g(62);
    const Tensor bias = randn({N}, g);
    for (DType dt : kAct) {
      const Tensor x = make_x({M, K}, dt, 63);
      for (QuantMode mode : {QuantMode::symmetric, QuantMode::asymmetric})
        for (DType out : kAct) {
          CAPTURE(dt);
          CAPTURE(out);
          CAPTURE(static_cast<int>(mode));
          CHECK(bit_equal(linear_w4a8(x, w.q, w.scale, G, bias, mode, out), ref_w4a8(x, w, bias, mode, out)));
          CHECK(bit_equal(linear_w4a8(x, w.q, w.scale, G, Tensor(), mode, out), ref_w4a8(x, w, Tensor(), mode, out)));
        }
    }
  }
}

TEST_CASE("linear_w4a8 is close to x · dequantize_int4(w)^T (int8 activations)") {
  const W4 w = make_w4(16, 128, 32, DType::s4, 71);
  const Tensor x = make_x({4, 128}, DType::f32, 72);
  const auto W = values(dequantize_int4(w.q, w.scale, zeros({16, 4}, TensorOptions{}.with_dtype(DType::s32)), 32));
  const auto xs = values(x);
  for (QuantMode mode : {QuantMode::symmetric, QuantMode::asymmetric}) {
    const auto y = values(linear_w4a8(x, w.q, w.scale, 32, Tensor(), mode));
    for (I64 m = 0; m < 4; ++m) {
      double amax = 0;
      for (I64 k = 0; k < 128; ++k) amax = std::max(amax, std::fabs(xs[static_cast<std::size_t>(m * 128 + k)]));
      for (I64 n = 0; n < 16; ++n) {
        double ref = 0, wabs = 0;
        for (I64 k = 0; k < 128; ++k) {
          ref += xs[static_cast<std::size_t>(m * 128 + k)] * W[static_cast<std::size_t>(n * 128 + k)];
          wabs += std::fabs(W[static_cast<std::size_t>(n * 128 + k)]);
        }
        // Each activation is off by at most half a step (amax / 127 symmetric, 2 amax / 255 asymmetric).
        CHECK(std::fabs(y[static_cast<std::size_t>(m * 16 + n)] - ref) <= 0.5 * (2 * amax / 127) * wabs + 1e-5);
      }
    }
  }
}

TEST_CASE("linear_w4a8 per channel, symmetric = quantized_linear on the widened weight (bit for bit)") {
  for (auto [M, N, K] : {std::tuple{1, 8, 64}, std::tuple{6, 13, 34}, std::tuple{33, 40, 128}}) {
    const W4 w = make_w4(N, K, K, DType::s4, 81);
    Generator g(82);
    const Tensor bias = randn({N}, g);
    const Tensor x = make_x({M, K}, DType::bf16, 83);
    for (DType out : kAct)
      CHECK(bit_equal(linear_w4a8(x, w.q, w.scale, K, bias, QuantMode::symmetric, out),
                      quantized_linear(x, w.q.to(DType::s8), w.scale.reshape({N}), bias, ActivationQuant::dynamic(),
                                       out)));
  }
}

TEST_CASE("linear_w4a8 with a cached widened weight w_s8: the same bits, every path, a stale cache rejected") {
  for (auto [M, N, K, G] : {std::tuple{1, 8, 64, 64}, std::tuple{6, 13, 34, 34}, std::tuple{5, 9, 64, 32}}) {
    const W4 w = make_w4(N, K, G, DType::s4, 84);
    const Tensor w8 = w.q.to(DType::s8);
    Generator g(85);
    const Tensor bias = randn({N}, g);
    const Tensor x = make_x({M, K}, DType::bf16, 86);
    for (QuantMode mode : {QuantMode::symmetric, QuantMode::asymmetric})
      for (DType out : kAct)
        CHECK(bit_equal(linear_w4a8(x, w.q, w.scale, G, bias, mode, out, w8),
                        linear_w4a8(x, w.q, w.scale, G, bias, mode, out)));
  }
  const W4 w = make_w4(4, 64, 64, DType::s4, 87);
  Tensor w8 = w.q.to(DType::s8);
  w8.data<std::int8_t>()[70] = static_cast<std::int8_t>(w8.data<std::int8_t>()[70] == 3 ? 4 : 3);
  expect_error([&] { (void)linear_w4a8(make_x({2, 64}, DType::f32, 88), w.q, w.scale, 64, Tensor(),
                                       QuantMode::symmetric, DType::f32, w8); },
               "linear_w4a8", "w_s8");
}

TEST_CASE("linear_w4a8: batch dims, M = 0, default arguments") {
  const W4 w = make_w4(5, 64, 32, DType::s4, 91);
  const Tensor x = make_x({2, 3, 64}, DType::f32, 92);
  const Tensor y = linear_w4a8(x, w.q, w.scale, 32);
  CHECK(y.dtype() == DType::f32);
  CHECK(y.shape() == (Shape{2, 3, 5}));
  CHECK(bit_equal(y, ref_w4a8(x, w, Tensor(), QuantMode::asymmetric, DType::f32)));
  CHECK(linear_w4a8(zeros({0, 64}), w.q, w.scale, 32).shape() == (Shape{0, 5}));
}

// ---- bad inputs ----

TEST_CASE("bad inputs name the op and the argument") {
  const W4 s = make_w4(4, 64, 32, DType::s4, 101), u = make_w4(4, 64, 32, DType::u4, 102);
  const Tensor x = make_x({2, 64}, DType::f32, 103), none;
  const char* a16 = "linear_w4a16";
  const char* a8 = "linear_w4a8";
  // odd K (packed rows), G not dividing K, G <= 0
  const Tensor x63 = make_x({2, 63}, DType::f32, 104);
  const Tensor w63 = zeros({4, 63}).to(DType::s4), s63 = full({4, 1}, 0.1);
  expect_error([&] { linear_w4a16(x63, w63, s63, none, 63); }, a16, "w_q");
  expect_error([&] { linear_w4a8(x63, w63, s63, 63); }, a8, "w_q");
  expect_error([&] { linear_w4a16(x, s.q, full({4, 1}, 0.1), none, 48); }, a16, "group_size");
  expect_error([&] { linear_w4a8(x, s.q, full({4, 1}, 0.1), 48); }, a8, "group_size");
  expect_error([&] { linear_w4a16(x, s.q, s.scale, none, 0); }, a16, "group_size");
  expect_error([&] { linear_w4a8(x, s.q, s.scale, -2); }, a8, "group_size");
  // dtypes
  expect_error([&] { linear_w4a16(x.to(DType::f64), s.q, s.scale, none, 32); }, a16, "x");
  expect_error([&] { linear_w4a16(x.to(DType::s32), s.q, s.scale, none, 32); }, a16, "x");
  expect_error([&] { linear_w4a8(x.to(DType::f64), s.q, s.scale, 32); }, a8, "x");
  expect_error([&] { linear_w4a16(x, s.q.to(DType::s8), s.scale, none, 32); }, a16, "w_q");
  expect_error([&] { linear_w4a8(x, u.q, u.scale, 32); }, a8, "w_q");
  expect_error([&] { linear_w4a16(x, s.q, s.scale.to(DType::f16), none, 32); }, a16, "w_scale");
  // 16-bit scales: x's dtype only, checked for values on the host; not for W4A8
  const Tensor xb = x.to(DType::bf16);
  expect_error([&] { linear_w4a16(xb, s.q, s.scale.to(DType::f16), none, 32); }, a16, "w_scale");
  expect_error([&] { linear_w4a16(xb, s.q, full({4, 2}, -0.1).to(DType::bf16), none, 32); }, a16, "w_scale");
  expect_error([&] { linear_w4a8(xb, s.q, s.scale.to(DType::bf16), 32); }, a8, "w_scale");
  expect_error([&] { linear_w4a8(x, s.q, s.scale.to(DType::f64), 32); }, a8, "w_scale");
  expect_error([&] { linear_w4a8(x, s.q, s.scale, 32, none, QuantMode::symmetric, DType::f64); }, a8, "out_dtype");
  expect_error([&] { linear_w4a8(x, s.q, s.scale, 32, none, QuantMode::symmetric, DType::s32); }, a8, "out_dtype");
  // zero points
  expect_error([&] { linear_w4a16(x, s.q, s.scale, u.zp, 32); }, a16, "w_zero_point");
  expect_error([&] { linear_w4a16(x, u.q, u.scale, none, 32); }, a16, "w_zero_point");
  expect_error([&] { linear_w4a16(x, u.q, u.scale, u.zp.to(DType::f32), 32); }, a16, "w_zero_point");
  expect_error([&] { linear_w4a16(x, u.q, u.scale, full({4, 2}, -1, TensorOptions{}.with_dtype(DType::s32)), 32); },
               a16, "w_zero_point");
  // shapes
  expect_error([&] { linear_w4a16(x, s.q, full({4, 3}, 0.1), none, 32); }, a16, "w_scale");
  expect_error([&] { linear_w4a8(x, s.q, full({3, 2}, 0.1), 32); }, a8, "w_scale");
  expect_error([&] { linear_w4a16(make_x({2, 32}, DType::f32, 1), s.q, s.scale, none, 32); }, a16, "w_q");
  expect_error([&] { linear_w4a16(x, s.q, s.scale, none, 32, zeros({5})); }, a16, "bias");
  expect_error([&] { linear_w4a8(x, s.q, s.scale, 32, zeros({4}, TensorOptions{}.with_dtype(DType::s8))); }, a8,
               "bias");
  // scale values (host-resident: checked)
  expect_error([&] { linear_w4a16(x, s.q, full({4, 2}, -0.1), none, 32); }, a16, "w_scale");
  expect_error([&] { linear_w4a8(x, s.q, full({4, 2}, INFINITY), 32); }, a8, "w_scale");
}

// ---- CUDA ----

TEST_CASE("CUDA linear_w4a8 matches the CPU bit for bit") {
  QGRAD_REQUIRE_GPU();
  for (auto row : {std::tuple{1, 8, 64, 32}, std::tuple{5, 17, 128, 32}, std::tuple{3, 9, 256, 64},
                            std::tuple{4, 7, 30, 6}, std::tuple{2, 5, 34, 34}, std::tuple{37, 40, 128, 128},
                            std::tuple{130, 64, 512, 512}, std::tuple{130, 64, 512, 128}}) {
    const auto& M = std::get<0>(row);
    const auto& N = std::get<1>(row);
    const auto& K = std::get<2>(row);
    const auto& G = std::get<3>(row);
    CAPTURE(M);
    CAPTURE(N);
    CAPTURE(K);
    CAPTURE(G);
    const W4 w = make_w4(N, K, G, DType::s4, 111);
    const W4 wc = on_cuda(w);
    Generator g(112);
    const Tensor bias = randn({N}, g);
    for (DType dt : kAct) {
      const Tensor x = make_x({M, K}, dt, 113);
      for (QuantMode mode : {QuantMode::symmetric, QuantMode::asymmetric})
        for (DType out : kAct)
          CHECK(bit_equal(linear_w4a8(x, w.q, w.scale, G, bias, mode, out),
                          linear_w4a8(x.cuda(), wc.q, wc.scale, G, bias.cuda(), mode, out)));
      // The cached widened weight (per channel symmetric: no widening on the device).
      CHECK(bit_equal(linear_w4a8(x, w.q, w.scale, G, bias, QuantMode::symmetric, DType::bf16),
                      linear_w4a8(x.cuda(), wc.q, wc.scale, G, bias.cuda(), QuantMode::symmetric, DType::bf16,
                                  wc.q.to(DType::s8))));
    }
  }
}

TEST_CASE("CUDA linear_w4a16 matches the reference: GEMV (M <= 64), cuBLAS (M > 64), other shapes") {
  QGRAD_REQUIRE_GPU();
  for (auto row : {std::tuple{1, 8, 64, 32}, std::tuple{1, 40, 256, 128}, std::tuple{16, 33, 128, 32},
                            std::tuple{17, 16, 96, 32}, std::tuple{33, 24, 128, 128}, std::tuple{64, 24, 128, 64},
                            std::tuple{65, 24, 128, 64}, std::tuple{128, 16, 256, 64}, std::tuple{130, 48, 256, 256}, std::tuple{3, 7, 34, 2}, std::tuple{5, 9, 48, 16},
                            // Long K: the GEMV's ring of weight stages refills its slots (and ends
                            // on a partial stage: 9248 and 5152 are not multiples of 1024).
                            std::tuple{1, 40, 12288, 128}, std::tuple{20, 24, 9248, 32},
                            std::tuple{40, 36, 5152, 32}, std::tuple{9, 72, 4096, 256},
                            // The GEMVs' paths without bounds tests: split-K with one and two
                            // runs per warp, bulk copies with NC = 2 and 4; split-K with two chunks
                            // of x and two tiles a warp, T and f32 scales (a partial block at N = 40
                            // and 72, two runs a warp at K = 8192).
                            std::tuple{3, 24, 4096, 32}, std::tuple{1, 20, 8192, 256},
                            std::tuple{16, 40, 2048, 64}, std::tuple{30, 24, 1024, 32},
                            std::tuple{16, 40, 4096, 128}, std::tuple{12, 72, 8192, 64},
                            std::tuple{11, 64, 4096, 32},
                            // M <= 8 with two tiles a warp (4 <= M, K a multiple of 4096).
                            std::tuple{8, 40, 4096, 128}, std::tuple{5, 72, 8192, 64}, std::tuple{4, 64, 4096, 32}}) {
    const auto& M = std::get<0>(row);
    const auto& N = std::get<1>(row);
    const auto& K = std::get<2>(row);
    const auto& G = std::get<3>(row);
    CAPTURE(M);
    CAPTURE(N);
    CAPTURE(K);
    CAPTURE(G);
    for (DType qt : {DType::s4, DType::u4}) {
      const W4 w = make_w4(N, K, G, qt, 121);
      const W4 wc = on_cuda(w);
      for (DType dt : kAct) {
        CAPTURE(dt);
        const Tensor x = make_x({M, K}, dt, 122);
        Generator g(123);
        const Tensor bias = randn({N}, g, TensorOptions{}.with_dtype(dt));
        const Tensor y = linear_w4a16(x.cuda(), wc.q, wc.scale, wc.zp, G, bias.cuda());
        check_w4a16(x, w, bias, y.cpu());
        check_w4a16(x, w, Tensor(), linear_w4a16(x.cuda(), wc.q, wc.scale, wc.zp, G).cpu());
        if (dt == DType::f32) continue;
        // Scales of x's dtype (the packed GEMV at M <= 64): the reference takes their values.
        W4 wt = w;
        wt.scale = w.scale.to(dt).to(DType::f32);
        const Tensor st = wc.scale.to(dt);
        check_w4a16(x, wt, bias, linear_w4a16(x.cuda(), wc.q, st, wc.zp, G, bias.cuda()).cpu());
        check_w4a16(x, wt, Tensor(), linear_w4a16(x.cuda(), wc.q, st, wc.zp, G).cpu());
      }
    }
  }
}

// x rows that are one-hot columns read the dequantized weight out of the
// GEMV exactly (one product 1 * W, the rest exact zeros): every column, every
// nibble position, bit for bit against dequantize_int4, for both scale dtypes
// and every x-chunk count of the kernels (M = 8, 16, 32, 64).
TEST_CASE("CUDA linear_w4a16 GEMV reads out dequantize_int4 bit for bit (one-hot x)") {
  QGRAD_REQUIRE_GPU();
  constexpr I64 N = 40;
  // K = 4096: the kernels' paths without bounds tests (whole warp runs and
  // stages, G a power of two), every 9th group of M columns.
  for (const I64 K : {256, 4096}) {
    for (I64 G : {32, 64, 256}) {
      CAPTURE(K);
      CAPTURE(G);
      for (DType qt : {DType::s4, DType::u4}) {
        const W4 w = make_w4(N, K, G, qt, 131);
        const W4 wc = on_cuda(w);
        for (DType dt : {DType::f16, DType::bf16}) {
          CAPTURE(dt);
          for (bool t_scale : {false, true}) {
            CAPTURE(t_scale);
            const Tensor scale = t_scale ? w.scale.to(dt).to(DType::f32) : w.scale;
            const Tensor zp = w.zp.defined() ? w.zp : zeros({N, K / G}, TensorOptions{}.with_dtype(DType::s32));
            const Tensor ref = dequantize_int4(w.q, scale, zp, G, dt);  // [N, K]
            const Tensor sc = t_scale ? wc.scale.to(dt) : wc.scale;
            for (I64 M : {8, 16, 32, 64}) {
              CAPTURE(M);
              for (I64 k0 = 0; k0 < K; k0 += K == 256 ? M : 9 * M) {
                std::vector<float> xv(static_cast<std::size_t>(M * K), 0.0f);
                for (I64 m = 0; m < M; ++m) xv[static_cast<std::size_t>(m * K + k0 + m)] = 1.0f;
                const Tensor x = Tensor::from_vector(xv, {M, K}).to(dt).cuda();
                const Tensor y = linear_w4a16(x, wc.q, sc, wc.zp, G).cpu();  // [M, N] = W[:, k0 .. k0 + M)^T
                CHECK(bit_equal(y, transpose(slice(ref, 1, k0, k0 + M), 0, 1)));
              }
            }
          }
        }
      }
    }
  }
}

// The split-K GEMV (M <= 8, and 8 < M <= 16 at K = 4096, T and f32 scales;
// groups of 128 or more) asks L2 for its weight before it waits for the
// kernel before it (kernels/cuda/w4a16_gemv.cuh); M = 16 at K = 1024 (the
// bulk-copy GEMV, which waits first) for contrast. Here that kernel writes the
// weight: each round converts other values to s4 (as a rule into the block
// the allocator kept from the round before, whose weight the GEMV just read),
// and the GEMV right after must read the new values.
TEST_CASE("CUDA linear_w4a16 reads a weight written by the kernel just before it") {
  QGRAD_REQUIRE_GPU();
  constexpr I64 N = 96, G = 128;
  for (auto row : {std::tuple{I64{1}, I64{1024}, false}, std::tuple{I64{16}, I64{1024}, false},
                   std::tuple{I64{16}, I64{4096}, true}, std::tuple{I64{16}, I64{4096}, false},
                   std::tuple{I64{8}, I64{4096}, true}, std::tuple{I64{4}, I64{4096}, false}}) {
    // Copies, not structured bindings: CAPTURE's lambda cannot capture a binding in C++20 (clang).
    const I64 M = std::get<0>(row), K = std::get<1>(row);
    const bool t_scale = std::get<2>(row);
    CAPTURE(M);
    CAPTURE(K);
    const Tensor x = make_x({M, K}, DType::bf16, 141);
    for (int round = 0; round < 4; ++round) {
      CAPTURE(round);
      W4 w = make_w4(N, K, G, DType::s4, 142 + static_cast<std::uint64_t>(round));
      if (t_scale) w.scale = w.scale.to(DType::bf16).to(DType::f32);  // the values the bf16 scales hold
      const Tensor ints = w.q.to(DType::s32).cuda(), xc = x.cuda();
      const Tensor scale = t_scale ? w.scale.to(DType::bf16).cuda() : w.scale.cuda();
      const Tensor wq = ints.to(DType::s4);  // written by a kernel, then read by the next one
      check_w4a16(x, w, Tensor(), linear_w4a16(xc, wq, scale, Tensor(), G).cpu());
    }
  }
}

// The packed weight on CUDA: at M <= 16 the split-K GEMV on the fragment
// order, loading before it waits. Same bits as the plain weight with f32
// scales wherever both take that GEMV, for scales of either dtype; the
// unpacked path (M > 16, f32 x) the plain path's bits; every output within
// the reference's bound.
TEST_CASE("CUDA linear_w4a16 with a packed weight: the plain weight's bits with f32 scales, the bound") {
  QGRAD_REQUIRE_GPU();
  // M <= 2, K = 4096, G a power of two with 16-bit scales: the resident-slab
  // GEMV (N = 40: a block past N).
  for (auto row : {std::tuple{1, 40, 4096, 128}, std::tuple{2, 40, 4096, 32}, std::tuple{2, 24, 1024, 32},
                   std::tuple{3, 33, 96, 32}, std::tuple{1, 72, 8192, 64}, std::tuple{4, 64, 4096, 32}, std::tuple{5, 40, 256, 64},
                   std::tuple{8, 40, 4096, 128}, std::tuple{9, 24, 1024, 32}, std::tuple{12, 72, 8192, 64},
                   std::tuple{16, 40, 4096, 128}, std::tuple{16, 17, 160, 32}, std::tuple{17, 24, 4096, 128},
                   std::tuple{64, 16, 256, 64}, std::tuple{70, 24, 128, 128}, std::tuple{3, 9, 48, 16}}) {
    const int M = std::get<0>(row), N = std::get<1>(row), K = std::get<2>(row), G = std::get<3>(row);
    CAPTURE(M);
    CAPTURE(N);
    CAPTURE(K);
    CAPTURE(G);
    // Where the plain weight takes the same split-K GEMV (its route: M <= 8, or
    // 8 < M <= 16 with K a multiple of 4096 and G a power of two), with the
    // same 32-divisible K and G.
    const bool same_gemv = K % 32 == 0 && G % 32 == 0 && (M <= 8 || (M <= 16 && K % 4096 == 0 && (G & (G - 1)) == 0));
    for (DType qt : {DType::s4, DType::u4}) {
      const W4 w = make_w4(N, K, G, qt, 181);
      const W4 wc = on_cuda(w);
      for (DType dt : kAct) {
        CAPTURE(dt);
        const Tensor x = make_x({M, K}, dt, 182), xc = x.cuda();
        Generator g(183);
        const Tensor bias = randn({N}, g, TensorOptions{}.with_dtype(dt)), bc = bias.cuda();
        const Tensor y32 = linear_w4a16(xc, pack_w4a16(wc.q, wc.scale, wc.zp, G), bc).cpu();
        check_w4a16(x, w, bias, y32);
        const Tensor plain32 = linear_w4a16(xc, wc.q, wc.scale, wc.zp, G, bc).cpu();
        if (same_gemv || M > 16 || dt == DType::f32) CHECK(bit_equal(y32, plain32));
        if (dt == DType::f32) continue;
        W4 wt = w;  // the values the 16-bit scales hold
        wt.scale = w.scale.to(dt).to(DType::f32);
        const Tensor st = wc.scale.to(dt);
        const Tensor yt = linear_w4a16(xc, pack_w4a16(wc.q, st, wc.zp, G), bc).cpu();
        check_w4a16(x, wt, bias, yt);
        if (same_gemv) CHECK(bit_equal(yt, linear_w4a16(xc, wc.q, st.to(DType::f32), wc.zp, G, bc).cpu()));
        if (M > 16) CHECK(bit_equal(yt, linear_w4a16(xc, wc.q, st, wc.zp, G, bc).cpu()));
      }
    }
  }
}

// The packed weight is the object's own: writing the tensors it was packed
// from changes nothing; and each round packs a new weight (as a rule into
// blocks the allocator kept from the round before) and multiplies right
// after: the GEMV's loads before its wait never overlap the pack.
TEST_CASE("CUDA linear_w4a16 with a packed weight: its own copies, packed right before the call") {
  QGRAD_REQUIRE_GPU();
  constexpr I64 M = 1, N = 96, K = 4096, G = 128;
  const Tensor x = make_x({M, K}, DType::bf16, 191), xc = x.cuda();
  W4 w = make_w4(N, K, G, DType::s4, 192);
  Tensor q = w.q.cuda(), s = w.scale.to(DType::bf16).cuda();
  const PackedW4A16 pw = pack_w4a16(q, s, Tensor(), G);
  const Tensor before = linear_w4a16(xc, pw).cpu();
  q.copy_(make_w4(N, K, G, DType::s4, 193).q.cuda());
  s.copy_(full({N, K / G}, 0.5, TensorOptions{}.with_dtype(DType::bf16)).cuda());
  CHECK(bit_equal(linear_w4a16(xc, pw).cpu(), before));
  for (int round = 0; round < 4; ++round) {
    CAPTURE(round);
    W4 wr = make_w4(N, K, G, DType::s4, 194 + static_cast<std::uint64_t>(round));
    wr.scale = wr.scale.to(DType::bf16).to(DType::f32);
    const Tensor y = linear_w4a16(xc, pack_w4a16(wr.q.cuda(), wr.scale.to(DType::bf16).cuda(), Tensor(), G));
    check_w4a16(x, wr, Tensor(), y.cpu());
  }
}

TEST_CASE("CUDA int4 linear layers reject operands on another device") {
  QGRAD_REQUIRE_GPU();
  const W4 s = make_w4(4, 64, 32, DType::s4, 131), u = make_w4(4, 64, 32, DType::u4, 132);
  const Tensor x = make_x({2, 64}, DType::f32, 133).cuda(), none;
  expect_error([&] { linear_w4a16(x, s.q, s.scale.cuda(), none, 32); }, "linear_w4a16", "w_q");
  expect_error([&] { linear_w4a16(x, s.q.cuda(), s.scale, none, 32); }, "linear_w4a16", "w_scale");
  expect_error([&] { linear_w4a16(x, u.q.cuda(), u.scale.cuda(), u.zp, 32); }, "linear_w4a16", "w_zero_point");
  expect_error([&] { linear_w4a16(x, s.q.cuda(), s.scale.cuda(), none, 32, zeros({4})); }, "linear_w4a16", "bias");
  expect_error([&] { linear_w4a16(x, pack_w4a16(s.q, s.scale, none, 32)); }, "linear_w4a16", "w");
  expect_error([&] { pack_w4a16(s.q.cuda(), s.scale, none, 32); }, "pack_w4a16", "w_scale");
  expect_error([&] { pack_w4a16(u.q.cuda(), u.scale.cuda(), u.zp, 32); }, "pack_w4a16", "w_zero_point");
  expect_error([&] { linear_w4a8(x, s.q, s.scale.cuda(), 32); }, "linear_w4a8", "w_q");
  expect_error([&] { linear_w4a8(x, s.q.cuda(), s.scale, 32); }, "linear_w4a8", "w_scale");
  expect_error([&] { linear_w4a8(x, s.q.cuda(), s.scale.cuda(), 32, zeros({4})); }, "linear_w4a8", "bias");
}
