// Probe for tests/layers/probe.cmake: core including ops must not compile.
#include "qgrad/core/tensor.h"
#include "qgrad/ops/ops.h"
