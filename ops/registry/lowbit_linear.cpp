// Registry entries: the int4 linear layers (ops/lowbit_linear.h), W4A16 and
// W4A8. Inference ops: no gradient. Host references (dequantize_int4 + f64
// math): tests/test_lowbit_linear.cpp.
#include <cmath>

#include "qgrad/ops/ops.h"
#include "qgrad/ops/registry.h"

namespace qgrad::registry {

namespace {

using Tensors = std::vector<Tensor>;
using I64 = std::int64_t;

// Packed int4 weights [N, K] with values in [lo, hi] (s4: [-8, 7], u4: [0, 15]).
Tensor int4_weight(I64 N, I64 K, Generator& g, Device d, DType qtype) {
  const bool s = qtype == DType::s4;
  return randint(s ? -8 : 0, s ? 8 : 16, {N, K}, g, on(d, DType::s32)).to(qtype);
}
Tensor group_scales(I64 N, I64 groups, Generator& g, Device d) { return rand({N, groups}, g, on(d), 0.01, 0.05); }

std::vector<BadInput> w4a16_errors(Device d) {
  const char* op = "linear_w4a16";
  const Tensor x = some({3, 64}, d), w = zeros({5, 64}, on(d)).to(DType::s4), s = full({5, 2}, 0.1, on(d));
  const Tensor wu = zeros({5, 64}, on(d)).to(DType::u4), z = zeros({5, 2}, on(d, DType::s32)), u;
  auto call = [=](const Tensor& xx, const Tensor& ww, const Tensor& ss, const Tensor& zz, I64 G, const Tensor& b) {
    (void)linear_w4a16(xx, ww, ss, zz, G, b);
  };
  return std::vector<BadInput>{
      {op, "x", [=] { call(u, w, s, u, 32, u); }},
      {op, "x", [=] { call(some({3, 64}, d, DType::s32), w, s, u, 32, u); }},
      {op, "x", [=] { call(some({3, 64}, d, DType::f64), w, s, u, 32, u); }},
      {op, "x", [=] { call(Tensor::scalar(1.0f, d), w, s, u, 32, u); }},
      {op, "w_q", [=] { call(x, some({5, 64}, d, DType::s8), s, u, 32, u); }},
      {op, "w_q", [=] { call(x, zeros({5, 62}, on(d)).to(DType::s4), s, u, 31, u); }},
      {op, "w_q", [=] { call(some({3, 63}, d), zeros({5, 63}, on(d)).to(DType::s4), full({5, 1}, 0.1, on(d)), u, 63, u); }},
      {op, "w_q", [=] { call(x, zeros({64}, on(d)).to(DType::s4), s, u, 32, u); }},
      {op, "group_size", [=] { call(x, w, s, u, 0, u); }},
      {op, "group_size", [=] { call(x, w, full({5, 1}, 0.1, on(d)), u, 48, u); }},
      {op, "w_scale", [=] { call(x, w, full({5, 3}, 0.1, on(d)), u, 32, u); }},
      {op, "w_scale", [=] { call(x, w, full({5, 2}, 0.1, on(d, DType::f64)), u, 32, u); }},
      {op, "w_scale", [=] { call(x, w, full({5, 2}, 0.0, on(d)), u, 32, u); }, true},
      {op, "w_zero_point", [=] { call(x, w, s, z, 32, u); }},
      {op, "w_zero_point", [=] { call(x, wu, s, u, 32, u); }},
      {op, "w_zero_point", [=] { call(x, wu, s, zeros({5, 2}, on(d)), 32, u); }},
      {op, "w_zero_point", [=] { call(x, wu, s, zeros({5, 1}, on(d, DType::s32)), 32, u); }},
      {op, "w_zero_point", [=] { call(x, wu, s, full({5, 2}, 16, on(d, DType::s32)), 32, u); }, true},
      {op, "bias", [=] { call(x, w, s, u, 32, zeros({4}, on(d))); }},
      {op, "bias", [=] { call(x, w, s, u, 32, zeros({5}, on(d, DType::s32))); }},
      // The packed weight (pack_w4a16 checks what linear_w4a16 checks of it).
      {"pack_w4a16", "w_q", [=] { (void)pack_w4a16(u, s, u, 32); }},
      {"pack_w4a16", "w_q", [=] { (void)pack_w4a16(some({5, 64}, d, DType::s8), s, u, 32); }},
      {"pack_w4a16", "w_q", [=] { (void)pack_w4a16(zeros({5, 63}, on(d)).to(DType::s4), s, u, 63); }},
      {"pack_w4a16", "w_q", [=] { (void)pack_w4a16(zeros({64}, on(d)).to(DType::s4), s, u, 32); }},
      {"pack_w4a16", "group_size", [=] { (void)pack_w4a16(w, s, u, 0); }},
      {"pack_w4a16", "group_size", [=] { (void)pack_w4a16(w, full({5, 1}, 0.1, on(d)), u, 48); }},
      {"pack_w4a16", "w_scale", [=] { (void)pack_w4a16(w, full({5, 3}, 0.1, on(d)), u, 32); }},
      {"pack_w4a16", "w_scale", [=] { (void)pack_w4a16(w, full({5, 2}, 0.1, on(d, DType::f64)), u, 32); }},
      {"pack_w4a16", "w_scale", [=] { (void)pack_w4a16(w, full({5, 2}, 0.0, on(d)), u, 32); }, true},
      {"pack_w4a16", "w_zero_point", [=] { (void)pack_w4a16(w, s, z, 32); }},
      {"pack_w4a16", "w_zero_point", [=] { (void)pack_w4a16(wu, s, u, 32); }},
      {"pack_w4a16", "w_zero_point", [=] { (void)pack_w4a16(wu, s, full({5, 2}, 16, on(d, DType::s32)), 32); }, true},
      {op, "w", [=] { (void)linear_w4a16(x, PackedW4A16()); }},
      {op, "x", [=] { (void)linear_w4a16(some({3, 32}, d), pack_w4a16(w, s, u, 32)); }},
      {op, "x", [=] { (void)linear_w4a16(some({3, 64}, d, DType::f64), pack_w4a16(w, s, u, 32)); }},
      {op, "w", [=] { (void)linear_w4a16(x, pack_w4a16(w, full({5, 2}, 0.1, on(d, DType::bf16)), u, 32)); }},
      {op, "bias", [=] { (void)linear_w4a16(x, pack_w4a16(w, s, u, 32), zeros({4}, on(d))); }}};
}

std::vector<BadInput> w4a8_errors(Device d) {
  const char* op = "linear_w4a8";
  const Tensor x = some({3, 64}, d), w = zeros({5, 64}, on(d)).to(DType::s4), s = full({5, 2}, 0.1, on(d)), u;
  auto call = [=](const Tensor& xx, const Tensor& ww, const Tensor& ss, I64 G, const Tensor& b) {
    (void)linear_w4a8(xx, ww, ss, G, b);
  };
  return std::vector<BadInput>{
      {op, "x", [=] { call(u, w, s, 32, u); }},
      {op, "x", [=] { call(some({3, 64}, d, DType::s8), w, s, 32, u); }},
      {op, "x", [=] { call(some({3, 64}, d, DType::f64), w, s, 32, u); }},
      {op, "w_q", [=] { call(x, zeros({5, 64}, on(d)).to(DType::u4), s, 32, u); }},
      {op, "w_q", [=] { call(x, some({5, 64}, d, DType::s8), s, 32, u); }},
      {op, "w_q", [=] { call(x, zeros({5, 32}, on(d)).to(DType::s4), s, 32, u); }},
      {op, "w_q", [=] { call(some({3, 63}, d), zeros({5, 63}, on(d)).to(DType::s4), full({5, 1}, 0.1, on(d)), 63, u); }},
      {op, "group_size", [=] { call(x, w, s, -32, u); }},
      {op, "group_size", [=] { call(x, w, full({5, 1}, 0.1, on(d)), 48, u); }},
      {op, "w_scale", [=] { call(x, w, full({5, 4}, 0.1, on(d)), 32, u); }},
      {op, "w_scale", [=] { call(x, w, zeros({5, 2}, on(d, DType::s32)), 32, u); }},
      {op, "w_scale", [=] { call(x, w, full({5, 2}, NAN, on(d)), 32, u); }, true},
      {op, "bias", [=] { call(x, w, s, 32, zeros({5, 1}, on(d))); }},
      {op, "out_dtype", [=] { (void)linear_w4a8(x, w, s, 32, u, QuantMode::asymmetric, DType::f64); }},
      {op, "out_dtype", [=] { (void)linear_w4a8(x, w, s, 32, u, QuantMode::symmetric, DType::s8); }},
      {op, "w_s8", [=] { (void)linear_w4a8(x, w, s, 32, u, QuantMode::symmetric, DType::f32, zeros({5, 64}, on(d))); }},
      {op, "w_s8", [=] { (void)linear_w4a8(x, w, s, 32, u, QuantMode::symmetric, DType::f32,
                                          zeros({5, 32}, on(d)).to(DType::s8)); }},
      {op, "w_s8", [=] { (void)linear_w4a8(x, w, s, 32, u, QuantMode::symmetric, DType::f32,
                                          full({5, 64}, 1.0, on(d)).to(DType::s8)); }, true}};
}

}  // namespace

std::vector<OpEntry> lowbit_linear_entries() {
  std::vector<OpEntry> e;
  // W4A16 in every activation dtype: s4 groups of 32 with a bias at M = 5
  // (CUDA: the tensor-core GEMV for 16-bit x), u4 with zero points, groups of
  // 64, over x [2, 3, 128] (M = 6), and M = 130 (CUDA: dequantize + cuBLAS);
  // the first two again with the weight packed (pack_w4a16: CUDA, the split-K
  // GEMV on the fragment order).
  e.push_back({"linear_w4a16", {"linear_w4a16", "pack_w4a16"}, {DType::f32, DType::f16, DType::bf16},
               [](Device d, DType dt, Generator& g) {
                 return Tensors{normal({5, 128}, g, d, dt),
                                int4_weight(24, 128, g, d, DType::s4),
                                group_scales(24, 4, g, d),
                                normal({24}, g, d, dt),
                                normal({2, 3, 128}, g, d, dt),
                                int4_weight(40, 128, g, d, DType::u4),
                                group_scales(40, 2, g, d),
                                randint(0, 16, {40, 2}, g, on(d, DType::s32)),
                                normal({130, 96}, g, d, dt),
                                int4_weight(16, 96, g, d, DType::s4),
                                group_scales(16, 3, g, d)};
               },
               [](const Tensors& v) {
                 return Tensors{linear_w4a16(v[0].detach(), v[1], v[2], Tensor(), 32, v[3].detach()),
                                linear_w4a16(v[4].detach(), v[5], v[6], v[7], 64),
                                linear_w4a16(v[8].detach(), v[9], v[10], Tensor(), 32),
                                linear_w4a16(v[0].detach(), pack_w4a16(v[1], v[2], Tensor(), 32), v[3].detach()),
                                linear_w4a16(v[4].detach(), pack_w4a16(v[5], v[6], v[7], 64))};
               },
               Promise::within(0, 1e-4, 2e-3, 1.6e-2,
                               "f32 dot products summed in a different order (CPU: Eigen GEMM; CUDA: the tensor-core "
                               "GEMV's warp split, or cuBLAS): the outputs may differ by an f32 rounding before the "
                               "one rounding to x's dtype, so by one ulp of f16/bf16"),
               GradMethod::none, {}, {}, w4a16_errors});
  // W4A8: asymmetric activations with groups of 32 and a bias (the grouped
  // kernel's dp4a path), per channel symmetric (CUDA: widened weight through
  // cuBLASLt; again with the caller's widened weight w_s8), per channel
  // asymmetric, and groups of 6 over K = 30 (the
  // scalar path), bf16 output.
  e.push_back({"linear_w4a8", {"linear_w4a8"}, {DType::f32, DType::f16, DType::bf16},
               [](Device d, DType dt, Generator& g) {
                 return Tensors{normal({7, 64}, g, d, dt),     int4_weight(24, 64, g, d, DType::s4),
                                group_scales(24, 2, g, d),     normal({24}, g, d, DType::f32),
                                group_scales(24, 1, g, d),     normal({3, 30}, g, d, dt),
                                int4_weight(10, 30, g, d, DType::s4), group_scales(10, 5, g, d)};
               },
               [](const Tensors& v) {
                 const Tensor x = v[0].detach();
                 return Tensors{linear_w4a8(x, v[1], v[2], 32, v[3].detach()),
                                linear_w4a8(x, v[1], v[4], 64, v[3].detach(), QuantMode::symmetric),
                                linear_w4a8(x, v[1], v[4], 64, v[3].detach(), QuantMode::symmetric, DType::f32,
                                            v[1].to(DType::s8)),
                                linear_w4a8(x, v[1], v[4], 64, Tensor(), QuantMode::asymmetric, DType::f16),
                                linear_w4a8(v[5].detach(), v[6], v[7], 6, Tensor(), QuantMode::symmetric,
                                            DType::bf16)};
               },
               Promise::bit_identical(), GradMethod::none, {}, {}, w4a8_errors});
  return e;
}

}  // namespace qgrad::registry
