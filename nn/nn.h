// qgrad::nn umbrella header: modules, optimizers and schedules,
// quantization (observers, fake quant, QAT prepare/convert), data and
// checkpoints.
#pragma once

#include "qgrad/nn/checkpoint.h"
#include "qgrad/nn/conv.h"
#include "qgrad/nn/data.h"
#include "qgrad/nn/fused_mlp.h"
#include "qgrad/nn/layers.h"
#include "qgrad/nn/module.h"
#include "qgrad/nn/optim.h"
#include "qgrad/nn/quant.h"
#include "qgrad/nn/qat.h"
#include "qgrad/nn/qat_conv.h"
#include "qgrad/nn/recipes.h"
#include "qgrad/nn/smoothquant.h"
#include "qgrad/nn/pool_norm.h"
#include "qgrad/nn/transformer.h"
#include "qgrad/nn/vit.h"
