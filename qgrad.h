// qgrad: graph-based autodiff for quantization-aware training.
// The one header a user includes.
#pragma once

#include "qgrad/autograd/gradcheck.h"
#include "qgrad/autograd/node.h"
#include "qgrad/core/device.h"
#include "qgrad/core/dtype.h"
#include "qgrad/core/error.h"
#include "qgrad/core/tensor.h"
#include "qgrad/ops/ops.h"
#include "qgrad/autograd/dot.h"
#include "qgrad/nn/nn.h"
#include "qgrad/export/onnx.h"
#include "qgrad/dist/ddp.h"
#include "qgrad/dist/process_group.h"
#include "qgrad/dist/store.h"
