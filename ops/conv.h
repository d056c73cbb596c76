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

// Whether f32 convolutions on CUDA may run on TF32 tensor cores (operands
// rounded to 10 mantissa bits, f32 accumulation), as PyTorch's
// torch.backends.cudnn.allow_tf32 (on by default there). Off by default:
// qgrad's f32 convolutions then agree with the CPU within 1e-5; with TF32
// on, within the bound of docs/ops.md "conv2d". Read when conv2d runs; its
// backward takes the forward's setting. Process-wide, thread-safe; no
// effect on the CPU, f64, f16 or bf16.
void set_conv_allow_tf32(bool allow);
bool conv_allow_tf32();

}  // namespace qgrad
