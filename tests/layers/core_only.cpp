// Control probe for tests/layers/probe.cmake: core headers only.
#include "qgrad/core/tensor.h"

namespace qgrad {
std::int64_t layers_probe_numel(const Tensor& t) { return t.numel(); }
}  // namespace qgrad
