// All of qgrad's ops.
#pragma once

#include "ops/elementwise.h"
#include "ops/quantize.h"
#include "ops/lerp.h"
