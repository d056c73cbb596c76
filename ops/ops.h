// All of qgrad's ops.
#pragma once

#include "qgrad/ops/elementwise.h"
#include "qgrad/ops/factory.h"
#include "qgrad/ops/activation.h"
#include "qgrad/ops/linalg.h"
#include "qgrad/ops/loss.h"
#include "qgrad/ops/reduce.h"
#include "qgrad/ops/quantize.h"
#include "qgrad/ops/lerp.h"
#include "qgrad/ops/dynamic_quant.h"
#include "qgrad/ops/quantized_linear.h"
#include "qgrad/ops/observer.h"
#include "qgrad/ops/optim.h"
#include "qgrad/ops/pool_norm.h"
#include "qgrad/ops/lowbit.h"
#include "qgrad/ops/transformer.h"
#include "qgrad/ops/conv.h"
