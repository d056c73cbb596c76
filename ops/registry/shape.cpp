// Registry entries: the shape ops (permute, slice, narrow, cat, split,
// split_with_sizes, chunk). Copies of elements: bit-identical everywhere.
#include <limits>

#include "qgrad/ops/ops.h"
#include "qgrad/ops/registry.h"

namespace qgrad::registry {

namespace {

using Tensors = std::vector<Tensor>;
const std::vector<DType> kFloat = {DType::f64, DType::f32, DType::f16, DType::bf16};
constexpr std::int64_t kMin64 = std::numeric_limits<std::int64_t>::min();

MakeInputs one(Shape shape) {
  return [shape](Device d, DType dt, Generator& g) { return Tensors{normal(shape, g, d, dt)}; };
}

// The device on the other side, when a GPU is present (mixed-device cases).
bool other_device(Device d, Device& other) {
  if (cuda_device_count() == 0) return false;
  other = d.is_cpu() ? Device::cuda(0) : Device::cpu();
  return true;
}

// Undefined x and a scalar x (no dim), for the ops that take one dim.
template <class F>
void common_x_errors(std::vector<BadInput>& c, const char* op, Device d, F f) {
  c.push_back({op, "x", [f] { f(Tensor()); }});
  c.push_back({op, "x", [f, d] { f(Tensor::scalar(1.5f, d)); }});
}

}  // namespace

std::vector<OpEntry> shape_entries() {
  std::vector<OpEntry> e;
  // A rank-4 permutation with a negative entry; the output is a copy.
  e.push_back({"permute", {"permute"}, kFloat, one({2, 3, 4, 5}),
               [](const Tensors& v) { return Tensors{permute(v[0], {2, 0, -1, 1})}; }, Promise::bit_identical(),
               GradMethod::finite_differences, {}, {}, [](Device d) {
                 const char* op = "permute";
                 const Tensor x = some({2, 3, 4}, d);
                 std::vector<BadInput> c{{op, "x", [] { permute(Tensor(), {0}); }},
                                         {op, "dims", [=] { permute(x, {0, 1}); }},
                                         {op, "dims", [=] { permute(x, {0, 1, 2, 3}); }},
                                         {op, "dims", [=] { permute(x, {0, 1, 1}); }},
                                         {op, "dims", [=] { permute(x, {0, 1, 3}); }},
                                         {op, "dims", [=] { permute(x, {0, 1, -4}); }},
                                         {op, "dims", [=] { permute(x, {0, 1, kMin64}); }},
                                         {op, "x", [=] { permute(some({1, 1, 1, 1, 1, 1, 1, 1, 1}, d), {0}); }}};
                 return c;
               }});
  // A stepped slice of the middle dim, and negative bounds on the last.
  e.push_back({"slice", {"slice"}, kFloat, one({3, 7, 4}),
               [](const Tensors& v) { return Tensors{slice(v[0], 1, 1, 7, 2), slice(v[0], -1, -3, 4)}; },
               Promise::bit_identical(), GradMethod::finite_differences, {}, {}, [](Device d) {
                 const char* op = "slice";
                 const Tensor x = some({3, 5}, d);
                 std::vector<BadInput> c;
                 common_x_errors(c, op, d, [](const Tensor& t) { slice(t, 0, 0, 1); });
                 for (std::int64_t dim : std::vector<std::int64_t>{2, -3, 100}) c.push_back({op, "dim", [=] { slice(x, dim, 0, 1); }});
                 c.push_back({op, "start", [=] { slice(x, 1, 6, 6); }});
                 c.push_back({op, "start", [=] { slice(x, 1, -6, 2); }});
                 c.push_back({op, "end", [=] { slice(x, 1, 0, 6); }});
                 c.push_back({op, "end", [=] { slice(x, 1, 0, kMin64); }});
                 c.push_back({op, "end", [=] { slice(x, 1, 3, 2); }});
                 c.push_back({op, "step", [=] { slice(x, 1, 0, 5, 0); }});
                 c.push_back({op, "step", [=] { slice(x, 1, 0, 5, -1); }});
                 return c;
               }});
  e.push_back({"narrow", {"narrow"}, kFloat, one({5, 3, 2}),
               [](const Tensors& v) { return Tensors{narrow(v[0], 0, -4, 3), narrow(v[0], 2, 2, 0)}; },
               Promise::bit_identical(), GradMethod::finite_differences, {}, {}, [](Device d) {
                 const char* op = "narrow";
                 const Tensor x = some({3, 5}, d);
                 std::vector<BadInput> c;
                 common_x_errors(c, op, d, [](const Tensor& t) { narrow(t, 0, 0, 1); });
                 for (std::int64_t dim : std::vector<std::int64_t>{2, -3, kMin64}) c.push_back({op, "dim", [=] { narrow(x, dim, 0, 1); }});
                 c.push_back({op, "start", [=] { narrow(x, 1, 6, 0); }});
                 c.push_back({op, "start", [=] { narrow(x, 1, -6, 1); }});
                 c.push_back({op, "length", [=] { narrow(x, 1, 2, 4); }});
                 c.push_back({op, "length", [=] { narrow(x, 1, 0, -1); }});
                 c.push_back({op, "length", [=] { narrow(x, 1, -1, 2); }});
                 c.push_back({op, "length", [=] { narrow(x, 1, 1, std::numeric_limits<std::int64_t>::max()); }});
                 return c;
               }});
  // Three operands along the middle dim (one of size 1) and two along dim 0.
  e.push_back({"cat", {"cat"}, kFloat,
               [](Device d, DType dt, Generator& g) {
                 return Tensors{normal({2, 3, 2}, g, d, dt), normal({2, 1, 2}, g, d, dt), normal({2, 4, 2}, g, d, dt)};
               },
               [](const Tensors& v) { return Tensors{cat({v[0], v[1], v[2]}, -2), cat({v[0], v[0]})}; },
               Promise::bit_identical(), GradMethod::finite_differences, {}, {}, [](Device d) {
                 const char* op = "cat";
                 const Tensor a = some({2, 3}, d), b = some({2, 4}, d), u;
                 std::vector<BadInput> c{{op, "tensors", [] { cat({}); }},
                                         {op, "tensors[0]", [=] { cat({u, a}); }},
                                         {op, "tensors[1]", [=] { cat({a, u}, 1); }},
                                         {op, "tensors[0]", [=] { cat({Tensor::scalar(1.5f, d)}); }},
                                         {op, "tensors[1]", [=] { cat({a, b}, 0); }},
                                         {op, "tensors[1]", [=] { cat({a, some({2, 3, 1}, d)}, 1); }},
                                         {op, "tensors[2]", [=] { cat({a, b, some({2, 3}, d, DType::f64)}, 1); }},
                                         {op, "tensors[1]", [=] { cat({a, some({2, 3}, d, DType::s32)}); }},
                                         {op, "dim", [=] { cat({a, b}, 2); }},
                                         {op, "dim", [=] { cat({a, b}, -3); }}};
                 Device o;
                 if (other_device(d, o)) c.push_back({op, "tensors[1]", [=] { cat({a, some({2, 4}, o)}, 1); }});
                 return c;
               }});
  // Pieces 2, 2, 1 of dim 0; the middle piece unused (its rows get zeros),
  // the last one broadcast onto the first.
  e.push_back({"split", {"split"}, kFloat, one({5, 3}),
               [](const Tensors& v) {
                 std::vector<Tensor> p = split(v[0], 2);
                 if (p.size() != 3) return p;  // another input (the fuzzer's): the pieces as they are
                 return Tensors{add(p[0], mul(p[2], 3.0)), p[1]};
               },
               Promise::bit_identical(), GradMethod::finite_differences, {}, {}, [](Device d) {
                 const char* op = "split";
                 const Tensor x = some({4, 3}, d);
                 std::vector<BadInput> c;
                 common_x_errors(c, op, d, [](const Tensor& t) { split(t, 1); });
                 c.push_back({op, "split_size", [=] { split(x, 0); }});
                 c.push_back({op, "split_size", [=] { split(x, -2); }});
                 c.push_back({op, "dim", [=] { split(x, 1, 2); }});
                 return c;
               }});
  e.push_back({"split_with_sizes", {"split_with_sizes"}, kFloat, one({3, 6}),
               [](const Tensors& v) {
                 std::vector<Tensor> p = split_with_sizes(v[0], {1, 3, 2}, -1);
                 return Tensors{mul(p[0], p[2]), p[1]};
               },
               Promise::bit_identical(), GradMethod::finite_differences, {}, {}, [](Device d) {
                 const char* op = "split_with_sizes";
                 const Tensor x = some({3, 6}, d);
                 std::vector<BadInput> c;
                 common_x_errors(c, op, d, [](const Tensor& t) { split_with_sizes(t, {1}); });
                 c.push_back({op, "sizes", [=] { split_with_sizes(x, {}, 1); }});
                 c.push_back({op, "sizes", [=] { split_with_sizes(x, {1, 3}, 1); }});
                 c.push_back({op, "sizes", [=] { split_with_sizes(x, {4, 3}, 1); }});
                 c.push_back({op, "sizes", [=] { split_with_sizes(x, {7, -1}, 1); }});
                 c.push_back({op, "dim", [=] { split_with_sizes(x, {6}, 2); }});
                 return c;
               }});
  // 7 columns in 3 chunks: 3, 3, 1; the first two multiplied (two uses of x).
  e.push_back({"chunk", {"chunk"}, kFloat, one({2, 7}),
               [](const Tensors& v) {
                 std::vector<Tensor> p = chunk(v[0], 3, 1);
                 if (p.size() != 3) return p;  // another input (the fuzzer's): the pieces as they are
                 return Tensors{add(mul(p[0], p[1]), p[2])};
               },
               Promise::bit_identical(), GradMethod::finite_differences, {}, {}, [](Device d) {
                 const char* op = "chunk";
                 const Tensor x = some({2, 7}, d);
                 std::vector<BadInput> c;
                 common_x_errors(c, op, d, [](const Tensor& t) { chunk(t, 2); });
                 c.push_back({op, "chunks", [=] { chunk(x, 0); }});
                 c.push_back({op, "chunks", [=] { chunk(x, -1, 1); }});
                 c.push_back({op, "dim", [=] { chunk(x, 2, -3); }});
                 return c;
               }});
  return e;
}

}  // namespace qgrad::registry
