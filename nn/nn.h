// qgrad::nn umbrella header: modules, optimizers and schedules,
// quantization (observers, fake quant, QAT prepare/convert), data and
// checkpoints.
#pragma once

#include "nn/checkpoint.h"
#include "nn/data.h"
#include "nn/layers.h"
#include "nn/module.h"
#include "nn/optim.h"
#include "nn/quant.h"
#include "nn/qat.h"
