// The conformance driver: every registry entry, every dtype, every device.
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>

#include "qgrad/autograd/node.h"
#include "qgrad/ops/ops.h"
#include "qgrad/ops/registry.h"

namespace qgrad::registry {

namespace {

using Tensors = std::vector<Tensor>;

std::vector<double> host_values(const Tensor& t) {
  Tensor h = t.detach().cpu();
  if (h.dtype() != DType::f64) h = h.to(DType::f64);
  return h.to_vector<double>();
}

// Fills the allocator's cache on `device` with blocks of `byte` and frees
// them, so a fresh output that a kernel fails to write holds that pattern.
// The CPU reference run uses 0xFF (NaN in every floating dtype), the run it
// is compared with 0x55: an unwritten output then differs between the two.
void poison_allocator(Device device, unsigned char byte) {
  std::vector<Tensor> blocks;
  for (std::int64_t n : {256, 1024, 4096, 16384, 65536, 262144})
    blocks.push_back(full({n}, byte, on(device, DType::u8)));
}

// Integer outputs (quantized values, argmax, labels) are exact on every device.
bool is_integer_output(const Tensor& t) { return t.defined() && !is_floating(t.dtype()); }

struct Run {
  Tensors inputs, outputs;
  std::vector<Tensor> grads;  // per input requiring grad, in order
  std::string error;
};

std::uint64_t seed_of(const std::string& name, DType dt) {
  std::uint64_t h = 1469598103934665603ULL;
  for (char c : name) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ULL;
  return h ^ (static_cast<std::uint64_t>(dt) + 1) * 0x9e3779b97f4a7c15ULL;
}

Run run_once(const OpEntry& e, Device device, DType dt, unsigned char poison = 0x55) {
  Run r;
  try {
    Generator g(seed_of(e.name, dt));
    r.inputs = e.inputs(device, dt, g);
    poison_allocator(device, poison);
    r.outputs = e.call(r.inputs);
    if (e.grad != GradMethod::none && !r.outputs.empty() && r.outputs[0].requires_grad()) {
      Generator gd(seed_of(e.name, dt) + 1);
      const Tensor& y = r.outputs[0];
      Tensor dy = randn(y.shape(), gd, on(device, y.grad_fn() ? y.grad_fn()->grad_dtype : y.dtype()));
      poison_allocator(device, poison);
      y.backward(dy);
      r.outputs.push_back(dy);  // compared too: the same draw on every device
      for (const Tensor& t : r.inputs)
        if (t.requires_grad()) r.grads.push_back(t.grad());
    }
  } catch (const std::exception& ex) {
    r.error = ex.what();
  }
  return r;
}

// Bitwise: 0 when the bytes are equal, else infinite. Otherwise the worst
// |a - b| / max(1, |b|); NaN in one but not the other, or a shape or dtype
// mismatch, is infinite.
double compare(const Tensor& a, const Tensor& b, bool bitwise) {
  if (!a.defined() || !b.defined()) return a.defined() == b.defined() ? 0.0 : INFINITY;
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return INFINITY;
  if (bitwise) {
    Tensor ha = a.detach().cpu(), hb = b.detach().cpu();
    const auto* pa = static_cast<const unsigned char*>(ha.data_ptr());
    const auto* pb = static_cast<const unsigned char*>(hb.data_ptr());
    for (std::size_t i = 0; i < ha.nbytes(); ++i)
      if (pa[i] != pb[i]) return INFINITY;
    return 0.0;
  }
  const auto va = host_values(a), vb = host_values(b);
  double worst = 0;
  for (std::size_t i = 0; i < va.size(); ++i) {
    if (std::isnan(va[i]) != std::isnan(vb[i])) return INFINITY;
    if (std::isnan(va[i])) continue;
    if (va[i] == vb[i]) continue;  // also equal infinities
    worst = std::max(worst, std::fabs(va[i] - vb[i]) / std::max(1.0, std::fabs(vb[i])));
  }
  return worst;
}

class Driver {
 public:
  Driver(const ConformanceOptions& o, ConformanceReport& r) : opt_(o), rep_(r) {}

  void row(ConformanceRow r) {
    ++rep_.checks;
    if (!r.ok) ++rep_.failed;
    if (opt_.print_rows)
      std::printf("%-46s %-5s %-7s %-22s %-4s %9.2e%s%s\n", r.op.c_str(), r.dtype.c_str(), r.device.c_str(),
                  r.check.c_str(), r.ok ? "pass" : "FAIL", r.worst, r.note.empty() ? "" : "  ", r.note.c_str());
    rep_.rows.push_back(std::move(r));
  }

  // Forward and backward on `device` against the CPU run `ref`.
  void devices(const OpEntry& e, DType dt, Device device, const Run& ref) {
    const Run run = run_once(e, device, dt);
    const bool cpu = device.is_cpu();
    ConformanceRow r{e.name, dtype_name(dt), device.str(), cpu ? "forward (rerun)" : "forward vs cpu"};
    if (!ref.error.empty() || !run.error.empty()) {
      r.ok = false;
      r.note = ref.error.empty() ? run.error : ref.error;
      row(r);
      return;
    }
    // The CPU against itself must be bit-identical (determinism); CUDA
    // against the CPU as the entry promises.
    const bool bitwise = cpu || e.promise.exact();
    const double rtol = bitwise ? 0.0 : e.promise.rtol(dt);
    double worst = 0;
    for (std::size_t i = 0; i < ref.outputs.size() && i < run.outputs.size(); ++i)
      worst = std::max(worst, compare(run.outputs[i], ref.outputs[i], bitwise || is_integer_output(run.outputs[i])));
    r.worst = worst;
    r.ok = run.outputs.size() == ref.outputs.size() && worst <= rtol;
    if (!bitwise) {
      char note[96];
      std::snprintf(note, sizeof note, "promise rtol %.0e: ", rtol);
      r.note = note + e.promise.reason;
    }
    row(r);
    if (e.grad == GradMethod::none) return;
    ConformanceRow b{e.name, dtype_name(dt), device.str(), cpu ? "backward (rerun)" : "backward vs cpu"};
    worst = run.grads.size() == ref.grads.size() ? 0.0 : INFINITY;
    for (std::size_t i = 0; i < run.grads.size() && i < ref.grads.size(); ++i)
      worst = std::max(worst, compare(run.grads[i], ref.grads[i], bitwise));
    b.worst = worst;
    b.ok = worst <= rtol;
    b.note = r.note;
    row(b);
  }

  // f64 only: finite differences (full and fast) or the host reference.
  void gradient(const OpEntry& e, Device device) {
    if (e.grad == GradMethod::finite_differences) {
      for (const bool fast : {false, true}) {
        ConformanceRow r{e.name, "f64", device.str(), fast ? "gradcheck (fast)" : "gradcheck (full)"};
        try {
          Generator g(seed_of(e.name, DType::f64));
          GradcheckOptions go = e.gradcheck_options;
          go.fast_mode = fast;
          const auto res = gradcheck([&](const Tensors& in) { return e.call(in)[0]; },
                                     e.inputs(device, DType::f64, g), go);
          r.ok = res.ok;
          r.worst = res.max_abs_error;
          if (!res.ok) r.note = res.message;
        } catch (const std::exception& ex) {
          r.ok = false;
          r.note = ex.what();
        }
        row(r);
      }
    } else if (e.grad == GradMethod::host_reference) {
      ConformanceRow r{e.name, "f64", device.str(), "gradient vs host ref"};
      const Run run = run_once(e, device, DType::f64);
      if (!run.error.empty()) {
        r.ok = false;
        r.note = run.error;
      } else {
        const Tensor& dy = run.outputs.back();
        auto want = e.grad_reference(run.inputs, dy);
        r.ok = want.size() == run.grads.size();
        std::vector<Tensor> got_tensors = run.grads;
        if (e.forward_reference) {  // the values too, as one more "gradient"
          want.push_back(e.forward_reference(run.inputs));
          got_tensors.push_back(run.outputs[0]);
        }
        for (std::size_t i = 0; r.ok && i < want.size(); ++i) {
          const auto got = host_values(got_tensors[i]);
          r.ok = got.size() == want[i].size();
          for (std::size_t j = 0; r.ok && j < got.size(); ++j) {
            const double d = std::fabs(got[j] - want[i][j]);
            r.worst = std::max(r.worst, d);
            // The x gradients are exact; sums over elements (LSQ's scale and
            // zero point) may add in another order.
            r.ok = d <= 1e-12 + 1e-9 * std::fabs(want[i][j]);
          }
        }
        r.note = "straight-through / documented rule";
      }
      row(r);
    }
  }

  // f32/f16/bf16: forward and input gradients against the f64 run of the
  // same values (inputs rounded to dt first), with a tolerance per dtype.
  void lower_precision(const OpEntry& e, DType dt, Device device) {
    if (e.grad != GradMethod::finite_differences || dt == DType::f64) return;
    const double tol = dt == DType::f32 ? 1e-5 : dt == DType::f16 ? 1e-2 : 5e-2;
    ConformanceRow r{e.name, dtype_name(dt), device.str(), "vs f64"};
    try {
      Generator g(seed_of(e.name, dt));
      Tensors lo = e.inputs(device, dt, g), hi;
      for (Tensor& t : lo) {
        if (!is_floating(t.dtype())) {
          hi.push_back(t);
          continue;
        }
        const bool grad = t.requires_grad();
        Tensor h = t.detach().to(DType::f64);
        hi.push_back(grad ? leaf(h) : h);
      }
      Tensor ylo = e.call(lo)[0], yhi = e.call(hi)[0];
      double worst = 0;
      auto check = [&](const Tensor& a, const Tensor& b) {
        const auto va = host_values(a), vb = host_values(b);
        for (std::size_t i = 0; i < va.size(); ++i) {
          const double d = std::fabs(va[i] - vb[i]);
          worst = std::max(worst, d / (1.0 + std::fabs(vb[i])));
          if (!(d <= tol * (1.0 + std::fabs(vb[i])))) r.ok = false;
        }
      };
      check(ylo, yhi);
      ylo.backward(ones_like(ylo));
      yhi.backward(ones_like(yhi));
      for (std::size_t i = 0; i < lo.size(); ++i)
        if (lo[i].requires_grad()) check(lo[i].grad(), hi[i].grad());
      r.worst = worst;
    } catch (const std::exception& ex) {
      r.ok = false;
      r.note = ex.what();
    }
    row(r);
  }

  void bad_inputs(const OpEntry& e, Device device) {
    if (!e.bad_inputs) return;
    ConformanceRow r{e.name, "-", device.str(), "bad inputs"};
    std::size_t n = 0;
    for (const BadInput& b : e.bad_inputs(device)) {
      if (b.cpu_only && !device.is_cpu()) continue;
      ++n;
      try {
        b.run();
        r.ok = false;
        r.note += "no error for " + b.op + "/" + b.arg + "; ";
      } catch (const Error& err) {
        const std::string what = err.what();
        if (err.op().find(b.op) == std::string::npos ||
            (err.arg().find(b.arg) == std::string::npos && what.find(b.arg) == std::string::npos)) {
          r.ok = false;
          r.note += "expected " + b.op + "/" + b.arg + ", got " + what + "; ";
        }
      } catch (const std::exception& ex) {
        r.ok = false;
        r.note += "not a qgrad::Error: " + std::string(ex.what()) + "; ";
      }
    }
    if (r.ok) r.note = std::to_string(n) + " cases";
    row(r);
  }

 private:
  const ConformanceOptions& opt_;
  ConformanceReport& rep_;
};

}  // namespace

std::string ConformanceReport::closing_line() const {
  return "conformance: " + std::to_string(ops) + " ops, " + std::to_string(checks) + " checks: " +
         std::to_string(checks - failed) + " passed, " + std::to_string(failed) + " failed";
}

ConformanceReport run_conformance(const ConformanceOptions& options) { return run_conformance(op_registry(), options); }

ConformanceReport run_conformance(const std::vector<OpEntry>& entries, const ConformanceOptions& options) {
  ConformanceReport report;
  Driver driver(options, report);
  std::vector<Device> devices{Device::cpu()};
  if (options.cuda && cuda_device_count() > 0) devices.push_back(Device::cuda(0));
  if (options.print_rows)
    std::printf("%-46s %-5s %-7s %-22s %-4s %9s\n", "op", "dtype", "device", "check", "ok", "worst");
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const OpEntry& e = entries[i];
    if (!options.only.empty() && e.name.find(options.only) == std::string::npos) continue;
    if (options.shards > 1 && i % options.shards != options.shard) continue;
    ++report.ops;
    for (DType dt : e.dtypes) {
      if (!options.gradients_only) {
        const Run ref = run_once(e, Device::cpu(), dt, 0xFF);
        for (Device d : devices) driver.devices(e, dt, d, ref);
      }
      for (Device d : devices) driver.lower_precision(e, dt, d);
    }
    for (Device d : devices) {
      driver.gradient(e, d);
      if (!options.gradients_only) driver.bad_inputs(e, d);
    }
  }
  if (options.print_rows) std::printf("%s\n", report.closing_line().c_str());
  return report;
}

}  // namespace qgrad::registry
