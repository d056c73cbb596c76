// All of qgrad's ops.
#pragma once

#include "ops/elementwise.h"
