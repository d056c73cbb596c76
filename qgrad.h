// qgrad: graph-based autodiff for quantization-aware training.
// The one header a user includes.
#pragma once

#include "autograd/gradcheck.h"
#include "autograd/node.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/tensor.h"
#include "ops/ops.h"
#include "autograd/dot.h"
#include "nn/nn.h"
