// qgrad-gradcheck-tour: checks the backward of every differentiable op on
// every available device (the CPU; CUDA when a GPU is present) and prints
// one table row per (op, dtype, device):
//   gradcheck  f64: analytical Jacobian vs central finite differences
//              (autograd/gradcheck.h, full mode);
//   host ref   f64: ops whose gradient is not the derivative of the forward
//              (quantize -> dequantize passes the straight-through
//              gradient; LSQ's scale / zero-point gradients are PyTorch's
//              formulas, not the true derivative of a step function), so
//              finite differences cannot check them: the gradients are
//              compared with a host transcription of the documented formulas;
//   vs f64     f32, f16, bf16: forward and input gradients computed in that
//              dtype against the f64 result, with a tolerance per dtype.
// The last line is "N passed, M failed"; the exit code is 1 if any failed.
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "qgrad/qgrad.h"

using namespace qgrad;

namespace {

TensorOptions f64_on(Device dev) { return TensorOptions{}.with_dtype(DType::f64).with_device(dev); }

Tensor leaf(Tensor t) {
  t.set_requires_grad(true);
  return t;
}

struct OpCase {
  std::string name;
  // f64 inputs on `dev`; those that require grad are checked.
  std::function<std::vector<Tensor>(Device, Generator&)> inputs;
  GradcheckFn fn;
  bool lower_precision = true;  // also run the f32/f16/bf16 comparison
  GradcheckOptions options = {};
};

struct Row {
  std::string op, dtype, device, method;
  double abs_err = 0, rel_err = 0;
  bool ok = true;
  std::string note;
};

std::vector<Row> rows;

void add_row(Row r) {
  std::printf("%-38s %-5s %-7s %-10s %10.2e %10.2e  %s%s%s\n", r.op.c_str(), r.dtype.c_str(), r.device.c_str(),
              r.method.c_str(), r.abs_err, r.rel_err, r.ok ? "pass" : "FAIL", r.note.empty() ? "" : "  ",
              r.note.c_str());
  rows.push_back(std::move(r));
}

// Worst |a - b| and |a - b| / max(|b|, tiny) over two equally long vectors;
// ok when |a - b| <= atol + rtol * |b| everywhere.
struct Compare {
  double abs_err = 0, rel_err = 0;
  bool ok = true;
  void add(const std::vector<double>& a, const std::vector<double>& b, double atol, double rtol) {
    if (a.size() != b.size()) {
      ok = false;
      return;
    }
    for (std::size_t i = 0; i < a.size(); ++i) {
      const double d = std::fabs(a[i] - b[i]);
      if (!(d <= atol + rtol * std::fabs(b[i]))) ok = false;
      if (d > abs_err || std::isnan(d)) {
        abs_err = d;
        rel_err = d / std::max(std::fabs(b[i]), 1e-300);
      }
    }
  }
};

std::vector<double> f64_values(const Tensor& t) { return t.detach().to(DType::f64).cpu().to_vector<double>(); }

std::vector<OpCase> op_cases() {
  std::vector<OpCase> c;
  auto randn64 = [](const Shape& s, Generator& g, Device d) { return leaf(randn(s, g, f64_on(d))); };
  auto unary = [&](std::string name, Shape shape, std::function<Tensor(const Tensor&)> f) {
    c.push_back({std::move(name), [=](Device d, Generator& g) { return std::vector<Tensor>{randn64(shape, g, d)}; },
                 [f](const std::vector<Tensor>& v) { return f(v[0]); }});
  };
  auto binary = [&](std::string name, std::function<Tensor(const Tensor&, const Tensor&)> f, bool positive_b) {
    c.push_back({std::move(name),
                 [=](Device d, Generator& g) {
                   Tensor b = positive_b ? leaf(rand({4}, g, f64_on(d), 1.0, 2.0)) : randn64({4}, g, d);
                   return std::vector<Tensor>{randn64({3, 4}, g, d), b};
                 },
                 [f](const std::vector<Tensor>& v) { return f(v[0], v[1]); }});
  };
  binary("add (broadcast)", [](const Tensor& a, const Tensor& b) { return add(a, b); }, false);
  binary("sub (broadcast)", [](const Tensor& a, const Tensor& b) { return sub(a, b); }, false);
  binary("mul (broadcast)", [](const Tensor& a, const Tensor& b) { return mul(a, b); }, false);
  binary("div (broadcast)", [](const Tensor& a, const Tensor& b) { return div(a, b); }, true);
  c.push_back({"matmul",
               [=](Device d, Generator& g) { return std::vector<Tensor>{randn64({3, 4}, g, d), randn64({4, 5}, g, d)}; },
               [](const std::vector<Tensor>& v) { return matmul(v[0], v[1]); }});
  c.push_back({"matmul (batched)",
               [=](Device d, Generator& g) {
                 return std::vector<Tensor>{randn64({2, 3, 4}, g, d), randn64({2, 4, 2}, g, d)};
               },
               [](const std::vector<Tensor>& v) { return matmul(v[0], v[1]); }});
  c.push_back({"linear",
               [=](Device d, Generator& g) {
                 return std::vector<Tensor>{randn64({3, 4}, g, d), randn64({5, 4}, g, d), randn64({5}, g, d)};
               },
               [](const std::vector<Tensor>& v) { return linear(v[0], v[1], v[2]); }});
  // relu: inputs kept away from the kink at 0, where it has no derivative.
  c.push_back({"relu",
               [=](Device d, Generator& g) {
                 Tensor x = randn({3, 5}, g, f64_on(d));
                 auto v = x.cpu().to_vector<double>();
                 for (double& e : v) e += e < 0 ? -0.1 : 0.1;
                 return std::vector<Tensor>{leaf(Tensor::from_vector(v, {3, 5}, d))};
               },
               [](const std::vector<Tensor>& v) { return relu(v[0]); }});
  unary("sum (all)", {3, 4}, [](const Tensor& x) { return sum(x); });
  unary("sum (axis 1)", {3, 4}, [](const Tensor& x) { return sum(x, 1); });
  unary("mean (all)", {3, 4}, [](const Tensor& x) { return mean(x); });
  unary("mean (axis 0, keepdim)", {3, 4}, [](const Tensor& x) { return mean(x, 0, true); });
  unary("transpose", {3, 4}, [](const Tensor& x) { return transpose(x, 0, 1); });
  unary("reshape", {3, 4}, [](const Tensor& x) { return mul(x.reshape({2, 6}), 1.0); });
  unary("log_softmax (axis -1)", {3, 5}, [](const Tensor& x) { return log_softmax(x, -1); });
  c.push_back({"cross_entropy",
               [=](Device d, Generator& g) { return std::vector<Tensor>{randn64({4, 5}, g, d)}; },
               [](const std::vector<Tensor>& v) {
                 return cross_entropy(v[0], Tensor::from_vector<std::int64_t>({0, 3, 4, 1}, {4}, v[0].device()));
               }});
  c.push_back({"lerp (scalar weight)",
               [=](Device d, Generator& g) { return std::vector<Tensor>{randn64({3, 4}, g, d), randn64({3, 4}, g, d)}; },
               [](const std::vector<Tensor>& v) { return lerp(v[0], v[1], 0.3); }});
  c.push_back({"lerp (tensor weight)",
               [=](Device d, Generator& g) {
                 return std::vector<Tensor>{randn64({3, 4}, g, d), randn64({3, 4}, g, d),
                                            leaf(rand({4}, g, f64_on(d), -0.2, 1.2))};
               },
               [](const std::vector<Tensor>& v) { return lerp(v[0], v[1], v[2]); }});
  // to(dtype): through f32 and back; finite differences then see f32
  // rounding, hence the larger step and tolerance.
  OpCase to_dtype{"to(f32) then to(f64)", [=](Device d, Generator& g) { return std::vector<Tensor>{randn64({3, 4}, g, d)}; },
                  [](const std::vector<Tensor>& v) { return v[0].to(DType::f32).to(DType::f64); }, false};
  to_dtype.options.eps = 1e-3;
  to_dtype.options.atol = 1e-3;
  c.push_back(to_dtype);
  if (cuda_device_count() > 0) {
    c.push_back({"to(other device) and back",
                 [=](Device d, Generator& g) { return std::vector<Tensor>{randn64({3, 4}, g, d)}; },
                 [](const std::vector<Tensor>& v) {
                   const Device other = v[0].is_cuda() ? Device::cpu() : Device::cuda(0);
                   return mul(v[0].to(other), 2.0).to(v[0].device());
                 }});
  }
  return c;
}

void run_gradcheck(const OpCase& oc, Device dev, std::uint64_t seed) {
  Generator g(seed);
  Row r{oc.name, "f64", dev.str(), "gradcheck", 0, 0, true, ""};
  try {
    const GradcheckResult res = gradcheck(oc.fn, oc.inputs(dev, g), oc.options);
    r.abs_err = res.max_abs_error;
    r.rel_err = res.max_rel_error;
    r.ok = res.ok;
    if (!res.ok) r.note = res.message;
  } catch (const std::exception& e) {
    r.ok = false;
    r.note = e.what();
  }
  add_row(r);
}

// Forward and input gradients in `dt` against the same in f64.
void run_lower_precision(const OpCase& oc, Device dev, DType dt, std::uint64_t seed) {
  const double tol = dt == DType::f32 ? 1e-5 : dt == DType::f16 ? 1e-2 : 5e-2;
  Row r{oc.name, dtype_name(dt), dev.str(), "vs f64", 0, 0, true, ""};
  try {
    Generator g(seed);
    std::vector<Tensor> in64 = oc.inputs(dev, g), in_lo;
    for (Tensor& t : in64) {
      if (!is_floating(t.dtype())) {
        in_lo.push_back(t);
        continue;
      }
      // Inputs rounded to dt once, so both runs see the same values.
      Tensor lo = t.detach().to(dt);
      t = leaf(lo.to(DType::f64));
      in_lo.push_back(leaf(lo));
    }
    Tensor y64 = oc.fn(in64), ylo = oc.fn(in_lo);
    Compare cmp;
    cmp.add(f64_values(ylo), f64_values(y64), tol, tol);
    y64.backward(ones_like(y64));
    ylo.backward(ones_like(ylo));
    for (std::size_t i = 0; i < in64.size(); ++i)
      if (in64[i].requires_grad()) cmp.add(f64_values(in_lo[i].grad()), f64_values(in64[i].grad()), tol, tol);
    r.abs_err = cmp.abs_err, r.rel_err = cmp.rel_err, r.ok = cmp.ok;
  } catch (const std::exception& e) {
    r.ok = false;
    r.note = e.what();
  }
  add_row(r);
}

// quantize -> dequantize in f64: with power-of-two scales and inputs inside
// the range the gradient reaching x is exactly dy (straight-through).
void run_dequantize(Device dev) {
  struct Scope {
    std::string name;
    std::function<Tensor(const Tensor&)> roundtrip;
  };
  const TensorOptions f32o = TensorOptions{}.with_device(dev);
  const TensorOptions s32o = TensorOptions{}.with_dtype(DType::s32).with_device(dev);
  std::vector<Scope> scopes = {
      {"dequantize_per_tensor",
       [](const Tensor& x) { return dequantize_per_tensor(quantize_per_tensor(x, 0.25, 3, DType::s8), 0.25, 3, DType::f64); }},
      {"dequantize_per_channel",
       [=](const Tensor& x) {
         Tensor s = Tensor::from_vector<float>({0.25f, 0.5f, 0.125f, 1.0f}, {4}, dev);
         Tensor z = Tensor::from_vector<std::int32_t>({0, -2, 5, 1}, {4}, dev);
         return dequantize_per_channel(quantize_per_channel(x, s, z, 1, DType::s8), s, z, 1, DType::f64);
       }},
      {"dequantize_per_token",
       [=](const Tensor& x) {
         Tensor s = Tensor::from_vector<float>({0.25f, 0.5f, 0.125f}, {3}, dev);
         Tensor z = Tensor::from_vector<std::int32_t>({100, 120, 128}, {3}, dev);
         return dequantize_per_token(quantize_per_token(x, s, z, DType::u8), s, z, DType::f64);
       }},
      {"dequantize_per_group",
       [=](const Tensor& x) {
         Tensor s = Tensor::from_vector<float>({0.25f, 0.5f, 0.125f, 1.0f, 0.25f, 0.5f}, {3, 2}, dev);
         Tensor z = zeros({3, 2}, s32o);
         return dequantize_per_group(quantize_per_group(x, s, z, 2, DType::s8), s, z, 2, DType::f64);
       }},
  };
  (void)f32o;
  for (const Scope& sc : scopes) {
    Row r{sc.name + " (via quantize)", "f64", dev.str(), "host ref", 0, 0, true, ""};
    try {
      Generator g(11);
      Tensor x = leaf(rand({3, 4}, g, f64_on(dev), -10.0, 10.0));
      Tensor dy = randn({3, 4}, g, f64_on(dev));
      sc.roundtrip(x).backward(dy);
      Compare cmp;
      cmp.add(f64_values(x.grad()), f64_values(dy), 0.0, 0.0);
      r.abs_err = cmp.abs_err, r.rel_err = cmp.rel_err, r.ok = cmp.ok;
    } catch (const std::exception& e) {
      r.ok = false;
      r.note = e.what();
    }
    add_row(r);
  }
}

// LSQ: dx, dscale, dzero_point against a host transcription of PyTorch's
// _fake_quantize_grad_learnable_* formulas (docs/ops.md), in f64.
void run_lsq(Device dev, bool per_channel) {
  Row r{per_channel ? "fake_quantize_learnable_per_channel" : "fake_quantize_learnable_per_tensor", "f64",
        dev.str(), "host ref", 0, 0, true, "LSQ grads are PyTorch's formulas, not derivatives"};
  try {
    const std::int64_t rows_n = 4, cols = 6, qmin = -8, qmax = 7;
    const double gf = 0.7;
    Generator g(per_channel ? 21 : 22);
    Tensor x = leaf(randn({rows_n, cols}, g, f64_on(dev), 0.0, 1.0));
    const std::int64_t c = per_channel ? rows_n : 1;
    Tensor scale = leaf(rand({c}, g, f64_on(dev), 0.05, 0.2));
    Tensor zp = leaf(rand({c}, g, f64_on(dev), -3.0, 3.0));
    Tensor dy = randn({rows_n, cols}, g, f64_on(dev));
    Tensor y = per_channel ? fake_quantize_learnable_per_channel(x, scale, zp, 0, qmin, qmax, gf)
                           : fake_quantize_learnable_per_tensor(x, scale, zp, qmin, qmax, gf);
    y.backward(dy);
    const auto xs = f64_values(x), gs = f64_values(dy), ss = f64_values(scale), zs = f64_values(zp);
    std::vector<double> dx(xs.size()), ds(static_cast<std::size_t>(c)), dz(static_cast<std::size_t>(c)), yref(xs.size());
    for (std::size_t i = 0; i < xs.size(); ++i) {
      const std::size_t ch = per_channel ? i / static_cast<std::size_t>(cols) : 0;
      const float s = static_cast<float>(ss[ch]);
      const double z = std::clamp<double>(std::nearbyint(static_cast<float>(zs[ch])), qmin, qmax);
      const float inv = 1.0f / s;
      const double q = std::nearbyint(xs[i] * static_cast<double>(inv)) + z;
      yref[i] = (std::clamp<double>(q, qmin, qmax) - z) * static_cast<double>(s);
      if (q < qmin || q > qmax) {
        dx[i] = 0;
        ds[ch] += (gs[i] * ((q < qmin ? qmin : qmax) - z)) * gf;
        dz[ch] += ((gs[i] * -1.0) * s) * gf;
      } else {
        dx[i] = gs[i];
        ds[ch] += ((gs[i] * ((q - z) * s - xs[i])) * static_cast<double>(inv)) * gf;
      }
    }
    Compare cmp;
    cmp.add(f64_values(y), yref, 1e-12, 1e-12);
    cmp.add(f64_values(x.grad()), dx, 0.0, 0.0);
    cmp.add(f64_values(scale.grad()), ds, 1e-12, 1e-9);  // sums: another order
    cmp.add(f64_values(zp.grad()), dz, 1e-12, 1e-9);
    r.abs_err = cmp.abs_err, r.rel_err = cmp.rel_err, r.ok = cmp.ok;
  } catch (const std::exception& e) {
    r.ok = false;
    r.note = e.what();
  }
  add_row(r);
}

}  // namespace

int main() {
  std::vector<Device> devices = {Device::cpu()};
  if (cuda_device_count() > 0) devices.push_back(Device::cuda(0));
  std::printf("%-38s %-5s %-7s %-10s %10s %10s  %s\n", "op", "dtype", "device", "method", "max abs", "max rel",
              "result");
  const auto cases = op_cases();
  for (Device dev : devices) {
    std::uint64_t seed = 100;
    for (const OpCase& oc : cases) {
      ++seed;
      run_gradcheck(oc, dev, seed);
      if (oc.lower_precision)
        for (DType dt : {DType::f32, DType::f16, DType::bf16}) run_lower_precision(oc, dev, dt, seed);
    }
    run_dequantize(dev);
    run_lsq(dev, false);
    run_lsq(dev, true);
  }
  int passed = 0, failed = 0;
  for (const Row& r : rows) (r.ok ? passed : failed)++;
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
