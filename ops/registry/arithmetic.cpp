// Registry entries: broadcasting arithmetic, matrix products, reductions,
// activations, losses, lerp and the differentiable Tensor conversions.
#include <cmath>
#include <limits>

#include "qgrad/ops/ops.h"
#include "qgrad/ops/registry.h"

namespace qgrad::registry {

namespace {

const std::vector<DType> kFloat = {DType::f64, DType::f32, DType::f16, DType::bf16};
// Reductions and GEMMs sum in another order on each device (block trees,
// cuBLAS): the tolerances of tests/test_reduce.cpp, test_loss.cpp and
// test_linalg.cpp (bf16 GEMM: 6e-2, test_linalg's linear).
Promise summation_order(const char* what) { return Promise::within(1e-12, 1e-5, 1e-2, 1e-2, what); }
Promise gemm(const char* what) { return Promise::within(1e-12, 1e-5, 1e-2, 6e-2, what); }

using Tensors = std::vector<Tensor>;

// Two broadcasting operands [3, 4] and [4] (b kept in [1, 2] when it divides).
MakeInputs two_operands(bool positive_b) {
  return [positive_b](Device d, DType dt, Generator& g) {
    Tensor a = normal({3, 4}, g, d, dt);
    Tensor b = positive_b ? leaf(rand({4}, g, on(d, dt), 1.0, 2.0)) : normal({4}, g, d, dt);
    return Tensors{a, b};
  };
}
MakeInputs one_operand(Shape shape) {
  return [shape](Device d, DType dt, Generator& g) { return Tensors{normal(shape, g, d, dt)}; };
}
// Values kept 0.1 away from 0 (relu's kink, where it has no derivative).
MakeInputs away_from_zero(Shape shape) {
  return [shape](Device d, DType dt, Generator& g) {
    std::vector<double> v = randn(shape, g, on(Device::cpu(), DType::f64)).to_vector<double>();
    for (double& e : v) e += e < 0 ? -0.1 : 0.1;
    return Tensors{leaf(Tensor::from_vector(v, shape).to(dt).to(d))};
  };
}
Tensor labels(Device d) { return Tensor::from_vector<std::int64_t>({0, 3, 4, 1}, {4}, d); }

// The common errors of a floating binary op: non-floating a, shapes that do
// not broadcast, mixed dtypes.
std::function<std::vector<BadInput>(Device)> binary_errors(const char* op,
                                                            std::function<Tensor(const Tensor&, const Tensor&)> f) {
  return [op, f](Device d) {
    Tensor x = zeros({3, 4}, on(d)), i = zeros({3, 4}, on(d, DType::s32));
    return std::vector<BadInput>{{op, "a", [=] { f(i, x); }},
                                 {op, "b", [=] { f(x, zeros({5}, on(d))); }},
                                 {op, "b", [=] { f(x, zeros({3, 4}, on(d, DType::f64))); }},
                                 {op, "a", [=] { f(Tensor(), x); }}};
  };
}


// The argument errors of the arithmetic entries beyond their common ones:
// every non-floating dtype, undefined tensors, axes out of range, shapes.
void add_argument_errors(std::vector<OpEntry>& e) {
  const DType non_float[] = {DType::s8, DType::u8, DType::s32, DType::s64, DType::boolean};
  constexpr double kInf = INFINITY, kNaN = NAN;
  using Bin = Tensor (*)(const Tensor&, const Tensor&);
  const std::pair<const char*, Bin> bins[] = {{"add", [](const Tensor& x, const Tensor& y) { return add(x, y); }},
                                              {"sub", [](const Tensor& x, const Tensor& y) { return sub(x, y); }},
                                              {"mul", [](const Tensor& x, const Tensor& y) { return mul(x, y); }},
                                              {"div", [](const Tensor& x, const Tensor& y) { return div(x, y); }},
                                              {"lerp", [](const Tensor& x, const Tensor& y) { return lerp(x, y, 0.25); }}};
  for (const auto& bin : bins) {
    const char* name = bin.first;
    const Bin f = bin.second;
    extend_bad_inputs(e, name, [name, f, non_float](Device d) {
      const Tensor a = some({2, 3}, d), b = some({2, 3}, d), u;
      std::vector<BadInput> c{{name, "a", [=] { f(u, b); }}, {name, "b", [=] { f(a, u); }}};
      for (DType dt : non_float) c.push_back({name, "a", [=] { f(some({2, 3}, d, dt), b); }});
      c.push_back({name, "b", [=] { f(a, some({2, 3}, d, DType::f64)); }});
      c.push_back({name, "", [=] { f(a, some({4, 3}, d)); }});
      return c;
    });
  }
  extend_bad_inputs(e, "lerp", [](Device d) {
    const Tensor a = some({2, 3}, d), b = some({2, 3}, d), u;
    return std::vector<BadInput>{{"lerp", "weight", [=] { lerp(a, b, kNaN); }},
                                 {"lerp", "weight", [=] { lerp(a, b, kInf); }},
                                 {"lerp", "weight", [=] { lerp(a, b, u); }},
                                 {"lerp", "weight", [=] { lerp(a, b, some({2, 3}, d, DType::s32)); }},
                                 {"lerp", "", [=] { lerp(a, b, some({5}, d)); }}};
  });
  extend_bad_inputs(e, "add, mul (host scalar), neg", [](Device d) {
    const Tensor u;
    return std::vector<BadInput>{{"add", "a", [=] { add(u, 1.0); }},
                                 {"mul", "a", [=] { mul(some({2}, d, DType::s32), 2.0); }},
                                 {"neg", "", [=] { neg(u); }},
                                 {"neg", "", [=] { neg(some({2}, d, DType::s8)); }}};
  });
  // The target must broadcast to the input (it used to read out of bounds).
  extend_bad_inputs(e, "sum_to_shape", [](Device d) {
    const Tensor a = some({2, 3}, d), u;
    return std::vector<BadInput>{{"sum_to_shape", "shape", [=] { sum_to_shape(a, {3, 3}); }},
                                 {"sum_to_shape", "shape", [=] { sum_to_shape(a, {5}); }},
                                 {"sum_to_shape", "shape", [=] { sum_to_shape(a, {1, 2, 3}); }},
                                 {"sum_to_shape", "shape", [=] { sum_to_shape(a, {2, -1}); }},
                                 {"sum_to_shape", "t", [=] { sum_to_shape(some({2, 3}, d, DType::s32), {3}); }},
                                 {"sum_to_shape", "t", [=] { sum_to_shape(u, {3}); }}};
  });
  // Unary float ops: every non-floating dtype; undefined; axes out of range
  // (a scalar has none); empty inputs.
  const std::vector<std::int64_t> bad_axes = {2, -3, 100, std::numeric_limits<std::int64_t>::min()};
  extend_bad_inputs(e, "relu", [non_float](Device d) {
    std::vector<BadInput> c{{"relu", "x", [] { relu(Tensor()); }}};
    for (DType dt : non_float) c.push_back({"relu", "x", [=] { relu(some({3}, d, dt)); }});
    return c;
  });
  extend_bad_inputs(e, "sum", [non_float, bad_axes](Device d) {
    const Tensor a = some({2, 3}, d);
    std::vector<BadInput> c{{"sum", "x", [] { sum(Tensor()); }},
                            {"sum", "axis", [=] { sum(Tensor::scalar(1.5f, d), 0); }}};
    for (DType dt : non_float) c.push_back({"sum", "x", [=] { sum(some({3}, d, dt)); }});
    for (std::int64_t ax : bad_axes) c.push_back({"sum", "axis", [=] { sum(a, ax); }});
    return c;
  });
  extend_bad_inputs(e, "mean", [non_float, bad_axes](Device d) {
    const Tensor a = some({2, 3}, d);
    std::vector<BadInput> c{{"mean", "x", [] { mean(Tensor()); }},
                            {"mean", "x", [=] { mean(some({0, 3}, d)); }},
                            {"mean", "x", [=] { mean(some({0, 3}, d), 0); }}};
    for (DType dt : non_float) c.push_back({"mean", "x", [=] { mean(some({3}, d, dt), 0); }});
    for (std::int64_t ax : bad_axes) c.push_back({"mean", "axis", [=] { mean(a, ax, true); }});
    return c;
  });
  extend_bad_inputs(e, "argmax", [non_float, bad_axes](Device d) {
    const Tensor a = some({2, 3}, d);
    std::vector<BadInput> c{{"argmax", "x", [=] { argmax(some({2, 0}, d), 1); }}};
    for (DType dt : non_float) c.push_back({"argmax", "x", [=] { argmax(some({2, 3}, d, dt)); }});
    for (std::int64_t ax : bad_axes) c.push_back({"argmax", "axis", [=] { argmax(a, ax); }});
    return c;
  });
  extend_bad_inputs(e, "log_softmax", [non_float, bad_axes](Device d) {
    const Tensor a = some({2, 3}, d);
    std::vector<BadInput> c{{"log_softmax", "axis", [=] { log_softmax(Tensor::scalar(1.5f, d), 0); }}};
    for (DType dt : non_float) c.push_back({"log_softmax", "x", [=] { log_softmax(some({2, 3}, d, dt)); }});
    for (std::int64_t ax : bad_axes) c.push_back({"log_softmax", "axis", [=] { log_softmax(a, ax); }});
    return c;
  });
  extend_bad_inputs(e, "transpose", [bad_axes](Device d) {
    const Tensor a = some({2, 3}, d);
    std::vector<BadInput> c{{"transpose", "dim", [=] { transpose(Tensor::scalar(1.5f, d), 0, 0); }},
                            {"transpose", "x", [] { transpose(Tensor(), 0, 1); }},
                            {"transpose", "x", [=] { transpose(some({1, 1, 1, 1, 1, 1, 1, 1, 1}, d), 0, 1); }}};
    for (std::int64_t ax : bad_axes) c.push_back({"transpose", "dim", [=] { transpose(a, ax, 0); }});
    return c;
  });
  extend_bad_inputs(e, "matmul", [](Device d) {
    const Tensor a = some({2, 3}, d), b = some({2, 3}, d), u;
    return std::vector<BadInput>{
        {"matmul", "a", [=] { matmul(u, b); }},
        {"matmul", "b", [=] { matmul(a, u); }},
        {"matmul", "a", [=] { matmul(some({2, 3}, d, DType::s32), some({3, 2}, d)); }},
        {"matmul", "b", [=] { matmul(a, some({3, 2}, d, DType::f64)); }},
        {"matmul", "", [=] { matmul(a, some({2, 3}, d)); }},
        {"matmul", "a", [=] { matmul(some({3}, d), some({3, 2}, d)); }},
        {"matmul", "b", [=] { matmul(some({2, 3}, d), some({3}, d)); }},
        {"matmul", "", [=] { matmul(some({2, 2, 3}, d), some({3, 3, 2}, d)); }},
        {"matmul", "", [=] { matmul(some({2, 1, 2, 3}, d), some({4, 3, 3, 2}, d)); }},
        {"matmul", "a", [=] { matmul(some({1, 1, 1, 1, 1, 1, 1, 1, 2, 3}, d), some({3, 2}, d)); }},
        {"matmul", "b", [=] { matmul(some({5, 2, 3}, d), some({5, 4, 2}, d)); }}};
  });
  extend_bad_inputs(e, "linear", [](Device d) {
    const Tensor a = some({2, 3}, d), u;
    return std::vector<BadInput>{
        {"linear", "x", [=] { linear(u, some({4, 3}, d)); }},
        {"linear", "w", [=] { linear(a, u); }},
        {"linear", "w", [=] { linear(a, some({4, 2}, d)); }},
        {"linear", "w", [=] { linear(a, some({4, 3}, d, DType::f64)); }},
        {"linear", "w", [=] { linear(a, some({4, 3}, d, DType::s8)); }},
        {"linear", "w", [=] { linear(a, some({3}, d)); }},
        {"linear", "bias", [=] { linear(a, some({4, 3}, d), some({3}, d)); }},
        {"linear", "bias", [=] { linear(a, some({4, 3}, d), some({4}, d, DType::s32)); }},
        {"linear", "x", [=] { linear(Tensor::scalar(1.5f, d), some({4, 1}, d)); }}};
  });
  extend_bad_inputs(e, "cross_entropy", [](Device d) {
    const Tensor a = some({2, 3}, d), u;
    const Tensor labels = Tensor::from_vector<std::int64_t>({0, 2}, {2}, d);
    auto s64 = [d](std::vector<std::int64_t> v) {
      const auto n = static_cast<std::int64_t>(v.size());
      return Tensor::from_vector<std::int64_t>(v, {n}, d);
    };
    return std::vector<BadInput>{
        {"cross_entropy", "logits", [=] { cross_entropy(u, labels); }},
        {"cross_entropy", "logits", [=] { cross_entropy(some({2, 3}, d, DType::s32), labels); }},
        {"cross_entropy", "logits", [=] { cross_entropy(some({6}, d), labels); }},
        {"cross_entropy", "logits", [=] { cross_entropy(some({0, 3}, d), s64({})); }},
        {"cross_entropy", "labels", [=] { cross_entropy(a, u); }},
        {"cross_entropy", "labels", [=] { cross_entropy(a, some({2}, d)); }},
        {"cross_entropy", "labels", [=] { cross_entropy(a, s64({0, 1, 2})); }},
        {"cross_entropy", "labels", [=] { cross_entropy(a, s64({0, 3})); }, true},
        {"cross_entropy", "labels", [=] { cross_entropy(a, s64({-1, 0})); }, true}};
  });
}

}  // namespace

std::vector<OpEntry> arithmetic_entries() {
  std::vector<OpEntry> e;
  auto binary = [&](const char* name, std::function<Tensor(const Tensor&, const Tensor&)> f, bool positive_b) {
    e.push_back({name, {name}, kFloat, two_operands(positive_b),
                 [f](const Tensors& v) { return Tensors{f(v[0], v[1])}; }, Promise::bit_identical(),
                 GradMethod::finite_differences, {}, {}, binary_errors(name, f)});
  };
  binary("add", [](const Tensor& a, const Tensor& b) { return add(a, b); }, false);
  binary("sub", [](const Tensor& a, const Tensor& b) { return sub(a, b); }, false);
  binary("mul", [](const Tensor& a, const Tensor& b) { return mul(a, b); }, false);
  binary("div", [](const Tensor& a, const Tensor& b) { return div(a, b); }, true);
  binary("maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); }, false);
  e.push_back({"add, mul (host scalar), neg", {"add", "mul", "neg"}, kFloat, one_operand({3, 5}),
               [](const Tensors& v) { return Tensors{neg(mul(add(v[0], 0.75), -1.5))}; }, Promise::bit_identical(),
               GradMethod::finite_differences, {}, {}, [](Device d) {
                 Tensor i = zeros({2}, on(d, DType::s8));
                 return std::vector<BadInput>{{"add", "a", [=] { add(i, 1.0); }},
                                              {"mul", "a", [=] { mul(i, 2.0); }},
                                              {"neg", "a", [=] { neg(i); }}};
               }});
  e.push_back({"sum_to_shape", {"sum_to_shape"}, kFloat, one_operand({2, 3, 4}),
               [](const Tensors& v) { return Tensors{sum_to_shape(v[0].detach(), {3, 1})}; },
               summation_order("sum order"),
               GradMethod::none,  // a backward helper of the broadcasting ops: not recorded itself
               {}, {}, [](Device d) {
                 Tensor x = zeros({2, 3, 4}, on(d));
                 return std::vector<BadInput>{{"sum_to_shape", "shape", [=] { sum_to_shape(x, {5}); }},
                                              {"sum_to_shape", "t", [=] { sum_to_shape(x.to(DType::s32), {4}); }}};
               }});
  // Batched [2, 3, 4] x [2, 4, 5] plus a plain [3, 4] x [4, 5] (broadcast).
  e.push_back({"matmul", {"matmul"}, kFloat,
               [](Device d, DType dt, Generator& g) {
                 return Tensors{normal({2, 3, 4}, g, d, dt), normal({2, 4, 5}, g, d, dt), normal({3, 4}, g, d, dt),
                                normal({4, 5}, g, d, dt)};
               },
               [](const Tensors& v) { return Tensors{add(matmul(v[0], v[1]), matmul(v[2], v[3]))}; },
               gemm("cuBLAS GEMM"),
               GradMethod::finite_differences, {}, {}, [](Device d) {
                 Tensor a = zeros({3, 4}, on(d));
                 return std::vector<BadInput>{{"matmul", "b", [=] { matmul(a, zeros({5, 2}, on(d))); }},
                                              {"matmul", "a", [=] { matmul(zeros({4}, on(d)), a); }},
                                              {"matmul", "b", [=] { matmul(a, zeros({4, 2}, on(d, DType::f64))); }}};
               }});
  // Broadcast batch dims, one plan each: [2, 1, 3, 4] x [3, 4, 5] (both
  // broadcast: copies), [3, 3, 4] x [4, 5] (b one matrix: one folded GEMM),
  // [3, 4] x [2, 1, 4, 5] (a one matrix: batch stride 0), summed by broadcasting.
  e.push_back({"matmul (broadcast batch)", {"matmul"}, kFloat,
               [](Device d, DType dt, Generator& g) {
                 return Tensors{normal({2, 1, 3, 4}, g, d, dt), normal({3, 4, 5}, g, d, dt), normal({3, 3, 4}, g, d, dt),
                                normal({4, 5}, g, d, dt), normal({3, 4}, g, d, dt), normal({2, 1, 4, 5}, g, d, dt)};
               },
               [](const Tensors& v) {
                 return Tensors{add(add(matmul(v[0], v[1]), matmul(v[2], v[3])), matmul(v[4], v[5]))};
               },
               gemm("cuBLAS GEMM"), GradMethod::finite_differences, {}, {}, [](Device d) {
                 return std::vector<BadInput>{
                     {"matmul", "", [=] { matmul(some({3, 2, 3}, d), some({2, 3, 2}, d)); }},
                     {"matmul", "b", [=] { matmul(some({2, 2, 3}, d), some({2, 2, 2}, d)); }}};
               }});
  for (const bool with_relu : {false, true}) {
    const char* name = with_relu ? "linear_relu" : "linear";
    e.push_back({name, {name}, kFloat,
                 [with_relu](Device d, DType dt, Generator& g) {
                   Tensor x = normal({3, 4}, g, d, dt), w = normal({5, 4}, g, d, dt), b = normal({5}, g, d, dt);
                   if (with_relu) {  // keep the pre-activations away from relu's kink
                     std::vector<double> bv(5);
                     for (std::size_t i = 0; i < bv.size(); ++i) bv[i] = i % 2 ? 3.0 : -3.0;
                     b = leaf(Tensor::from_vector(bv, {5}).to(dt).to(d));
                   }
                   return Tensors{x, w, b};
                 },
                 [with_relu](const Tensors& v) {
                   return Tensors{with_relu ? linear_relu(v[0], v[1], v[2]) : linear(v[0], v[1], v[2])};
                 },
                 gemm("cuBLAS GEMM"), GradMethod::finite_differences, {}, {}, [name, with_relu](Device d) {
                   auto f = [with_relu](const Tensor& x, const Tensor& w, const Tensor& b) {
                     return with_relu ? linear_relu(x, w, b) : linear(x, w, b);
                   };
                   Tensor x = zeros({3, 4}, on(d)), w = zeros({5, 4}, on(d));
                   return std::vector<BadInput>{{name, "w", [=] { f(x, zeros({5, 3}, on(d)), Tensor()); }},
                                                {name, "bias", [=] { f(x, w, zeros({4}, on(d))); }},
                                                {name, "x", [=] { f(zeros({3, 4}, on(d, DType::s8)), w, Tensor()); }}};
                 }});
  }
  // x [2, 3, 4] (a leading batch dim), w [5, 4], bias [5], residual [2, 3, 5].
  e.push_back({"linear_add", {"linear_add"}, kFloat,
               [](Device d, DType dt, Generator& g) {
                 return Tensors{normal({2, 3, 4}, g, d, dt), normal({5, 4}, g, d, dt), normal({5}, g, d, dt),
                                normal({2, 3, 5}, g, d, dt)};
               },
               [](const Tensors& v) { return Tensors{linear_add(v[0], v[1], v[2], v[3])}; }, gemm("cuBLAS GEMM"),
               GradMethod::finite_differences, {}, {}, [](Device d) {
                 Tensor x = zeros({3, 4}, on(d)), w = zeros({5, 4}, on(d)), b = zeros({5}, on(d));
                 return std::vector<BadInput>{
                     {"linear_add", "residual", [=] { linear_add(x, w, b, Tensor()); }},
                     {"linear_add", "residual", [=] { linear_add(x, w, b, zeros({3, 4}, on(d))); }},
                     {"linear_add", "residual", [=] { linear_add(x, w, b, zeros({5}, on(d))); }},
                     {"linear_add", "residual", [=] { linear_add(x, w, b, zeros({3, 5}, on(d, DType::f64))); }},
                     {"linear_add", "residual", [=] { linear_add(x, w, b, zeros({3, 5}, on(d, DType::s32))); }},
                     {"linear_add", "w", [=] { linear_add(x, zeros({5, 3}, on(d)), b, zeros({3, 5}, on(d))); }},
                     {"linear_add", "bias", [=] { linear_add(x, w, zeros({4}, on(d)), zeros({3, 5}, on(d))); }},
                     {"linear_add", "x", [=] { linear_add(Tensor(), w, b, zeros({3, 5}, on(d))); }}};
               }});
  e.push_back({"transpose", {"transpose"}, kFloat, one_operand({3, 4, 2}),
               [](const Tensors& v) { return Tensors{transpose(v[0], 0, 2)}; }, Promise::bit_identical(),
               GradMethod::finite_differences, {}, {}, [](Device d) {
                 Tensor x = zeros({3, 4}, on(d));
                 return std::vector<BadInput>{{"transpose", "dim", [=] { transpose(x, 0, 2); }}};
               }});
  e.push_back({"relu", {"relu"}, kFloat, away_from_zero({3, 5}), [](const Tensors& v) { return Tensors{relu(v[0])}; },
               Promise::bit_identical(), GradMethod::finite_differences, {}, {}, [](Device d) {
                 return std::vector<BadInput>{{"relu", "x", [=] { relu(zeros({2}, on(d, DType::u8))); }},
                                              {"relu", "x", [] { relu(Tensor()); }}};
               }});
  // Inputs in [0.5, 2] (sqrt has no derivative at 0).
  e.push_back({"sqrt", {"sqrt"}, kFloat,
               [](Device d, DType dt, Generator& g) { return Tensors{leaf(rand({3, 5}, g, on(d, dt), 0.5, 2.0))}; },
               [](const Tensors& v) { return Tensors{sqrt(v[0])}; }, Promise::bit_identical(),
               GradMethod::finite_differences, {}, {}, [non_float = std::vector<DType>{DType::s8, DType::u8, DType::s32,
                                                                                     DType::s64, DType::boolean}](Device d) {
                 std::vector<BadInput> c{{"sqrt", "x", [] { sqrt(Tensor()); }}};
                 for (DType dt : non_float) c.push_back({"sqrt", "x", [=] { sqrt(zeros({2}, on(d, dt))); }});
                 return c;
               }});
  e.push_back({"sum", {"sum"}, kFloat, one_operand({3, 4}),
               [](const Tensors& v) { return Tensors{add(sum(v[0], 1), sum(v[0]))}; }, summation_order("sum order"),
               GradMethod::finite_differences, {}, {}, [](Device d) {
                 Tensor x = zeros({3, 4}, on(d));
                 return std::vector<BadInput>{{"sum", "axis", [=] { sum(x, 2); }},
                                              {"sum", "x", [=] { sum(x.to(DType::s32)); }}};
               }});
  e.push_back({"mean", {"mean"}, kFloat, one_operand({3, 4}),
               [](const Tensors& v) { return Tensors{add(mean(v[0], 0, true), mean(v[0]))}; },
               summation_order("sum order"), GradMethod::finite_differences, {}, {}, [](Device d) {
                 Tensor x = zeros({3, 4}, on(d));
                 return std::vector<BadInput>{{"mean", "axis", [=] { mean(x, -3); }}};
               }});
  e.push_back({"argmax", {"argmax"}, kFloat, one_operand({4, 6}),
               [](const Tensors& v) { return Tensors{argmax(v[0], 1), argmax(v[0], 0)}; }, Promise::bit_identical(),
               GradMethod::none, {}, {}, [](Device d) {
                 Tensor x = zeros({3, 4}, on(d));
                 return std::vector<BadInput>{{"argmax", "axis", [=] { argmax(x, 2); }},
                                              {"argmax", "x", [=] { argmax(zeros({0, 4}, on(d)), 0); }}};
               }});
  e.push_back({"log_softmax", {"log_softmax"}, kFloat, one_operand({3, 5}),
               [](const Tensors& v) { return Tensors{log_softmax(v[0], -1)}; }, summation_order("row reduction"),
               GradMethod::finite_differences, {}, {}, [](Device d) {
                 return std::vector<BadInput>{{"log_softmax", "axis", [=] { log_softmax(zeros({3, 4}, on(d)), 2); }}};
               }});
  e.push_back({"cross_entropy", {"cross_entropy"}, kFloat,
               one_operand({4, 5}),  // labels are made in the call: gradcheck takes f64 inputs only
               [](const Tensors& v) { return Tensors{cross_entropy(v[0], labels(v[0].device()))}; }, summation_order("row reduction"),
               GradMethod::finite_differences, {}, {}, [](Device d) {
                 Tensor x = zeros({4, 5}, on(d));
                 std::vector<BadInput> errors{
                     {"cross_entropy", "labels", [=] { cross_entropy(x, zeros({3}, on(d, DType::s64))); }}};
                 // Label values are checked on the CPU only (on CUDA the check would need a host sync).
                 if (d.is_cpu())
                   errors.push_back({"cross_entropy", "labels",
                                     [=] { cross_entropy(x, Tensor::from_vector<std::int64_t>({0, 1, 9, 2}, {4}, d)); }});
                 return errors;
               }});
  e.push_back({"nll_loss", {"nll_loss"}, kFloat,
               one_operand({4, 5}),
               [](const Tensors& v) { return Tensors{nll_loss(v[0], labels(v[0].device()))}; }, summation_order("mean order"),
               GradMethod::finite_differences, {}, {}, [](Device d) {
                 Tensor x = zeros({4, 5}, on(d));
                 std::vector<BadInput> errors{{"nll_loss", "labels", [=] { nll_loss(x, zeros({3}, on(d, DType::s64))); }}};
                 if (d.is_cpu())  // label values: CPU only, as for cross_entropy
                   errors.push_back({"nll_loss", "labels",
                                     [=] { nll_loss(x, Tensor::from_vector<std::int64_t>({0, -1, 2, 2}, {4}, d)); }});
                 return errors;
               }});
  e.push_back({"lerp", {"lerp"}, kFloat,
               [](Device d, DType dt, Generator& g) {
                 return Tensors{normal({3, 4}, g, d, dt), normal({3, 4}, g, d, dt),
                                leaf(rand({4}, g, on(d, dt), -0.2, 1.2))};
               },
               [](const Tensors& v) { return Tensors{add(lerp(v[0], v[1], v[2]), lerp(v[0], v[1], 0.3))}; },
               Promise::bit_identical(), GradMethod::finite_differences, {}, {}, [](Device d) {
                 Tensor a = zeros({3, 4}, on(d));
                 return std::vector<BadInput>{{"lerp", "b", [=] { lerp(a, zeros({5}, on(d)), 0.5); }},
                                              {"lerp", "weight", [=] { lerp(a, a, zeros({3, 4}, on(d, DType::f64))); }}};
               }});
  // Tensor::to(dtype), to(device) (to the other device and back, when a GPU
  // is present), clone, reshape (members defined in ops/); to_batch of the
  // leaf (its gradient's cast deferred), a non-leaf and a tensor already in
  // the dtype.
  OpEntry conversions{"Tensor::to, to_batch, clone, reshape", {"to", "to_batch", "clone", "reshape"}, kFloat,
                      one_operand({3, 4}),
                      [](const Tensors& v) {
                        const DType other = v[0].dtype() == DType::f64 ? DType::f32 : DType::f64;
                        const std::vector<Tensor> b = to_batch({v[0], mul(v[0], 3.0), v[0].to(other)}, other);
                        Tensor y = add(add(b[0], b[1]), b[2]).to(v[0].dtype()).clone().reshape({2, 6});
                        if (cuda_device_count() > 0) {
                          const Device there = v[0].is_cuda() ? Device::cpu() : Device::cuda(0);
                          y = mul(y.to(there), 2.0).to(v[0].device());
                        }
                        return Tensors{mul(y, 2.0)};
                      },
                      Promise::bit_identical(), GradMethod::finite_differences, {}, {}, [](Device d) {
                        Tensor x = zeros({3, 4}, on(d));
                        return std::vector<BadInput>{{"reshape", "shape", [=] { x.reshape({5, -1}); }},
                                                     {"reshape", "shape", [=] { x.reshape({-1, -1}); }},
                                                     {"to_batch", "xs[1]", [=] { to_batch({x, Tensor()}, DType::f64); }}};
                      }};
  // f64 -> f32 -> f64 rounds: finite differences see f32 steps.
  conversions.gradcheck_options.eps = 1e-3;
  conversions.gradcheck_options.atol = 1e-3;
  e.push_back(conversions);
  add_argument_errors(e);
  return e;
}

}  // namespace qgrad::registry
