// linear's fused GEMM entry points (kernels::linear_forward_gemm,
// kernels::linear_weight_grad) and the cuBLASLt GEMM behind matmul: the CPU
// forms against a double-loop reference; on CUDA (cuBLASLt epilogues, or the
// fallback) against the CPU for f32, f16, bf16 and f64 over shapes that make
// cuBLAS pick split-K, odd shapes, eagerly and inside a CudaGraph capture.
#include "kernels/linalg.h"
#include "train_ops_helpers.h"

using namespace qgrad;
using namespace qgrad::testing;

namespace {

struct Mnk {
  std::int64_t m, n, k;
};

// Split-K shapes of the MLP benchmark and of large layers, plus odd ones.
const std::vector<Mnk> kShapes = {{3, 5, 7},     {256, 10, 256},   {256, 256, 784}, {1, 4096, 4096},
                                  {4096, 1024, 1024}, {33, 17, 65}, {2, 1, 3}};
const DType kDtypes[] = {DType::f32, DType::f16, DType::bf16, DType::f64};

kernels::GemmShape linear_shape(const Mnk& d) { return kernels::GemmShape{1, d.m, d.n, d.k, false, true}; }

// rel_fro bound of a CUDA result against the CPU one: both accumulate in f32
// (f64) in different orders, then round once to the dtype.
double tol_for(DType d) {
  switch (d) {
    case DType::f64: return 1e-12;
    case DType::f32: return 1e-5;
    case DType::f16: return 2e-3;
    default: return 1e-2;  // bf16
  }
}

TensorOptions on(DType d, Device dev) { return opts(d, dev); }

// Seeded inputs in `d` (drawn in f32, so every dtype sees the same values up
// to rounding), scaled to keep f16 sums of 4096 products in range.
Tensor input(const Shape& s, std::uint64_t seed, DType d) { return rnd(s, seed, DType::f32, 0.5).to(d); }

// The double-loop reference of out = x · wᵀ (+ bias).
std::vector<double> ref_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Mnk& d) {
  const auto vx = values(x), vw = values(w);
  const std::vector<double> vb = bias.defined() ? values(bias) : std::vector<double>(static_cast<std::size_t>(d.n), 0.0);
  std::vector<double> out(static_cast<std::size_t>(d.m * d.n));
  for (std::int64_t i = 0; i < d.m; ++i)
    for (std::int64_t j = 0; j < d.n; ++j) {
      double acc = vb[static_cast<std::size_t>(j)];
      for (std::int64_t p = 0; p < d.k; ++p)
        acc += vx[static_cast<std::size_t>(i * d.k + p)] * vw[static_cast<std::size_t>(j * d.k + p)];
      out[static_cast<std::size_t>(i * d.n + j)] = acc;
    }
  return out;
}

// Outputs of the fused entry points on `dev` for inputs made on the host:
// out (forward), gx = dy · w (plain gemm), gw = dyᵀ · x, gb = Σ_rows dy.
// Every output is poisoned first.
struct LinearOutputs {
  Tensor out, gx, gw, gb;
};
LinearOutputs run_linear(Device dev, const Mnk& d, DType dt, bool with_bias, std::uint64_t seed) {
  const Tensor x = input({d.m, d.k}, seed, dt).to(dev), w = input({d.n, d.k}, seed + 1, dt).to(dev);
  const Tensor b = with_bias ? input({d.n}, seed + 2, dt).to(dev) : Tensor();
  const Tensor dy = input({d.m, d.n}, seed + 3, dt).to(dev);
  LinearOutputs r;
  r.out = Tensor::empty({d.m, d.n}, on(dt, dev));
  r.gx = Tensor::empty({d.m, d.k}, on(dt, dev));
  r.gw = Tensor::empty({d.n, d.k}, on(dt, dev));
  if (with_bias) r.gb = Tensor::empty({d.n}, on(dt, dev));
  for (const Tensor* t : {&r.out, &r.gx, &r.gw, &r.gb})
    if (t->defined()) poison(*t);
  const kernels::GemmShape s = linear_shape(d);
  kernels::linear_forward_gemm(s, x, w, b, r.out);
  kernels::gemm(kernels::GemmShape{1, d.m, d.k, d.n, false, false}, dy, w, r.gx);
  kernels::linear_weight_grad(s, dy, x, r.gw, r.gb);
  return r;
}

void check_outputs(const LinearOutputs& got, const LinearOutputs& want, double tol) {
  CHECK(rel_fro(values(got.out), values(want.out)) < tol);
  CHECK(rel_fro(values(got.gx), values(want.gx)) < tol);
  CHECK(rel_fro(values(got.gw), values(want.gw)) < tol);
  if (want.gb.defined()) CHECK(rel_fro(values(got.gb), values(want.gb)) < tol);
}

}  // namespace

// ---------------------------------------------------------------- CPU

TEST_CASE("linear_forward_gemm and linear_weight_grad (CPU) match a double-loop reference") {
  for (const Mnk& d : {Mnk{3, 5, 7}, Mnk{33, 17, 65}, Mnk{2, 1, 3}})
    for (DType dt : {DType::f64, DType::f32})
      for (bool with_bias : {true, false}) {
        INFO("m ", d.m, " n ", d.n, " k ", d.k, " ", dtype_name(dt), " bias ", with_bias);
        const std::uint64_t seed = 500;
        const LinearOutputs r = run_linear(Device::cpu(), d, dt, with_bias, seed);
        const Tensor x = input({d.m, d.k}, seed, dt), w = input({d.n, d.k}, seed + 1, dt);
        const Tensor b = with_bias ? input({d.n}, seed + 2, dt) : Tensor();
        const Tensor dy = input({d.m, d.n}, seed + 3, dt);
        const double tol = dt == DType::f64 ? 1e-13 : 1e-6;
        CHECK(rel_fro(values(r.out), ref_forward(x, w, b, d)) < tol);
        // gw[j, p] = Σ_i dy[i, j] x[i, p]; gb[j] = Σ_i dy[i, j].
        const auto vx = values(x), vdy = values(dy);
        std::vector<double> gw(static_cast<std::size_t>(d.n * d.k), 0.0), gb(static_cast<std::size_t>(d.n), 0.0);
        for (std::int64_t i = 0; i < d.m; ++i)
          for (std::int64_t j = 0; j < d.n; ++j) {
            const double g = vdy[static_cast<std::size_t>(i * d.n + j)];
            gb[static_cast<std::size_t>(j)] += g;
            for (std::int64_t p = 0; p < d.k; ++p)
              gw[static_cast<std::size_t>(j * d.k + p)] += g * vx[static_cast<std::size_t>(i * d.k + p)];
          }
        CHECK(rel_fro(values(r.gw), gw) < tol);
        if (with_bias) CHECK(rel_fro(values(r.gb), gb) < tol);
      }
}

TEST_CASE("linear_forward_gemm with an empty K gives the bias; linear_weight_grad with no rows gives zeros (CPU)") {
  const Tensor x = Tensor::empty({4, 0}, opts()), w = Tensor::empty({3, 0}, opts()), b = rnd({3}, 510);
  Tensor out = Tensor::empty({4, 3}, opts());
  poison(out);
  kernels::linear_forward_gemm(kernels::GemmShape{1, 4, 3, 0, false, true}, x, w, b, out);
  std::vector<double> want;
  for (int r = 0; r < 4; ++r)
    for (double v : values(b)) want.push_back(v);
  CHECK(values(out) == want);
  Tensor gw = Tensor::empty({3, 2}, opts()), gb = Tensor::empty({3}, opts());
  poison(gw);
  poison(gb);
  kernels::linear_weight_grad(kernels::GemmShape{1, 0, 3, 2, false, true}, Tensor::empty({0, 3}, opts()),
                              Tensor::empty({0, 2}, opts()), gw, gb);
  CHECK(values(gw) == std::vector<double>(6, 0.0));
  CHECK(values(gb) == std::vector<double>(3, 0.0));
}

// ---------------------------------------------------------------- CUDA

TEST_CASE("cuda linear_forward_gemm / gemm / linear_weight_grad match the CPU (all dtypes, split-K and odd shapes)") {
  QGRAD_REQUIRE_GPU();
  std::uint64_t seed = 600;
  for (const Mnk& d : kShapes)
    for (DType dt : kDtypes)
      for (bool with_bias : {true, false}) {
        INFO("m ", d.m, " n ", d.n, " k ", d.k, " ", dtype_name(dt), " bias ", with_bias);
        seed += 10;
        const LinearOutputs cuda_r = run_linear(Device::cuda(), d, dt, with_bias, seed);
        const LinearOutputs cpu_r = run_linear(Device::cpu(), d, dt, with_bias, seed);
        check_outputs(cuda_r, cpu_r, tol_for(dt));
      }
}

TEST_CASE("cuda linear forward and backward (ops) match the CPU, with and without bias") {
  QGRAD_REQUIRE_GPU();
  for (const Mnk& d : {Mnk{256, 10, 256}, Mnk{3, 5, 7}, Mnk{64, 256, 784}})
    for (DType dt : kDtypes)
      for (bool with_bias : {true, false}) {
        INFO("m ", d.m, " n ", d.n, " k ", d.k, " ", dtype_name(dt), " bias ", with_bias);
        auto run = [&](Device dev) {
          Tensor x = param(input({d.m, d.k}, 700, dt).to(dev)), w = param(input({d.n, d.k}, 701, dt).to(dev));
          Tensor b = with_bias ? param(input({d.n}, 702, dt).to(dev)) : Tensor();
          Tensor y = linear(x, w, b);
          y.backward(input({d.m, d.n}, 703, dt).to(dev));
          std::vector<Tensor> r{y.detach().cpu(), x.grad().cpu(), w.grad().cpu()};
          if (with_bias) r.push_back(b.grad().cpu());
          return r;
        };
        const auto gc = run(Device::cuda()), gh = run(Device::cpu());
        REQUIRE(gc.size() == gh.size());
        for (std::size_t i = 0; i < gc.size(); ++i) {
          INFO("output ", i);
          CHECK(gc[i].dtype() == dt);
          CHECK(rel_fro(values(gc[i]), values(gh[i])) < tol_for(dt));
        }
      }
}

TEST_CASE("cuda linear backward with only the weight or only the bias requiring grad matches the CPU") {
  QGRAD_REQUIRE_GPU();
  for (int which = 0; which < 2; ++which) {
    INFO((which == 0 ? "weight only" : "bias only"));
    auto run = [&](Device dev) {
      Tensor x = input({40, 24}, 720, DType::f32).to(dev), w = input({12, 24}, 721, DType::f32).to(dev);
      Tensor b = input({12}, 722, DType::f32).to(dev);
      (which == 0 ? w : b).set_requires_grad(true);
      Tensor y = linear(x, w, b);
      y.backward(input({40, 12}, 723, DType::f32).to(dev));
      return (which == 0 ? w : b).grad().cpu();
    };
    CHECK(rel_fro(values(run(Device::cuda())), values(run(Device::cpu()))) < 1e-5);
  }
}

TEST_CASE("cuda batched gemm with accumulate matches the CPU (f32, f16, bf16)") {
  QGRAD_REQUIRE_GPU();
  const std::int64_t batch = 3, m = 33, n = 17, k = 65;
  for (DType dt : {DType::f32, DType::f16, DType::bf16})
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        INFO(dtype_name(dt), " trans_a ", ta, " trans_b ", tb);
        const Tensor a = input(ta ? Shape{batch, k, m} : Shape{batch, m, k}, 730 + ta, dt);
        const Tensor b = input(tb ? Shape{batch, n, k} : Shape{batch, k, n}, 740 + tb, dt);
        const Tensor c0 = input({batch, m, n}, 750, dt);
        const kernels::GemmShape s{batch, m, n, k, ta, tb};
        Tensor cpu_c = c0.clone(), cuda_c = c0.cuda();
        kernels::gemm(s, a, b, cpu_c, true);
        kernels::gemm(s, a.cuda(), b.cuda(), cuda_c, true);
        CHECK(rel_fro(values(cuda_c), values(cpu_c)) < tol_for(dt));
      }
}

TEST_CASE("cuda linear kernels inside a CudaGraph capture replay like eager calls, one launch each") {
  QGRAD_REQUIRE_GPU();
  const Device dev = Device::cuda();
  for (const Mnk& d : {Mnk{256, 10, 256}, Mnk{256, 256, 784}, Mnk{3, 5, 7}})
    for (DType dt : kDtypes) {
      INFO("m ", d.m, " n ", d.n, " k ", d.k, " ", dtype_name(dt));
      const Tensor x = input({d.m, d.k}, 800, dt).to(dev), w = input({d.n, d.k}, 801, dt).to(dev);
      const Tensor b = input({d.n}, 802, dt).to(dev), dy = input({d.m, d.n}, 803, dt).to(dev);
      const kernels::GemmShape s = linear_shape(d), sx{1, d.m, d.k, d.n, false, false};
      auto make = [&] {
        LinearOutputs r;
        r.out = Tensor::empty({d.m, d.n}, on(dt, dev));
        r.gx = Tensor::empty({d.m, d.k}, on(dt, dev));
        r.gw = Tensor::empty({d.n, d.k}, on(dt, dev));
        r.gb = Tensor::empty({d.n}, on(dt, dev));
        return r;
      };
      LinearOutputs eager = make(), graphed = make();
      kernels::linear_forward_gemm(s, x, w, b, eager.out);
      kernels::gemm(sx, dy, w, eager.gx);
      kernels::linear_weight_grad(s, dy, x, eager.gw, eager.gb);
      // One graph per kernel entry point, to count each one's launches.
      CudaGraph fwd, dx, wgrad;
      fwd.capture([&] { kernels::linear_forward_gemm(s, x, w, b, graphed.out); });
      dx.capture([&] { kernels::gemm(sx, dy, w, graphed.gx); });
      wgrad.capture([&] { kernels::linear_weight_grad(s, dy, x, graphed.gw, graphed.gb); });
      for (const Tensor* t : {&graphed.out, &graphed.gx, &graphed.gw, &graphed.gb}) poison(*t);
      fwd.replay();
      dx.replay();
      wgrad.replay();
      cuda_synchronize();
      CHECK(bit_equal(graphed.out, eager.out));
      CHECK(bit_equal(graphed.gx, eager.gx));
      CHECK(bit_equal(graphed.gw, eager.gw));
      CHECK(bit_equal(graphed.gb, eager.gb));
      MESSAGE("kernel launches: forward+bias ", fwd.kernel_node_count(), ", dx ", dx.kernel_node_count(),
              ", dW+db ", wgrad.kernel_node_count());
      // cuBLASLt with the bias epilogue and no separate split-K reduction:
      // one launch each. Promised for f32 (the training dtype); for 16-bit
      // types with odd leading dimensions cuBLASLt may have no algorithm and
      // the (correct, two-launch) fallback runs, so only warn there. BGRADB
      // support depends on cuBLASLt's version and the dtype: warn as well.
      if (dt == DType::f32) {
        CHECK(fwd.kernel_node_count() == 1);
        CHECK(dx.kernel_node_count() == 1);
      } else if (dt != DType::f64) {
        WARN(fwd.kernel_node_count() == 1);
        WARN(dx.kernel_node_count() == 1);
      }
      if (dt != DType::f64) WARN(wgrad.kernel_node_count() == 1);
    }
}
