#include "qgrad/autograd/gradcheck.h"

#include <cmath>
#include <sstream>

#include "qgrad/autograd/node.h"
#include "qgrad/kernels/basic.h"
#include "qgrad/core/random.h"

namespace qgrad {

namespace {

// gradcheck sits below ops/: it converts with the cast kernel and copies
// with copy_, not with the recorded Tensor::to / clone.
Tensor converted(const Tensor& t, DType dtype) {
  if (t.dtype() == dtype) return t;
  Tensor out = Tensor::empty(t.shape(), TensorOptions{}.with_dtype(dtype).with_device(t.device()));
  kernels::cast(t, out);
  return out;
}
Tensor copied(const Tensor& t, Device device) {
  Tensor out = Tensor::empty(t.shape(), TensorOptions{}.with_dtype(t.dtype()).with_device(device));
  out.copy_(t);
  return out;
}
std::vector<double> host_values(const Tensor& t) { return copied(t.detach(), Device::cpu()).to_vector<double>(); }

Tensor with_values(const std::vector<double>& v, const Tensor& like) {
  return Tensor::from_vector(v, like.shape(), like.device());
}

// Re-runs fn with input k replaced by `values` (no graph recorded).
std::vector<double> evaluate(const GradcheckFn& fn, const std::vector<Tensor>& inputs, std::size_t k,
                             const std::vector<double>& values) {
  NoGradGuard no_grad;
  std::vector<Tensor> args;
  for (std::size_t i = 0; i < inputs.size(); ++i)
    args.push_back(i == k ? with_values(values, inputs[i]) : inputs[i].detach());
  return host_values(fn(args));
}

// Fresh leaves sharing the caller's values, so the check leaves the
// caller's tensors' .grad untouched.
std::vector<Tensor> fresh_leaves(const std::vector<Tensor>& inputs) {
  std::vector<Tensor> out;
  for (const Tensor& t : inputs) {
    Tensor c = copied(t.detach(), t.device());
    if (t.requires_grad()) c.set_requires_grad(true);
    out.push_back(c);
  }
  return out;
}

void consider(GradcheckResult& r, const GradcheckOptions& o, double analytical, double numerical, int input,
              std::int64_t in_index, std::int64_t out_index) {
  const double err = std::fabs(analytical - numerical);
  const bool bad = !(err <= o.atol + o.rtol * std::fabs(numerical));  // NaN fails
  if (bad || err > r.max_abs_error || (std::isnan(err) && !std::isnan(r.max_abs_error))) {
    if (bad) r.ok = false;
    if (bad || r.ok) {
      r.max_abs_error = std::isnan(err) ? INFINITY : std::max(r.max_abs_error, err);
      r.max_rel_error = err / std::max(std::fabs(numerical), 1e-300);
      r.worst_input = input;
      r.worst_input_index = in_index;
      r.worst_output_index = out_index;
      r.analytical = analytical;
      r.numerical = numerical;
    }
  }
}

}  // namespace

GradcheckResult gradcheck(const GradcheckFn& fn, const std::vector<Tensor>& inputs_in,
                          const GradcheckOptions& o) {
  QGRAD_CHECK(!inputs_in.empty(), "gradcheck", "inputs", "no inputs");
  bool any = false;
  for (const Tensor& t : inputs_in) {
    QGRAD_CHECK(t.defined(), "gradcheck", "inputs", "undefined input");
    QGRAD_CHECK(t.dtype() == DType::f64, "gradcheck", "inputs", "inputs must be f64, got ", dtype_name(t.dtype()));
    QGRAD_CHECK(t.device() == inputs_in[0].device(), "gradcheck", "inputs", "inputs must share one device");
    any = any || t.requires_grad();
  }
  QGRAD_CHECK(any, "gradcheck", "inputs", "no input requires grad");

  const std::vector<Tensor> inputs = fresh_leaves(inputs_in);
  Tensor out = fn(inputs);
  QGRAD_CHECK(out.defined() && is_floating(out.dtype()), "gradcheck", "fn", "fn must return a floating tensor");
  QGRAD_CHECK(out.requires_grad(), "gradcheck", "fn", "the output does not depend on any input that requires grad");
  const std::int64_t n_out = out.numel();
  const Device dev = out.device();
  const DType out_dtype = out.grad_fn() ? out.grad_fn()->grad_dtype : out.dtype();

  GradcheckResult r;
  if (o.fast_mode) {
    std::vector<double> v(static_cast<std::size_t>(n_out));
    for (std::size_t j = 0; j < v.size(); ++j) v[j] = formulas::random_uniform(o.seed, j) * 2 - 1;
    Tensor vt = converted(Tensor::from_vector(v, out.shape(), dev), out_dtype);
    out.backward(vt, /*retain_graph=*/true);
    double analytical = 0, numerical = 0;
    std::uint64_t counter = 1u << 30;
    // Perturb every input that requires grad along its own random u.
    std::vector<std::vector<double>> base(inputs.size()), u(inputs.size());
    for (std::size_t k = 0; k < inputs.size(); ++k) {
      if (!inputs[k].requires_grad()) continue;
      base[k] = host_values(inputs[k]);
      u[k].resize(base[k].size());
      for (double& x : u[k]) x = formulas::random_uniform(o.seed + 1, counter++) * 2 - 1;
      Tensor g = inputs[k].grad();
      if (g.defined()) {
        const auto gv = host_values(converted(g, DType::f64));
        for (std::size_t i = 0; i < gv.size(); ++i) analytical += gv[i] * u[k][i];
      }
    }
    auto shifted = [&](double sign) {
      NoGradGuard no_grad;
      std::vector<Tensor> args;
      for (std::size_t k = 0; k < inputs.size(); ++k) {
        if (!inputs[k].requires_grad()) {
          args.push_back(inputs[k].detach());
          continue;
        }
        std::vector<double> x = base[k];
        for (std::size_t i = 0; i < x.size(); ++i) x[i] += sign * o.eps * u[k][i];
        args.push_back(with_values(x, inputs[k]));
      }
      return host_values(fn(args));
    };
    const auto plus = shifted(+1), minus = shifted(-1);
    for (std::size_t j = 0; j < v.size(); ++j) numerical += v[j] * (plus[j] - minus[j]) / (2 * o.eps);
    consider(r, o, analytical, numerical, -1, -1, -1);
  } else {
    // Analytical rows: one backward per output element.
    std::vector<std::vector<double>> jac_a(inputs.size());
    for (std::size_t k = 0; k < inputs.size(); ++k)
      if (inputs[k].requires_grad()) jac_a[k].assign(static_cast<std::size_t>(n_out * inputs[k].numel()), 0.0);
    for (std::int64_t j = 0; j < n_out; ++j) {
      std::vector<double> onehot(static_cast<std::size_t>(n_out), 0.0);
      onehot[static_cast<std::size_t>(j)] = 1.0;
      for (const Tensor& t : inputs) const_cast<Tensor&>(t).zero_grad();
      out.backward(converted(Tensor::from_vector(onehot, out.shape(), dev), out_dtype), /*retain_graph=*/true);
      for (std::size_t k = 0; k < inputs.size(); ++k) {
        if (!inputs[k].requires_grad()) continue;
        Tensor g = inputs[k].grad();
        if (!g.defined()) continue;
        const auto gv = host_values(converted(g, DType::f64));
        for (std::size_t i = 0; i < gv.size(); ++i)
          jac_a[k][static_cast<std::size_t>(j) * gv.size() + i] = gv[i];
      }
    }
    // Numerical columns: two forwards per input element.
    for (std::size_t k = 0; k < inputs.size(); ++k) {
      if (!inputs[k].requires_grad()) continue;
      std::vector<double> x = host_values(inputs[k]);
      for (std::size_t i = 0; i < x.size(); ++i) {
        const double keep = x[i];
        x[i] = keep + o.eps;
        const auto plus = evaluate(fn, inputs, k, x);
        x[i] = keep - o.eps;
        const auto minus = evaluate(fn, inputs, k, x);
        x[i] = keep;
        for (std::int64_t j = 0; j < n_out; ++j) {
          const double numerical = (plus[static_cast<std::size_t>(j)] - minus[static_cast<std::size_t>(j)]) / (2 * o.eps);
          consider(r, o, jac_a[k][static_cast<std::size_t>(j) * x.size() + i], numerical, static_cast<int>(k),
                   static_cast<std::int64_t>(i), j);
        }
      }
    }
  }
  std::ostringstream s;
  s << (r.ok ? "gradcheck passed" : "gradcheck FAILED") << (o.fast_mode ? " (fast mode)" : "")
    << ": max abs error " << r.max_abs_error << ", rel " << r.max_rel_error;
  if (r.worst_input >= 0 || o.fast_mode)
    s << "; worst at input " << r.worst_input << " element " << r.worst_input_index << ", output element "
      << r.worst_output_index << ": analytical " << r.analytical << " vs numerical " << r.numerical;
  r.message = s.str();
  return r;
}

}  // namespace qgrad
