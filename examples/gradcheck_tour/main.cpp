// qgrad-gradcheck-tour: checks the backward of every differentiable op of
// the op registry (ops/registry.h) on every available device (the CPU; CUDA
// when a GPU is present) and prints one table row per (op, dtype, device,
// method):
//   gradcheck (full/fast)  f64: analytical Jacobian vs central finite
//                          differences (autograd/gradcheck.h);
//   gradient vs host ref   f64: ops whose gradient is not the derivative of
//                          the forward (straight-through fake quantize and
//                          quantize -> dequantize; LSQ's scale / zero-point
//                          gradients are PyTorch's formulas), compared with a
//                          host transcription of the documented rule;
//   vs f64                 f32, f16, bf16: forward and input gradients in that
//                          dtype against the f64 result, tolerance per dtype.
// These are the gradient rows of the conformance harness
// (tests/test_conformance.cpp runs every row). The last line is
// "N passed, M failed"; the exit code is 1 if any failed.
//   --shards N --shard K   only the registry entries whose index is K mod N
//                          (ctest runs the tour as parallel shards)
//   --only NAME            only the entries whose name contains NAME
#include <CLI/CLI.hpp>
#include <cstdio>

#include "qgrad/ops/registry.h"
#include "qgrad/qgrad.h"

int main(int argc, char** argv) {
  qgrad::registry::ConformanceOptions options;
  options.gradients_only = true;
  CLI::App app{"qgrad-gradcheck-tour: the backward of every differentiable op on every device"};
  app.add_option("--shards", options.shards, "split the registry into N shards")->check(CLI::PositiveNumber);
  app.add_option("--shard", options.shard, "run shard K (0-based) of --shards");
  app.add_option("--only", options.only, "only the entries whose name contains this");
  CLI11_PARSE(app, argc, argv);
  if (options.shard >= options.shards) {
    std::fprintf(stderr, "--shard %zu: must be below --shards %zu\n", options.shard, options.shards);
    return 2;
  }
  const auto report = qgrad::registry::run_conformance(options);
  std::printf("%zu passed, %zu failed\n", report.checks - report.failed, report.failed);
  return report.failed == 0 ? 0 : 1;
}
