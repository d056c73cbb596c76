// Registry entry of the FP8 linear (ops/fp8_linear.h): dynamic and given
// activation scales, f32 and bf16 bias, K and N not multiples of 16 (the
// CUDA path pads both), saturating activations (the given scale is small).
#include <cmath>

#include "qgrad/ops/ops.h"
#include "qgrad/ops/registry.h"

namespace qgrad::registry {

namespace {

using Tensors = std::vector<Tensor>;

Tensor f32_on(const std::vector<float>& v, Device d) {
  return Tensor::from_vector(v, Shape{static_cast<std::int64_t>(v.size())}, d);
}

// e4m3 weights [N, K] from normal values times 64 (codes over most of the range).
Tensor fp8_weight(const Shape& s, Generator& g, Device d) { return randn(s, g, on(d), 0.0, 64.0).to(DType::f8e4m3); }

std::vector<BadInput> fp8_linear_errors(Device d) {
  const char* op = "fp8_linear";
  const Tensor x = some({4, 32}, d), u, w = some({8, 32}, d).to(DType::f8e4m3), ws = f32_on({0.01f}, d);
  auto call = [](const Tensor& xx, const Tensor& ww, const Tensor& s, const Tensor& b = Tensor(),
                 DType out = DType::bf16, const Tensor& xs = Tensor()) { fp8_linear(xx, ww, s, b, out, xs); };
  std::vector<BadInput> e = {
      {op, "x", [=] { call(u, w, ws); }},
      {op, "x", [=] { call(some({4, 32}, d, DType::s32), w, ws); }},
      {op, "x", [=] { call(some({4, 32}, d, DType::f64), w, ws); }},
      {op, "x", [=] { call(x.to(DType::f8e4m3), w, ws); }},
      {op, "x", [=] { call(Tensor::scalar(1.0f, d), w, ws); }},
      {op, "x", [=] { call(some({4, 0}, d), some({8, 0}, d).to(DType::f8e4m3), ws); }},
      {op, "w_q", [=] { call(x, u, ws); }},
      {op, "w_q", [=] { call(x, some({8, 32}, d, DType::s8), ws); }},
      {op, "w_q", [=] { call(x, some({8, 32}, d).to(DType::f8e5m2), ws); }},
      {op, "w_q", [=] { call(x, some({8, 32}, d), ws); }},
      {op, "w_q", [=] { call(x, some({32}, d).to(DType::f8e4m3), ws); }},
      {op, "w_q", [=] { call(x, some({8, 16}, d).to(DType::f8e4m3), ws); }},
      {op, "w_q", [=] { call(x, some({0, 32}, d).to(DType::f8e4m3), ws); }},
      {op, "w_scale", [=] { call(x, w, u); }},
      {op, "w_scale", [=] { call(x, w, f32_on({0.01f, 0.02f}, d)); }},
      {op, "w_scale", [=] { call(x, w, f32_on({0.01f}, d).to(DType::f64)); }},
      {op, "w_scale", [=] { call(x, w, f32_on({0.0f}, d)); }, true},
      {op, "w_scale", [=] { call(x, w, f32_on({-0.5f}, d)); }, true},
      {op, "w_scale", [=] { call(x, w, f32_on({NAN}, d)); }, true},
      {op, "w_scale", [=] { call(x, w, f32_on({INFINITY}, d)); }, true},
      {op, "w_scale", [=] { call(x, w, f32_on({1e-45f}, d)); }, true},  // 1 / s overflows
      {op, "bias", [=] { call(x, w, ws, some({8}, d, DType::s32)); }},
      {op, "bias", [=] { call(x, w, ws, some({8}, d, DType::f16)); }},
      {op, "bias", [=] { call(x, w, ws, some({9}, d)); }},
      {op, "bias", [=] { call(x, w, ws, some({1, 8}, d)); }},
      {op, "out_dtype", [=] { call(x, w, ws, Tensor(), DType::f16); }},
      {op, "out_dtype", [=] { call(x, w, ws, Tensor(), DType::s8); }},
      {op, "out_dtype", [=] { call(x, w, ws, Tensor(), DType::f8e4m3); }},
      {op, "x_scale", [=] { call(x, w, ws, Tensor(), DType::bf16, f32_on({0.1f, 0.2f}, d)); }},
      {op, "x_scale", [=] { call(x, w, ws, Tensor(), DType::bf16, f32_on({0.1f}, d).to(DType::bf16)); }},
      {op, "x_scale", [=] { call(x, w, ws, Tensor(), DType::bf16, f32_on({0.0f}, d)); }, true},
      {op, "x_scale", [=] { call(x, w, ws, Tensor(), DType::bf16, f32_on({-0.0f}, d)); }, true},
      {op, "x_scale", [=] { call(x, w, ws, Tensor(), DType::bf16, f32_on({NAN}, d)); }, true},
      {op, "x_scale", [=] { call(x, w, ws, Tensor(), DType::bf16, f32_on({-INFINITY}, d)); }, true}};
  if (d.is_cuda()) {  // operands on another device (host scales are allowed)
    e.push_back({op, "w_q", [=] { call(x, w.cpu(), ws); }});
    e.push_back({op, "bias", [=] { call(x, w, ws, some({8}, Device::cpu())); }});
  }
  return e;
}

}  // namespace

std::vector<OpEntry> fp8_linear_entries() {
  std::vector<OpEntry> e;
  // x [3, 5, 40] (M = 15, K = 40), w_q [24, 40]: CUDA pads K to 48 and N to
  // 32. Outputs: dynamic scale with an f32 bias, a given scale (0.004: x
  // saturates at +-448) without bias, dynamic with a bf16 bias; out_dtype f32
  // for an f32 x, bf16 otherwise.
  e.push_back({"fp8_linear", {"fp8_linear"}, {DType::f32, DType::bf16, DType::f16},
               [](Device d, DType dt, Generator& g) {
                 return Tensors{randn({3, 5, 40}, g, on(d, dt)), fp8_weight({24, 40}, g, d), f32_on({0.002f}, d),
                                randn({24}, g, on(d)), f32_on({0.004f}, d)};
               },
               [](const Tensors& v) {
                 const DType out = v[0].dtype() == DType::f32 ? DType::f32 : DType::bf16;
                 return Tensors{fp8_linear(v[0], v[1], v[2], v[3], out),
                                fp8_linear(v[0], v[1], v[2], Tensor(), out, v[4]),
                                fp8_linear(v[0], v[1], v[2], v[3].to(DType::bf16), out)};
               },
               Promise::within(0, 4e-3, 1.6e-2, 1.6e-2,
                               "cuBLASLt sums the fp8 products in its own order and precision (f32 with periodic "
                               "promotion), the CPU exactly in f64: within 2^-10 of sx sw sum |qx qw| (~3 here) plus "
                               "one ulp of the output (f32 out: 4e-3; bf16 out: 1.6e-2 of max(1, |y|)); x's fp8 bytes and scale "
                               "are bit-identical (tests/test_fp8_linear.cpp)"),
               GradMethod::none, {}, {}, fp8_linear_errors});
  return e;
}

}  // namespace qgrad::registry
