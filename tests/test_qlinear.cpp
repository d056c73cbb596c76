// quantized_linear: a host reference (independent scalar loops, exact int64
// accumulation, the epilogue as the documented f32 sequence), a float64
// accuracy bound, odd shapes, bias, every output and input dtype, static
// activation quantization with a zero point, bad inputs, CPU/CUDA identity.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "helpers.h"

using namespace qgrad;
using namespace qgrad::testing;

namespace {

struct Layer {
  Tensor w_q, w_scale, bias;
  std::int64_t N, K;
};

Layer make_layer(std::int64_t N, std::int64_t K, std::uint64_t seed, bool with_bias = true) {
  Generator g(seed);
  Layer l;
  l.N = N;
  l.K = K;
  l.w_q = randint(-128, 128, {N, K}, g, TensorOptions{}.with_dtype(DType::s8));
  l.w_scale = rand({N}, g, {}, 0.001, 0.02);
  if (with_bias) l.bias = randn({N}, g);
  return l;
}

Tensor make_x(const Shape& shape, DType dt, std::uint64_t seed) {
  Generator g(seed);
  return randn(shape, g, TensorOptions{}.with_dtype(dt), 0.1, 2.0);
}

// Reference activation quantization (float math; double for f64 input).
template <class Mq>
void ref_quant_rows(const std::vector<double>& x, std::int64_t M, std::int64_t K, const ActivationQuant& act,
                    std::vector<int>& aq, std::vector<double>& sa) {
  aq.assign(static_cast<std::size_t>(M * K), 0);
  sa.assign(static_cast<std::size_t>(M), 0);
  for (std::int64_t m = 0; m < M; ++m) {
    Mq scale;
    int za = 0;
    if (act.kind == ActivationQuant::dynamic_per_token) {
      Mq amax = 0;
      for (std::int64_t k = 0; k < K; ++k) amax = std::max(amax, std::fabs(static_cast<Mq>(x[static_cast<std::size_t>(m * K + k)])));
      scale = amax / Mq(act.qmax);
      if (scale == Mq(0)) scale = Mq(1);
    } else {
      scale = static_cast<Mq>(static_cast<float>(act.scale.item()));
      za = static_cast<int>(act.zero_point.item());
    }
    const Mq inv = Mq(1) / scale;
    sa[static_cast<std::size_t>(m)] = static_cast<double>(scale);
    for (std::int64_t k = 0; k < K; ++k) {
      const Mq v = std::nearbyint(static_cast<Mq>(x[static_cast<std::size_t>(m * K + k)]) * inv) + Mq(za);
      aq[static_cast<std::size_t>(m * K + k)] =
          static_cast<int>(std::clamp<Mq>(v, Mq(act.qmin), Mq(act.qmax))) - za;
    }
  }
}

// Reference output (as f64 values of the output dtype).
template <class Me>
std::vector<double> ref_linear(const Tensor& x, const Layer& l, const ActivationQuant& act, DType out) {
  const std::int64_t K = l.K, M = x.numel() / K, N = l.N;
  std::vector<int> aq;
  std::vector<double> sa;
  const auto xv = values(x);
  if (x.dtype() == DType::f64) ref_quant_rows<double>(xv, M, K, act, aq, sa);
  else ref_quant_rows<float>(xv, M, K, act, aq, sa);
  const auto wq = values(l.w_q), sw = values(l.w_scale);
  const auto bv = l.bias.defined() ? values(l.bias) : std::vector<double>();
  std::vector<double> y(static_cast<std::size_t>(M * N));
  for (std::int64_t m = 0; m < M; ++m)
    for (std::int64_t n = 0; n < N; ++n) {
      std::int64_t acc = 0;
      for (std::int64_t k = 0; k < K; ++k)
        acc += static_cast<std::int64_t>(aq[static_cast<std::size_t>(m * K + k)]) *
               static_cast<std::int64_t>(wq[static_cast<std::size_t>(n * K + k)]);
      Me v = static_cast<Me>(static_cast<std::int32_t>(acc)) *
             (static_cast<Me>(sa[static_cast<std::size_t>(m)]) * static_cast<Me>(sw[static_cast<std::size_t>(n)]));
      if (!bv.empty()) v = v + static_cast<Me>(bv[static_cast<std::size_t>(n)]);
      y[static_cast<std::size_t>(m * N + n)] = static_cast<double>(v);
    }
  // Round to the output dtype through the library's own conversion.
  Tensor t = Tensor::from_vector<double>(y, {M * N});
  if (out == DType::f64) return y;
  return values(t.to(DType::f32).to(out));
}

std::vector<double> ref_for(const Tensor& x, const Layer& l, const ActivationQuant& act, DType out) {
  return out == DType::f64 ? ref_linear<double>(x, l, act, out) : ref_linear<float>(x, l, act, out);
}

// The float linear x W^T sb + b in double, for accuracy bounds.
std::vector<double> float_linear(const Tensor& x, const Layer& l) {
  const auto xv = values(x), wq = values(l.w_q), sw = values(l.w_scale);
  const auto bv = l.bias.defined() ? values(l.bias) : std::vector<double>();
  const std::int64_t K = l.K, M = x.numel() / K, N = l.N;
  std::vector<double> y(static_cast<std::size_t>(M * N));
  for (std::int64_t m = 0; m < M; ++m)
    for (std::int64_t n = 0; n < N; ++n) {
      double acc = 0;
      for (std::int64_t k = 0; k < K; ++k)
        acc += xv[static_cast<std::size_t>(m * K + k)] * wq[static_cast<std::size_t>(n * K + k)] *
               sw[static_cast<std::size_t>(n)];
      y[static_cast<std::size_t>(m * N + n)] = acc + (bv.empty() ? 0.0 : bv[static_cast<std::size_t>(n)]);
    }
  return y;
}

const DType kFloat[] = {DType::f32, DType::f64, DType::f16, DType::bf16};

ActivationQuant static_act(float scale, int zp, std::int64_t qmin, std::int64_t qmax, Device dev = Device::cpu()) {
  return ActivationQuant::fixed(Tensor::from_vector<float>({scale}, {1}, dev),
                                Tensor::from_vector<std::int32_t>({zp}, {1}, dev), qmin, qmax);
}

}  // namespace

TEST_CASE("dynamic per-token: every out dtype matches the reference exactly") {
  Layer l = make_layer(24, 40, 1);
  Tensor x = make_x({6, 40}, DType::f32, 2);
  for (DType out : kFloat) {
    CAPTURE(dtype_name(out));
    Tensor y = quantized_linear(x, l.w_q, l.w_scale, l.bias, ActivationQuant::dynamic(), out);
    CHECK(y.dtype() == out);
    CHECK(y.shape() == Shape{6, 24});
    CHECK(values(y) == ref_for(x, l, ActivationQuant::dynamic(), out));
  }
}

TEST_CASE("dynamic per-token: every input dtype matches the reference exactly") {
  Layer l = make_layer(16, 32, 3);
  for (DType dt : kFloat) {
    CAPTURE(dtype_name(dt));
    Tensor x = make_x({5, 32}, dt, 4);
    Tensor y = quantized_linear(x, l.w_q, l.w_scale, l.bias, ActivationQuant::dynamic(), DType::f32);
    CHECK(values(y) == ref_for(x, l, ActivationQuant::dynamic(), DType::f32));
  }
}

TEST_CASE("odd shapes: K and N not multiples of 4, M = 1, no bias") {
  for (auto row : {std::tuple{1, 5, 7}, std::tuple{3, 1, 13}, std::tuple{1, 1, 1}, std::tuple{7, 9, 33}}) {
    const auto& M = std::get<0>(row);
    const auto& N = std::get<1>(row);
    const auto& K = std::get<2>(row);
    CAPTURE(M);
    CAPTURE(N);
    CAPTURE(K);
    for (bool with_bias : {true, false}) {
      Layer l = make_layer(N, K, 5, with_bias);
      Tensor x = make_x({M, K}, DType::f32, 6);
      Tensor y = quantized_linear(x, l.w_q, l.w_scale, l.bias, ActivationQuant::dynamic(), DType::f32);
      CHECK(values(y) == ref_for(x, l, ActivationQuant::dynamic(), DType::f32));
    }
  }
}

TEST_CASE("batched input [B, T, K] gives [B, T, N]; M = 0 gives an empty output") {
  Layer l = make_layer(8, 12, 7);
  Tensor x = make_x({2, 3, 12}, DType::f32, 8);
  Tensor y = quantized_linear(x, l.w_q, l.w_scale, l.bias, ActivationQuant::dynamic());
  CHECK(y.shape() == Shape{2, 3, 8});
  CHECK(values(y) == ref_for(x, l, ActivationQuant::dynamic(), DType::f32));
  Tensor e = quantized_linear(zeros({0, 12}), l.w_q, l.w_scale, l.bias, ActivationQuant::dynamic());
  CHECK(e.shape() == Shape{0, 8});
}

TEST_CASE("W8A8 stays close to the float linear (relative Frobenius error)") {
  Layer l = make_layer(64, 256, 9);
  Tensor x = make_x({32, 256}, DType::f64, 10);
  Tensor y = quantized_linear(x, l.w_q, l.w_scale, l.bias, ActivationQuant::dynamic(), DType::f64);
  CHECK(rel_fro(values(y), float_linear(x, l)) < 0.02);
}

TEST_CASE("static per-tensor, symmetric s8, zero point 0") {
  Layer l = make_layer(10, 20, 11);
  Tensor x = make_x({4, 20}, DType::f32, 12);
  const ActivationQuant act = static_act(0.05f, 0, -128, 127);
  for (DType out : kFloat) {
    Tensor y = quantized_linear(x, l.w_q, l.w_scale, l.bias, act, out);
    CHECK(values(y) == ref_for(x, l, act, out));
  }
}

TEST_CASE("static per-tensor quint8 reduce_range [0, 127] with any zero point in range") {
  Layer l = make_layer(10, 21, 13);
  Tensor x = make_x({4, 21}, DType::f32, 14);
  for (int zp : {0, 17, 64, 127}) {
    CAPTURE(zp);
    const ActivationQuant act = static_act(0.04f, zp, 0, 127);
    for (DType dt : kFloat) {
      Tensor xd = x.to(dt);
      CHECK(values(quantized_linear(xd, l.w_q, l.w_scale, l.bias, act)) == ref_for(xd, l, act, DType::f32));
    }
  }
  // Full quint8 [0, 255] fits s8 after the shift when zp is 127 or 128.
  const ActivationQuant act = static_act(0.04f, 128, 0, 255);
  CHECK(values(quantized_linear(x, l.w_q, l.w_scale, l.bias, act)) == ref_for(x, l, act, DType::f32));
}

TEST_CASE("static per-tensor: non-finite inputs saturate deterministically") {
  Layer l = make_layer(3, 4, 15, false);
  Tensor x = Tensor::from_vector<float>({INFINITY, -INFINITY, NAN, 1.0f}, {1, 4});
  const ActivationQuant act = static_act(0.1f, 0, -127, 127);
  // +inf -> 127, -inf -> -127, NaN -> qmin = -127, 1.0 -> 10.
  const auto wq = values(l.w_q), sw = values(l.w_scale);
  const auto y = values(quantized_linear(x, l.w_q, l.w_scale, Tensor(), act));
  for (int n = 0; n < 3; ++n) {
    const auto k = static_cast<std::size_t>(n * 4);
    const std::int32_t acc = static_cast<std::int32_t>(127 * wq[k] - 127 * wq[k + 1] - 127 * wq[k + 2] + 10 * wq[k + 3]);
    CHECK(y[static_cast<std::size_t>(n)] == static_cast<double>(static_cast<float>(acc) * (0.1f * static_cast<float>(sw[static_cast<std::size_t>(n)]))));
  }
}

TEST_CASE("bias of another float dtype is converted once") {
  Layer l = make_layer(6, 8, 16);
  Tensor x = make_x({2, 8}, DType::f32, 17);
  Tensor b16 = l.bias.to(DType::bf16);
  Layer l2 = l;
  l2.bias = b16.to(DType::f32);
  CHECK(values(quantized_linear(x, l.w_q, l.w_scale, b16, ActivationQuant::dynamic())) ==
        ref_for(x, l2, ActivationQuant::dynamic(), DType::f32));
}

TEST_CASE("bad arguments: x, w_q, w_scale, bias, out_dtype") {
  Layer l = make_layer(4, 8, 18);
  Tensor x = make_x({2, 8}, DType::f32, 19);
  const auto dyn = ActivationQuant::dynamic();
  CHECK_THROWS_AS(quantized_linear(Tensor(), l.w_q, l.w_scale, l.bias, dyn), Error);
  CHECK_THROWS_AS(quantized_linear(x.to(DType::s32), l.w_q, l.w_scale, l.bias, dyn), Error);
  CHECK_THROWS_AS(quantized_linear(Tensor::scalar(1.0f), l.w_q, l.w_scale, l.bias, dyn), Error);
  CHECK_THROWS_AS(quantized_linear(zeros({2, 0}), l.w_q, l.w_scale, l.bias, dyn), Error);
  CHECK_THROWS_AS(quantized_linear(x, l.w_q.to(DType::f32), l.w_scale, l.bias, dyn), Error);
  CHECK_THROWS_AS(quantized_linear(x, l.w_q.reshape({32}), l.w_scale, l.bias, dyn), Error);
  CHECK_THROWS_AS(quantized_linear(make_x({2, 7}, DType::f32, 1), l.w_q, l.w_scale, l.bias, dyn), Error);
  CHECK_THROWS_AS(quantized_linear(x, l.w_q, l.w_scale.to(DType::f64), l.bias, dyn), Error);
  CHECK_THROWS_AS(quantized_linear(x, l.w_q, ones({5}), l.bias, dyn), Error);
  CHECK_THROWS_AS(quantized_linear(x, l.w_q, Tensor::from_vector<float>({1, 0, 1, 1}, {4}), l.bias, dyn), Error);
  CHECK_THROWS_AS(quantized_linear(x, l.w_q, Tensor::from_vector<float>({1, -1, 1, 1}, {4}), l.bias, dyn), Error);
  CHECK_THROWS_AS(quantized_linear(x, l.w_q, Tensor::from_vector<float>({1, NAN, 1, 1}, {4}), l.bias, dyn), Error);
  CHECK_THROWS_AS(quantized_linear(x, l.w_q, Tensor::from_vector<float>({1, INFINITY, 1, 1}, {4}), l.bias, dyn),
                  Error);
  CHECK_THROWS_AS(quantized_linear(x, l.w_q, l.w_scale, ones({5}), dyn), Error);
  CHECK_THROWS_AS(quantized_linear(x, l.w_q, l.w_scale, ones({4}, TensorOptions{}.with_dtype(DType::s32)), dyn), Error);
  CHECK_THROWS_AS(quantized_linear(x, l.w_q, l.w_scale, l.bias, dyn, DType::s8), Error);
  CHECK_THROWS_AS(quantized_linear(x, l.w_q, l.w_scale, l.bias, dyn, DType::s32), Error);
}

TEST_CASE("bad arguments: activation quantization") {
  Layer l = make_layer(4, 8, 20);
  Tensor x = make_x({2, 8}, DType::f32, 21);
  auto run = [&](const ActivationQuant& a) { return quantized_linear(x, l.w_q, l.w_scale, l.bias, a); };
  ActivationQuant dyn = ActivationQuant::dynamic();
  dyn.qmin = 0;
  CHECK_THROWS_AS(run(dyn), Error);  // dynamic needs a signed symmetric range
  dyn.qmin = -128;
  dyn.qmax = 200;
  CHECK_THROWS_AS(run(dyn), Error);
  CHECK_THROWS_AS(run(static_act(0.0f, 0, -128, 127)), Error);
  CHECK_THROWS_AS(run(static_act(-1.0f, 0, -128, 127)), Error);
  CHECK_THROWS_AS(run(static_act(NAN, 0, -128, 127)), Error);
  CHECK_THROWS_AS(run(static_act(INFINITY, 0, -128, 127)), Error);
  CHECK_THROWS_AS(run(static_act(0.1f, 0, 0, 255)), Error);       // shifted [0, 255] does not fit s8
  CHECK_THROWS_AS(run(static_act(0.1f, 200, 0, 255)), Error);     // shifted [-200, 55]
  CHECK_THROWS_AS(run(static_act(0.1f, 300, 0, 127)), Error);     // zp outside [qmin, qmax]
  CHECK_THROWS_AS(run(static_act(0.1f, 0, 10, 10)), Error);       // qmin == qmax
  CHECK_THROWS_AS(run(static_act(0.1f, 0, -200, 50)), Error);     // below -128
  ActivationQuant two = ActivationQuant::fixed(ones({2}), Tensor::from_vector<std::int32_t>({0}, {1}), -128, 127);
  CHECK_THROWS_AS(run(two), Error);
  ActivationQuant f64s = ActivationQuant::fixed(ones({1}, TensorOptions{}.with_dtype(DType::f64)),
                                                Tensor::from_vector<std::int32_t>({0}, {1}), -128, 127);
  CHECK_THROWS_AS(run(f64s), Error);
  ActivationQuant fz = ActivationQuant::fixed(ones({1}), ones({1}), -128, 127);
  CHECK_THROWS_AS(run(fz), Error);
  ActivationQuant none = ActivationQuant::fixed(Tensor(), Tensor(), -128, 127);
  CHECK_THROWS_AS(run(none), Error);
}

// ---- CUDA ----

TEST_CASE("CUDA matches the CPU bit for bit: shapes, out dtypes, bias") {
  QGRAD_REQUIRE_GPU();
  for (auto row : {std::tuple{1, 5, 7}, std::tuple{1, 64, 64}, std::tuple{16, 96, 128}, std::tuple{37, 33, 65},
                         std::tuple{128, 256, 512}, std::tuple{300, 8, 16}}) {
    const auto& M = std::get<0>(row);
    const auto& N = std::get<1>(row);
    const auto& K = std::get<2>(row);
    CAPTURE(M);
    CAPTURE(N);
    CAPTURE(K);
    for (bool with_bias : {true, false}) {
      Layer l = make_layer(N, K, 22, with_bias);
      Tensor x = make_x({M, K}, DType::f32, 23);
      for (DType out : kFloat) {
        Tensor c = quantized_linear(x, l.w_q, l.w_scale, l.bias, ActivationQuant::dynamic(), out);
        Tensor g = quantized_linear(x.cuda(), l.w_q.cuda(), l.w_scale.cuda(),
                                    l.bias.defined() ? l.bias.cuda() : Tensor(), ActivationQuant::dynamic(), out);
        CHECK(bit_equal(c, g));
      }
    }
  }
}

// Dynamic per-token W8A8 of a bf16 x [M, K] (both modes, each out dtype):
// CUDA, called `calls` times, against the CPU bit for bit.
namespace {
void check_dynamic_cuda_matches_cpu(std::int64_t M, std::int64_t N, std::int64_t K, std::uint64_t seed,
                                    std::initializer_list<DType> outs, int calls) {
  CAPTURE(M);
  CAPTURE(N);
  CAPTURE(K);
  Layer l = make_layer(N, K, seed);
  Tensor x = make_x({M, K}, DType::bf16, seed + 1) * 3.0 + 0.25;
  for (QuantMode mode : {QuantMode::symmetric, QuantMode::asymmetric}) {
    const ActivationQuant act = ActivationQuant::dynamic(mode);
    for (DType out : outs) {
      Tensor c = quantized_linear(x, l.w_q, l.w_scale, l.bias, act, out);
      for (int call = 0; call < calls; ++call) {
        Tensor g = quantized_linear(x.cuda(), l.w_q.cuda(), l.w_scale.cuda(), l.bias.cuda(), act, out);
        CHECK(bit_equal(c, g));
      }
    }
  }
}
}  // namespace

TEST_CASE("CUDA decode sizes (the GEMV, M <= 16) match the CPU bit for bit") {
  QGRAD_REQUIRE_GPU();
  // M on both sides of one and two n-tiles; N not a multiple of 16; K padded
  // (1000 -> 1008), one partial iteration (48), and long enough (4160) for
  // the warps' second round of loads and a ragged last iteration.
  for (auto [M, N, K] : {std::tuple{1, 200, 4160}, std::tuple{2, 17, 48}, std::tuple{7, 64, 1000}, std::tuple{8, 1, 64},
                         std::tuple{9, 33, 4160}, std::tuple{15, 200, 512}, std::tuple{16, 4096, 256}})
    check_dynamic_cuda_matches_cpu(M, N, K, 41, {DType::bf16, DType::f32, DType::f64}, 1);
}

TEST_CASE("CUDA past the GEMV (16 < M <= 128) matches the CPU bit for bit, call after call") {
  QGRAD_REQUIRE_GPU();
  // Just past the GEMV's reach: row counts on both sides of 32 and 64; N not
  // a multiple of 16; K in one 64-column block (48), padded (1000 -> 1008)
  // and long (4160, ragged). These few tiles take cuBLASLt's int8 GEMM + the
  // epilogue pass; N = K = 4096 at M = 128 (the benchmark's shape; 32 tiles)
  // takes the Hopper fused GEMM (128 x 32 tiles) on an H100 or H200. Every
  // shape runs twice (a cached plan's second call).
  for (auto [M, N, K] : {std::tuple{17, 200, 4160}, std::tuple{32, 65, 48}, std::tuple{33, 33, 1000},
                         std::tuple{64, 130, 4160}, std::tuple{65, 1, 256}, std::tuple{100, 200, 512},
                         std::tuple{128, 4096, 4096}})
    check_dynamic_cuda_matches_cpu(M, N, K, 43, {DType::bf16, DType::f32}, 2);
}

TEST_CASE("CUDA mid-size shapes (the Hopper fused GEMM) and large ones match the CPU bit for bit") {
  QGRAD_REQUIRE_GPU();
  // All take the sm_90a GEMM with the epilogue fused on an H100 or H200
  // (132 SMs), every edge ragged: M past a 128-row tile, N past a tile (even:
  // pair stores; odd: single stores), K past a 128-byte stage (136 -> 144
  // padded), K of one partial stage (40). The first three fill at most one
  // wave of 128 x 128 tiles (cooperative); the last two run 128 x 128 tiles
  // in ping-pong (the fourth: CTAs of two tiles, so both consumers, and more
  // steps of K than stages, so the consumers' turns matter; its f32 and f64
  // rows are 16-byte multiples, stored by TMA). (dev/cuda/w8a8_fused_gemm
  // checks every configuration at large shapes against cuBLASLt's sums.)
  for (auto [M, N, K] : {std::tuple{1000, 1300, 136}, std::tuple{900, 1281, 200}, std::tuple{700, 2050, 40},
                         std::tuple{1500, 1700, 1000}, std::tuple{2100, 4097, 136}})
    check_dynamic_cuda_matches_cpu(M, N, K, 47, {DType::bf16, DType::f32, DType::f64, DType::f16}, 2);
}

TEST_CASE("CUDA fused GEMM of 128 x 64 and 128 x 32 tiles (up to half a wave of 128 x 128) matches the CPU") {
  QGRAD_REQUIRE_GPU();
  // Between an eighth and a half of a wave of 128 x 128 tiles (132 SMs): 128 x
  // 64 tiles (the first two), and up to a quarter of a wave with M > 64, 128 x
  // 32 tiles (the last two). Ragged M and N (even: pair stores; odd: single
  // stores), K of one stage and a half (200), of several stages and ragged
  // (1000, 4160: more steps than the 8 or 10 stages). Bit for bit.
  for (auto [M, N, K] : {std::tuple{200, 2050, 200}, std::tuple{130, 4097, 1000}, std::tuple{100, 2400, 4160},
                         std::tuple{128, 4097, 1000}})
    check_dynamic_cuda_matches_cpu(M, N, K, 67, {DType::bf16, DType::f32, DType::f64, DType::f16}, 2);
}

TEST_CASE("CUDA fused GEMM storing y by TMA (ragged tiles) matches the CPU bit for bit") {
  QGRAD_REQUIRE_GPU();
  // Rows of y in 16-byte multiples for every out dtype (N % 8 == 0), M and N
  // past a tile: the TMA unit clips the boxes. The first: ping-pong 128 x 128
  // tiles (11 x 15 > one wave), CTAs of two tiles; the second: 128 x 256
  // tiles filling the SMs 8 times over (33 x 33), the 8192^3 kernel.
  check_dynamic_cuda_matches_cpu(1300, 1864, 1000, 59, {DType::bf16, DType::f32, DType::f64, DType::f16}, 2);
  check_dynamic_cuda_matches_cpu(4200, 8200, 40, 61, {DType::bf16, DType::f32}, 1);
}

TEST_CASE("CUDA outputs at the edges of each dtype (subnormal, overflowing) match the CPU bit for bit") {
  QGRAD_REQUIRE_GPU();
  // Weight scales from 1e-44 to 1e37 across the columns put outputs below
  // f16's, bf16's and f32's normal ranges, past f16's and f32's largest
  // values, and through every rounding between: the Hopper GEMM's hardware
  // conversions (first shape, in its window, stored directly; second, past
  // one wave, staged in shared memory and stored by TMA; fourth, 128 x 32
  // tiles, stored directly; full and ragged tiles) and the epilogue pass
  // (third) against the library's encoders on the host.
  for (auto [M, N, K] : {std::tuple{1000, 1300, 136}, std::tuple{1300, 1864, 136}, std::tuple{100, 1300, 136},
                         std::tuple{100, 2400, 136}})
    for (bool with_bias : {false, true}) {
      const int rows = M;  // CAPTURE takes a copy: a structured binding cannot be captured (clang)
      CAPTURE(rows);
      CAPTURE(with_bias);
      Layer l = make_layer(N, K, 53, with_bias);
      std::vector<float> sw(static_cast<std::size_t>(N));
      for (std::int64_t n = 0; n < N; ++n)
        sw[static_cast<std::size_t>(n)] = std::pow(10.0f, -44.0f + 81.0f * static_cast<float>(n % 97) / 96.0f);
      l.w_scale = Tensor::from_vector<float>(sw, {N});
      Tensor x = make_x({M, K}, DType::bf16, 54) * 3.0;
      for (DType out : {DType::bf16, DType::f16, DType::f32}) {
        CAPTURE(out);
        Tensor c = quantized_linear(x, l.w_q, l.w_scale, l.bias, ActivationQuant::dynamic(), out);
        Tensor g = quantized_linear(x.cuda(), l.w_q.cuda(), l.w_scale.cuda(), with_bias ? l.bias.cuda() : Tensor(),
                                    ActivationQuant::dynamic(), out);
        CHECK(bit_equal(c, g));
      }
    }
}

TEST_CASE("CUDA NaN outputs: one NaN encoding on every kernel path, the rest bit for bit") {
  QGRAD_REQUIRE_GPU();
  // Biases that are NaN (quiet and signalling payloads, either sign) and
  // +-inf, weight scales whose products overflow to inf and meet the
  // opposite infinite bias: NaN outputs on the host keep a payload, on the
  // GPU every f32 NaN result is 0x7FFFFFFF, stored as 0x7FFF in f16 and
  // bf16 (the hardware conversions of the Hopper GEMM's epilogue, first two
  // shapes: stored directly, and by TMA; the encoders of the epilogue pass,
  // third; fourth: 128 x 32 tiles). Every other output matches the host bit
  // for bit.
  const std::uint32_t specials[] = {0x7fc00001u, 0xffc12345u, 0x7f800001u, 0xff800010u, 0x7f800000u, 0xff800000u};
  for (auto [M, N, K] : {std::tuple{1000, 1300, 136}, std::tuple{1300, 1864, 136}, std::tuple{100, 1300, 136},
                         std::tuple{100, 2400, 136}}) {
    const int rows = M;  // CAPTURE takes a copy: a structured binding cannot be captured (clang)
    CAPTURE(rows);
    Layer l = make_layer(N, K, 57);
    float* b = l.bias.data<float>();
    float* sw = l.w_scale.data<float>();
    for (std::int64_t n = 0; n < N; n += 7) {
      const std::size_t k = static_cast<std::size_t>(n / 7) % 6;
      std::memcpy(&b[n], &specials[k], sizeof specials[k]);
      if (k >= 4) sw[n] = 3e38f;  // +-inf bias: the products overflow, and inf + -inf is NaN
    }
    Tensor x = make_x({M, K}, DType::bf16, 58) * 3.0;
    for (DType out : {DType::bf16, DType::f16, DType::f32}) {
      CAPTURE(out);
      const Tensor c16 = quantized_linear(x, l.w_q, l.w_scale, l.bias, ActivationQuant::dynamic(), out);
      const Tensor c = c16.to(DType::f32);
      const Tensor g16 = quantized_linear(x.cuda(), l.w_q.cuda(), l.w_scale.cuda(), l.bias.cuda(),
                                          ActivationQuant::dynamic(), out)
                             .cpu();
      std::int64_t nans = 0, bad = 0;
      for (std::int64_t i = 0; i < M * N; ++i) {
        std::uint32_t got = 0, want = 0;
        if (out == DType::f32) {
          std::memcpy(&got, &g16.data<float>()[i], 4);
          std::memcpy(&want, &c16.data<float>()[i], 4);
        } else if (out == DType::bf16) {
          got = g16.data<bfloat16>()[i].bits;
          want = c16.data<bfloat16>()[i].bits;
        } else {
          got = g16.data<half>()[i].bits;
          want = c16.data<half>()[i].bits;
        }
        if (std::isnan(c.data<float>()[i])) {
          ++nans;
          if (got != (out == DType::f32 ? 0x7fffffffu : 0x7fffu)) ++bad;
        } else if (got != want) {
          ++bad;
        }
      }
      CHECK(nans > M);  // NaN in many columns
      CHECK(bad == 0);
    }
  }
}

TEST_CASE("CUDA every input dtype and static activations (device and host qparams) match the CPU") {
  QGRAD_REQUIRE_GPU();
  Layer l = make_layer(48, 80, 24);
  Tensor bias_d = l.bias.cuda();
  for (DType dt : kFloat) {
    Tensor x = make_x({9, 80}, dt, 25);
    CHECK(bit_equal(quantized_linear(x, l.w_q, l.w_scale, l.bias, ActivationQuant::dynamic()),
                    quantized_linear(x.cuda(), l.w_q.cuda(), l.w_scale.cuda(), bias_d, ActivationQuant::dynamic())));
    const ActivationQuant host = static_act(0.03f, 40, 0, 127);
    const ActivationQuant dev = static_act(0.03f, 40, 0, 127, Device::cuda());
    Tensor c = quantized_linear(x, l.w_q, l.w_scale, l.bias, host, DType::bf16);
    CHECK(bit_equal(c, quantized_linear(x.cuda(), l.w_q.cuda(), l.w_scale.cuda(), bias_d, host, DType::bf16)));
    CHECK(bit_equal(c, quantized_linear(x.cuda(), l.w_q.cuda(), l.w_scale.cuda(), bias_d, dev, DType::bf16)));
  }
}

TEST_CASE("CUDA rejects mixed devices") {
  QGRAD_REQUIRE_GPU();
  Layer l = make_layer(4, 8, 26);
  Tensor x = make_x({2, 8}, DType::f32, 27).cuda();
  CHECK_THROWS_AS(quantized_linear(x, l.w_q, l.w_scale.cuda(), Tensor(), ActivationQuant::dynamic()), Error);
  CHECK_THROWS_AS(quantized_linear(x, l.w_q.cuda(), l.w_scale, Tensor(), ActivationQuant::dynamic()), Error);
  CHECK_THROWS_AS(quantized_linear(x, l.w_q.cuda(), l.w_scale.cuda(), l.bias, ActivationQuant::dynamic()), Error);
}

namespace {
// Reference of the asymmetric per-token path: the activation qparams and
// q from dynamic_range_quantize (its own tests pin them to PyTorch), then
// sum_k (q - za) w exactly in int64 and the epilogue in the epilogue type.
template <class Me>
std::vector<double> ref_asymmetric(const Tensor& x, const Layer& l, std::int64_t qmin, std::int64_t qmax, DType out) {
  const std::int64_t K = l.K, M = x.numel() / K, N = l.N;
  const DynamicQuantized dq =
      dynamic_range_quantize(x.reshape({M, K}), QuantScope::per_token(), QuantMode::asymmetric, DType::s8, qmin, qmax);
  const auto q = values(dq.q), sa = values(dq.scale), za = values(dq.zero_point);
  const auto wq = values(l.w_q), sw = values(l.w_scale);
  const auto bv = l.bias.defined() ? values(l.bias) : std::vector<double>();
  std::vector<double> y(static_cast<std::size_t>(M * N));
  for (std::int64_t m = 0; m < M; ++m)
    for (std::int64_t n = 0; n < N; ++n) {
      std::int64_t acc = 0;
      for (std::int64_t k = 0; k < K; ++k)
        acc += (static_cast<std::int64_t>(q[static_cast<std::size_t>(m * K + k)]) -
                static_cast<std::int64_t>(za[static_cast<std::size_t>(m)])) *
               static_cast<std::int64_t>(wq[static_cast<std::size_t>(n * K + k)]);
      Me v = static_cast<Me>(acc) *
             (static_cast<Me>(sa[static_cast<std::size_t>(m)]) * static_cast<Me>(sw[static_cast<std::size_t>(n)]));
      if (!bv.empty()) v = v + static_cast<Me>(bv[static_cast<std::size_t>(n)]);
      y[static_cast<std::size_t>(m * N + n)] = static_cast<double>(v);
    }
  if (out == DType::f64) return y;
  return values(Tensor::from_vector<double>(y, {M * N}).to(DType::f32).to(out));
}
}  // namespace

TEST_CASE("dynamic per-token asymmetric: the zero-point correction matches the reference exactly") {
  for (auto row : {std::tuple{6, 24, 40}, std::tuple{1, 5, 7}, std::tuple{33, 17, 129}}) {
    const auto& M = std::get<0>(row);
    const auto& N = std::get<1>(row);
    const auto& K = std::get<2>(row);
    CAPTURE(M);
    CAPTURE(N);
    CAPTURE(K);
    Layer l = make_layer(N, K, 31);
    // Shifted inputs: the rows' ranges are far from symmetric, so za != 0.
    Tensor x = make_x({M, K}, DType::f32, 32) + 1.5;
    for (DType out : kFloat) {
      CAPTURE(dtype_name(out));
      const auto ref = out == DType::f64 ? ref_asymmetric<double>(x, l, -128, 127, out)
                                         : ref_asymmetric<float>(x, l, -128, 127, out);
      CHECK(values(quantized_linear(x, l.w_q, l.w_scale, l.bias, ActivationQuant::dynamic(QuantMode::asymmetric),
                                    out)) == ref);
    }
    // Precomputed weight row sums give the same bits.
    std::vector<std::int32_t> sums(static_cast<std::size_t>(N), 0);
    const auto wq = values(l.w_q);
    for (std::int64_t n = 0; n < N; ++n)
      for (std::int64_t k = 0; k < K; ++k) sums[static_cast<std::size_t>(n)] += static_cast<std::int32_t>(wq[static_cast<std::size_t>(n * K + k)]);
    ActivationQuant act = ActivationQuant::dynamic(QuantMode::asymmetric);
    act.weight_row_sums = Tensor::from_vector<std::int32_t>(sums, {N});
    CHECK(values(quantized_linear(x, l.w_q, l.w_scale, l.bias, act)) == ref_asymmetric<float>(x, l, -128, 127, DType::f32));
  }
  // A narrower range (torchao-style [-127, 127] is symmetric; any s8 sub-range works).
  Layer l = make_layer(12, 32, 33);
  Tensor x = make_x({5, 32}, DType::f32, 34) + (-0.7);
  ActivationQuant act = ActivationQuant::dynamic(QuantMode::asymmetric);
  act.qmin = -100;
  act.qmax = 90;
  CHECK(values(quantized_linear(x, l.w_q, l.w_scale, l.bias, act)) == ref_asymmetric<float>(x, l, -100, 90, DType::f32));
}

TEST_CASE("dynamic per-token asymmetric: bad arguments") {
  Layer l = make_layer(4, 8, 35);
  Tensor x = make_x({3, 8}, DType::f32, 36);
  ActivationQuant act = ActivationQuant::dynamic(QuantMode::asymmetric);
  act.qmax = 255;
  CHECK_THROWS_WITH_AS(quantized_linear(x, l.w_q, l.w_scale, l.bias, act), doctest::Contains("act.qmin/qmax"), Error);
  act = ActivationQuant::dynamic(QuantMode::asymmetric);
  act.weight_row_sums = Tensor::from_vector<std::int32_t>({1, 2, 3}, {3});
  CHECK_THROWS_WITH_AS(quantized_linear(x, l.w_q, l.w_scale, l.bias, act), doctest::Contains("act.weight_row_sums"), Error);
  act.weight_row_sums = Tensor::from_vector<float>({1, 2, 3, 4}, {4});
  CHECK_THROWS_WITH_AS(quantized_linear(x, l.w_q, l.w_scale, l.bias, act), doctest::Contains("act.weight_row_sums"), Error);
  ActivationQuant sym = ActivationQuant::dynamic();
  sym.weight_row_sums = Tensor::from_vector<std::int32_t>({1, 2, 3, 4}, {4});
  CHECK_THROWS_WITH_AS(quantized_linear(x, l.w_q, l.w_scale, l.bias, sym), doctest::Contains("act.weight_row_sums"), Error);
}

TEST_CASE("CUDA dynamic per-token asymmetric matches the CPU bit for bit") {
  QGRAD_REQUIRE_GPU();
  for (auto row : {std::tuple{1, 5, 7}, std::tuple{16, 96, 128}, std::tuple{37, 33, 65}, std::tuple{128, 256, 512}}) {
    const auto& M = std::get<0>(row);
    const auto& N = std::get<1>(row);
    const auto& K = std::get<2>(row);
    CAPTURE(M);
    CAPTURE(N);
    CAPTURE(K);
    Layer l = make_layer(N, K, 37);
    for (DType dt : kFloat) {
      Tensor x = make_x({M, K}, dt, 38) + 0.8;
      const ActivationQuant act = ActivationQuant::dynamic(QuantMode::asymmetric);
      for (DType out : {DType::f32, DType::bf16}) {
        Tensor c = quantized_linear(x, l.w_q, l.w_scale, l.bias, act, out);
        Tensor g = quantized_linear(x.cuda(), l.w_q.cuda(), l.w_scale.cuda(), l.bias.cuda(), act, out);
        CHECK(bit_equal(c, g));
      }
    }
  }
}
