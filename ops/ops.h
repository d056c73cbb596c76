// All of qgrad's ops.
#pragma once

#include "ops/elementwise.h"
#include "ops/activation.h"
#include "ops/linalg.h"
#include "ops/loss.h"
#include "ops/reduce.h"
#include "ops/quantize.h"
#include "ops/lerp.h"
#include "ops/dynamic_quant.h"
#include "ops/quantized_linear.h"
#include "ops/smoothquant.h"
