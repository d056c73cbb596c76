// The op registry: every public op as one entry, so one conformance driver
// (tests/test_conformance.cpp), the gradcheck tour, the op fuzzer and the
// bad-input matrix cover each op without lists of their own.
//
// An entry states how to make the op's inputs (any device, any of its
// dtypes, edge values included), how to call it, what it promises across
// devices (bit-identical, or a tolerance and why), how its gradient is
// checked (f64 finite differences, or a host transcription of a rule that is
// not the derivative of the forward: straight-through, LSQ), and which bad
// arguments it must reject (qgrad::Error naming the op and the argument).
//
// The registry is a library of its own (qgrad_op_registry, ops/registry/*.cpp)
// above the library layers: tests, fuzz/ and examples link it; programs do
// not need it. Adding an op means adding one entry to the file of its family;
// tests/test_conformance.cpp fails when a function declared in ops/*.h is
// covered by no entry.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "qgrad/autograd/gradcheck.h"
#include "qgrad/core/tensor.h"

namespace qgrad::registry {

// How CUDA results relate to CPU results: bit-identical, or within a
// relative tolerance per dtype, |cuda - cpu| <= rtol(dtype) * max(1, |cpu|)
// elementwise, with the reason (the tolerances are those the op's own CUDA
// tests use).
struct Promise {
  double f64 = 0, f32 = 0, f16 = 0, bf16 = 0;  // all 0: bit-identical
  std::string reason;                          // why not bit-identical
  bool exact() const { return f64 == 0 && f32 == 0 && f16 == 0 && bf16 == 0; }
  double rtol(DType dt) const {
    return dt == DType::f64 ? f64 : dt == DType::f32 ? f32 : dt == DType::f16 ? f16 : dt == DType::bf16 ? bf16 : 0.0;
  }
  static Promise bit_identical() { return {}; }
  static Promise within(double f64, double f32, double f16, double bf16, std::string reason) {
    return {f64, f32, f16, bf16, std::move(reason)};
  }
};

enum class GradMethod {
  none,                // not differentiable (integer outputs, in-place updates, factories)
  finite_differences,  // gradcheck in f64, full and fast mode
  host_reference,      // gradients compared with grad_reference (a documented rule)
};

// Inputs of one call: floating inputs whose gradient is checked are leaves
// that require grad; everything else (labels, qparams, states) is plain.
using MakeInputs = std::function<std::vector<Tensor>(Device, DType, Generator&)>;
// The call: outputs[0] is the differentiated output (when the entry has a
// gradient); every output is compared across devices. In-place ops return
// the tensors they updated.
using Call = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;
// Host f64 gradients of the inputs that require grad (in input order), for
// the given inputs and upstream gradient dy of outputs[0].
using GradReference = std::function<std::vector<std::vector<double>>(const std::vector<Tensor>& inputs,
                                                                     const Tensor& dy)>;

// One argument error: `run` must throw qgrad::Error whose op() contains `op`
// and whose arg() (or message) contains `arg`. cpu_only: a check of the
// values of a tensor argument (labels, qparams), made on the CPU only (on
// CUDA it would need a host sync; docs/ops.md); the driver skips it there.
struct BadInput {
  std::string op, arg;
  std::function<void()> run;
  bool cpu_only = false;
};

struct OpEntry {
  std::string name;                 // the table's row label
  std::vector<std::string> covers;  // the public functions it exercises
  std::vector<DType> dtypes;        // swept (inputs are made in each)
  MakeInputs inputs;
  Call call;
  Promise promise;
  GradMethod grad = GradMethod::finite_differences;
  GradReference grad_reference;  // host_reference only
  GradcheckOptions gradcheck_options = {};
  // Argument errors, on the given device (their inputs are made there).
  std::function<std::vector<BadInput>(Device)> bad_inputs;
  // host_reference only, optional: host f64 values of outputs[0] (checked
  // with the gradients in f64, where the documented formula is exact).
  std::function<std::vector<double>(const std::vector<Tensor>& inputs)> forward_reference = nullptr;
};

// Every entry, in a fixed order (family by family).
const std::vector<OpEntry>& op_registry();

// ---- the conformance driver (ops/registry/conformance.cpp) ----
// For every entry and dtype: forward and backward on every available device
// against the CPU (the CPU against a second CPU run: determinism), with the
// allocator's blocks poisoned (NaN bytes) first so that an output a kernel
// does not write shows; in f64 the gradient check (finite differences, full
// and fast mode, or the host reference); for f32/f16/bf16 the gradient
// entries' forward and input gradients against f64 (the lower-precision
// sweep); and every bad-input case on every device. One row per check.
struct ConformanceRow {
  ConformanceRow(std::string op_, std::string dtype_, std::string device_, std::string check_)
      : op(std::move(op_)), dtype(std::move(dtype_)), device(std::move(device_)), check(std::move(check_)) {}
  std::string op, dtype, device, check;
  bool ok = true;
  double worst = 0;  // worst error against the promise (0 when exact)
  std::string note;
};
struct ConformanceReport {
  std::vector<ConformanceRow> rows;
  std::size_t ops = 0, checks = 0, failed = 0;
  std::string closing_line() const;  // "conformance: N ops, M checks: P passed, F failed"
};
struct ConformanceOptions {
  bool print_rows = true;          // one line per row on stdout, as it runs
  std::string only;                // run only entries whose name contains this
  bool cuda = true;                // also CUDA device 0, when one is present
  bool gradients_only = false;     // only the gradient rows (the gradcheck tour)
  // Run only the entries whose index in the list is shard modulo shards
  // (ctest runs the gradcheck tour as parallel shards).
  std::size_t shard = 0, shards = 1;
};
ConformanceReport run_conformance(const ConformanceOptions& options = {});
// The same driver over given entries (the harness's own tests).
ConformanceReport run_conformance(const std::vector<OpEntry>& entries, const ConformanceOptions& options);

// ---- the family files (ops/registry/*.cpp) and their helpers ----
std::vector<OpEntry> arithmetic_entries();    // elementwise, linalg, reductions, losses, conversions
std::vector<OpEntry> quantization_entries();  // fake quantize, LSQ, quantize/dequantize, W8A8
std::vector<OpEntry> lowbit_entries();        // int4 per group and FP8 (ops/lowbit.h), low-bit Tensor::to
std::vector<OpEntry> lowbit_linear_entries(); // int4 linear layers: W4A16, W4A8 (ops/lowbit_linear.h)
std::vector<OpEntry> state_entries();         // in-place updates (optimizer, observers) and factories
std::vector<OpEntry> pool_norm_entries();     // pooling, batch_norm, flatten
std::vector<OpEntry> transformer_entries();   // gelu, silu, softmax, layer_norm, rms_norm, embedding, dropout,
                                              // scaled_dot_product_attention
std::vector<OpEntry> shape_entries();         // permute, slice, narrow, cat, split, split_with_sizes, chunk
std::vector<OpEntry> conv_entries();          // convolution (conv2d)
std::vector<OpEntry> quantized_conv_entries();  // the int8 convolution (quantized_conv2d)
std::vector<OpEntry> fp8_linear_entries();    // the FP8 linear (inference, cuBLASLt on CUDA)

TensorOptions on(Device device, DType dtype = DType::f32);
// Seeded values of any dtype on `device` for bad-input cases (floating:
// standard normal; integers: 1..4; boolean: 0/1).
Tensor some(const Shape& shape, Device device, DType dtype = DType::f32);
// Appends cases to the bad inputs of the entry named `name` (the family
// files keep an entry's long list of argument errors apart from the entry).
void extend_bad_inputs(std::vector<OpEntry>& entries, const std::string& name,
                       std::function<std::vector<BadInput>(Device)> more);
// A leaf requiring grad.
Tensor leaf(Tensor t);
// Standard normal values times stddev, as a leaf requiring grad.
Tensor normal(const Shape& shape, Generator& g, Device device, DType dtype, double stddev = 1.0);
// Values for quantization inputs: random in [lo, hi] plus the edges of the
// scale grid (ties at (k + 0.5) * scale, the clamp bounds, +-0, +-1e30).
Tensor quant_input(const Shape& shape, Generator& g, Device device, DType dtype, double scale,
                   std::int64_t zero_point, std::int64_t qmin, std::int64_t qmax);

}  // namespace qgrad::registry
