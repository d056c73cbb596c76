// Registry entries: broadcasting arithmetic, matrix products, reductions,
// activations, losses, lerp and the differentiable Tensor conversions.
#include "qgrad/ops/ops.h"
#include "qgrad/ops/registry.h"

namespace qgrad::registry {

namespace {

const std::vector<DType> kFloat = {DType::f64, DType::f32, DType::f16, DType::bf16};
// GEMMs and reductions sum in another order on each device (cuBLAS, block
// trees): a few ulps per term at the registry's small sizes.
Promise summation_order(const char* what) { return Promise::within(64, what); }

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
  e.push_back({"matmul", {"matmul"}, kFloat,
               [](Device d, DType dt, Generator& g) {
                 return Tensors{normal({2, 3, 4}, g, d, dt), normal({2, 4, 5}, g, d, dt)};
               },
               [](const Tensors& v) { return Tensors{matmul(v[0], v[1])}; }, summation_order("cuBLAS GEMM"),
               GradMethod::finite_differences, {}, {}, [](Device d) {
                 Tensor a = zeros({3, 4}, on(d));
                 return std::vector<BadInput>{{"matmul", "b", [=] { matmul(a, zeros({5, 2}, on(d))); }},
                                              {"matmul", "a", [=] { matmul(zeros({4}, on(d)), a); }},
                                              {"matmul", "b", [=] { matmul(a, zeros({4, 2}, on(d, DType::f64))); }}};
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
                 summation_order("cuBLAS GEMM"), GradMethod::finite_differences, {}, {}, [name, with_relu](Device d) {
                   auto f = [with_relu](const Tensor& x, const Tensor& w, const Tensor& b) {
                     return with_relu ? linear_relu(x, w, b) : linear(x, w, b);
                   };
                   Tensor x = zeros({3, 4}, on(d)), w = zeros({5, 4}, on(d));
                   return std::vector<BadInput>{{name, "w", [=] { f(x, zeros({5, 3}, on(d)), Tensor()); }},
                                                {name, "bias", [=] { f(x, w, zeros({4}, on(d))); }},
                                                {name, "x", [=] { f(zeros({3, 4}, on(d, DType::s8)), w, Tensor()); }}};
                 }});
  }
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
  // Tensor::to(dtype), to(device), clone, reshape (members defined in ops/).
  OpEntry conversions{"Tensor::to, clone, reshape", {"to", "clone", "reshape"}, kFloat, one_operand({3, 4}),
                      [](const Tensors& v) {
                        const DType other = v[0].dtype() == DType::f64 ? DType::f32 : DType::f64;
                        return Tensors{mul(v[0].to(other).to(v[0].dtype()).clone().reshape({2, 6}), 2.0)};
                      },
                      Promise::bit_identical(), GradMethod::finite_differences, {}, {}, [](Device d) {
                        Tensor x = zeros({3, 4}, on(d));
                        return std::vector<BadInput>{{"reshape", "shape", [=] { x.reshape({5, -1}); }},
                                                     {"reshape", "shape", [=] { x.reshape({-1, -1}); }}};
                      }};
  // f64 -> f32 -> f64 rounds: finite differences see f32 steps.
  conversions.gradcheck_options.eps = 1e-3;
  conversions.gradcheck_options.atol = 1e-3;
  e.push_back(conversions);
  return e;
}

}  // namespace qgrad::registry
