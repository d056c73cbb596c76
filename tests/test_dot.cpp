// Graph export: DOT text of a recorded graph, and rendering with Graphviz.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "helpers.h"

using namespace qgrad;
using namespace qgrad::testing;

namespace {

const TensorOptions f64 = TensorOptions{}.with_dtype(DType::f64);

// relu recorded by hand (the library's relu may live elsewhere).
Tensor my_relu(const Tensor& x) {
  std::vector<double> v = x.detach().to_vector<double>();
  for (double& e : v) e = e > 0 ? e : 0;
  Tensor out = Tensor::from_vector(v, x.shape());
  if (any_requires_grad({x})) {
    Tensor xs = x.detach();
    record("relu", out, {x}, [xs](const Tensor& g) {
      auto gv = g.to_vector<double>();
      auto xv = xs.to_vector<double>();
      for (std::size_t i = 0; i < gv.size(); ++i) gv[i] = xv[i] > 0 ? gv[i] : 0;
      return std::vector<Tensor>{Tensor::from_vector(gv, xs.shape())};
    }, xs.nbytes());
  }
  return out;
}

// A two-layer MLP-like graph of elementwise ops: (relu(x*w1 + b1) * w2 + b2).reshape(-1).
struct Mlp {
  Tensor x, w1, b1, w2, b2, y;
  Mlp() {
    Generator g(11);
    x = randn({4, 3}, g, f64);  // data: a constant, no grad
    w1 = randn({3}, g, f64);
    w1.set_parameter("fc1.weight");
    b1 = randn({3}, g, f64);
    b1.set_parameter("fc1.bias");
    w2 = randn({3}, g, f64);
    w2.set_parameter("fc2.weight");
    b2 = randn({1}, g, f64);
    b2.set_requires_grad(true).set_name("shift");
    Tensor h = my_relu(add(mul(x, w1), b1));
    y = add(mul(h, w2), b2).reshape({-1});
  }
};

int count(const std::string& s, const std::string& what) {
  int n = 0;
  for (std::size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

std::string temp_path(const std::string& leaf) {
  const char* dir = std::getenv("TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/qgrad_test_dot_" + std::to_string(::getpid()) + "_" + leaf;
}

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

bool have_dot() { return std::system("command -v dot >/dev/null 2>&1") == 0; }

}  // namespace

TEST_CASE("to_dot names every op, leaf and parameter of an MLP-like graph") {
  Mlp m;
  const std::string dot = to_dot(m.y);
  INFO(dot);
  CHECK(dot.rfind("digraph qgrad {", 0) == 0);
  CHECK(dot.back() == '\n');
  CHECK(dot.find("}\n") == dot.size() - 2);
  // Ops: two mul, two add, one relu, one reshape, each once.
  CHECK(count(dot, "label=\"mul #") == 2);
  CHECK(count(dot, "label=\"add #") == 2);
  CHECK(count(dot, "label=\"relu #") == 1);
  CHECK(count(dot, "label=\"reshape #") == 1);
  // Output shapes and dtype/device in the op labels.
  CHECK(dot.find("reshape #") != std::string::npos);
  CHECK(dot.find("[12] f64 cpu") != std::string::npos);
  CHECK(dot.find("[4, 3] f64 cpu") != std::string::npos);
  // relu saved its input: 12 doubles.
  CHECK(dot.find("saved 96 B") != std::string::npos);
  // Parameters: named, marked, double border; a plain leaf is not.
  CHECK(dot.find("fc1.weight (param)\\n[3] f64 cpu") != std::string::npos);
  CHECK(dot.find("fc1.bias (param)") != std::string::npos);
  CHECK(dot.find("fc2.weight (param)") != std::string::npos);
  CHECK(count(dot, "peripheries=2") == 3);
  CHECK(dot.find("shift\\n[1] f64 cpu") != std::string::npos);
  CHECK(dot.find("shift (param)") == std::string::npos);
  // The data input is a dashed constant.
  CHECK(count(dot, "style=dashed") == 1);
  CHECK(dot.find("const\\n[4, 3] f64") != std::string::npos);
  // Edges: 6 ops; inputs 2+2+1+2+2+1 = 10 edges, plus one to the output box.
  CHECK(count(dot, " -> ") == 11);
  CHECK(count(dot, " -> out;") == 1);
  // Two-input ops label their edges with the input position.
  CHECK(count(dot, "[label=\"0\"]") == 4);
  CHECK(count(dot, "[label=\"1\"]") == 4);
}

TEST_CASE("to_dot shares nodes reached twice and shows grad dtype and release") {
  Generator g(5);
  Tensor x = randn({2, 2}, g, f64);
  x.set_requires_grad(true).set_name("x");
  Tensor sq = mul(x, x);       // x feeds one node twice
  Tensor z = add(sq, sq);      // sq's node feeds add twice
  const std::string dot = to_dot(z);
  INFO(dot);
  CHECK(count(dot, "label=\"x\\n") == 1);   // one box for the leaf
  CHECK(count(dot, "label=\"mul #") == 1);  // one node for mul
  CHECK(count(dot, " -> ") == 5);           // x->mul twice, mul->add twice, add->out
  z.backward(ones({2, 2}, f64));
  CHECK(to_dot(z).find("(released)") != std::string::npos);

  // An integer output whose gradients travel in f32.
  Tensor xf = rand({3}, g, TensorOptions{}, -1.0, 1.0);
  xf.set_requires_grad(true);
  Tensor q = Tensor::empty({3}, TensorOptions{}.with_dtype(DType::s8));
  record("quantize", q, {xf}, [](const Tensor& gy) { return std::vector<Tensor>{gy}; }, 0, DType::f32, true);
  const std::string qd = to_dot(q);
  CHECK(qd.find("quantize #") != std::string::npos);
  CHECK(qd.find("[3] s8 cpu\\ngrad f32") != std::string::npos);
}

TEST_CASE("to_dot of tensors outside a graph, and argument errors") {
  Tensor plain = ones({2});
  const std::string d1 = to_dot(plain);
  CHECK(count(d1, " -> ") == 0);
  CHECK(d1.find("output\\n[2] f32 cpu") != std::string::npos);
  Tensor leaf = ones({2});
  leaf.set_parameter("w");
  const std::string d2 = to_dot(leaf);
  CHECK(count(d2, " -> ") == 1);
  CHECK(d2.find("w (param)") != std::string::npos);
  CHECK_THROWS_AS(to_dot(Tensor()), Error);
  CHECK_THROWS_AS(write_dot(plain, "/nonexistent-dir/x.dot"), Error);
  CHECK_THROWS_AS(render_dot("a.dot", "a.pdf"), Error);
  CHECK_THROWS_AS(render_dot("", "a.svg"), Error);
}

TEST_CASE("names with quotes are escaped") {
  Tensor w = ones({1});
  w.set_parameter("say \"hi\"\\");
  Tensor y = mul(w, 2.0);
  const std::string dot = to_dot(y);
  CHECK(dot.find("say \\\"hi\\\"\\\\ (param)") != std::string::npos);
}

TEST_CASE("write_dot and render_dot produce a file and an SVG") {
  Mlp m;
  const std::string dot_path = temp_path("mlp.dot"), svg_path = temp_path("mlp.svg");
  write_dot(m.y, dot_path);
  CHECK(slurp(dot_path) == to_dot(m.y));
  if (!have_dot()) {
    CHECK(!render_dot(dot_path, svg_path));
    std::printf("SKIPPED: Graphviz `dot` is not on PATH; rendering not tested\n");
    std::remove(dot_path.c_str());
    return;
  }
  REQUIRE(render_dot(dot_path, svg_path));
  const std::string svg = slurp(svg_path);
  CHECK(svg.find("<svg") != std::string::npos);
  CHECK(svg.find("fc1.weight") != std::string::npos);
  // A file dot cannot parse: render reports failure instead of throwing.
  const std::string bad = temp_path("bad.dot");
  {
    std::ofstream f(bad);
    f << "digraph { a -> ; }";
  }
  CHECK(!render_dot(bad, temp_path("bad.svg")));
  // Without dot on PATH, render_dot says so by returning false.
  const char* old = std::getenv("PATH");
  const std::string saved = old ? old : "";
  ::setenv("PATH", "/nonexistent", 1);
  CHECK(!render_dot(dot_path, svg_path));
  ::setenv("PATH", saved.c_str(), 1);
  for (const std::string& p : {dot_path, svg_path, bad, temp_path("bad.svg")}) std::remove(p.c_str());
}
