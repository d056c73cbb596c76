// Probe for tests/layers/probe.cmake: compiles (Tensor::reshape is declared
// in core/tensor.h) but must not link into core alone (it is defined in ops/).
#include "qgrad/core/tensor.h"

namespace qgrad {
Tensor layers_probe_flatten(const Tensor& t) { return t.reshape({-1}); }
}  // namespace qgrad
