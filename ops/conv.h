// 2-D convolution (torch.nn.functional.conv2d).
#pragma once

#include <array>
#include <cstdint>

#include "qgrad/core/tensor.h"

namespace qgrad {

// y[n, o] = bias[o] + sum over c in o's group, i < kh, j < kw of
//   weight[o, c, i, j] · x[n, c, oh·sh − ph + i·dh, ow·sw − pw + j·dw]
// (zero outside x) for x [N, C, H, W] (NCHW), weight [O, C / groups, kh, kw],
// bias [O] or an undefined Tensor; y [N, O, OH, OW] with
// OH = floor((H + 2·ph − dh·(kh − 1) − 1) / sh) + 1 (OW alike).
// stride {sh, sw} >= 1, padding {ph, pw} >= 0, dilation {dh, dw} >= 1;
// groups divides C and O (groups == C: depthwise). docs/ops.md "conv2d".
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(),
              std::array<std::int64_t, 2> stride = {1, 1}, std::array<std::int64_t, 2> padding = {0, 0},
              std::array<std::int64_t, 2> dilation = {1, 1}, std::int64_t groups = 1);

}  // namespace qgrad
