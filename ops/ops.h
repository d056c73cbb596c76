// All of qgrad's ops.
#pragma once

#include "ops/elementwise.h"
#include "ops/dynamic_quant.h"
#include "ops/quantized_linear.h"
#include "ops/smoothquant.h"
