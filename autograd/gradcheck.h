// gradcheck: compares the analytical Jacobian that backward computes with
// central finite differences, in f64.
//
// Full mode builds both Jacobians element by element (one backward per
// output element, two forwards per input element). Fast mode compares the
// scalar v^T J u for random u and v: one backward and two forwards.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "qgrad/core/tensor.h"

namespace qgrad {

struct GradcheckOptions {
  double eps = 1e-6;
  double atol = 1e-5;
  double rtol = 1e-3;
  bool fast_mode = false;
  std::uint64_t seed = 0x9c;  // for fast mode's u and v
};

struct GradcheckResult {
  bool ok = true;
  double max_abs_error = 0;  // worst |analytical - numerical|
  double max_rel_error = 0;  // at that element: error / max(|numerical|, tiny)
  int worst_input = -1;      // which input holds the worst element (-1 fast mode)
  std::int64_t worst_input_index = -1;
  std::int64_t worst_output_index = -1;
  double analytical = 0, numerical = 0;  // the worst pair
  std::string message;       // a one-line report
};

using GradcheckFn = std::function<Tensor(const std::vector<Tensor>&)>;

// `inputs` must be f64 tensors on one device; those that require grad are
// checked. `fn` must be deterministic.
GradcheckResult gradcheck(const GradcheckFn& fn, const std::vector<Tensor>& inputs,
                          const GradcheckOptions& options = {});

}  // namespace qgrad
