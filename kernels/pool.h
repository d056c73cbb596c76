// Kernels of the 2-d poolings on NCHW planes (kernels/formulas/pool.h holds
// the window formulas). Every backward is a gather: one index per input
// element sums, in increasing (oh, ow) order, the outputs whose window holds
// it, so the result is deterministic and the same on CPU and CUDA.
#pragma once

#include "qgrad/core/tensor.h"
#include "qgrad/kernels/formulas/pool.h"
#include "qgrad/kernels/formulas/quantize.h"

namespace qgrad::kernels {

using formulas::Pool2dGeometry;

// The forwards also take s8 / u8 x and y (the integer poolings of
// ops/pool_norm.h: max exact, the averages with PyTorch's quantized rounding,
// formulas::quantized_avg / quantized_adaptive_avg).

// y = the largest element of each dilated window (NaN wins: the last NaN in
// scan order gives the index, as in PyTorch; ties keep the first); when
// indices is defined (s64, y's shape) it receives the flat index ih * iw + iw
// of that element within its plane.
void max_pool2d(const Tensor& x, const Tensor& y, const Tensor& indices, const Pool2dGeometry& g);
// dx[i] = sum of dy[o] over the outputs o whose index names input i.
// Windows that tile the input (windows_tile_input) take one index per
// window, writing the gather's values (0 + dy[o] at its index, 0 elsewhere).
void max_pool2d_backward(const Tensor& dy, const Tensor& indices, const Tensor& dx, const Pool2dGeometry& g);
// max_pool2d of fake_quantize_per_tensor(x, p, qmin, qmax) (p: the device or
// host scale and zero point) without the fake-quantized tensor: each window
// scanned over the fake-quantized values (formulas::FakeQuantOp), y the
// max; codes (s32, y's shape) the flat index r of the argmax in its plane,
// or -1 - r when the argmax's fake-quant mask bit is 0 (planes of < 2^31
// elements). The backward writes what max_pool2d_backward and the fake
// quant's backward (dy * mask) write in turn.
//
// With `normalized`, x is instead the input of a batch norm with relu, and
// the fake quant reads relu(batch_norm(x)) computed where read, as
// batch_norm_apply(..., relu = true) writes it (formulas::normalize_relu;
// with the channel_div_add prologue when divisor is defined): mean and
// invstd in op math [C], weight, bias, divisor, shift x's dtype [C] or
// undefined.
struct NormalizedInput {
  Tensor mean, invstd, weight, bias, divisor, shift;
  std::int64_t channels = 1;
};
void fake_quantize_max_pool2d(const Tensor& x, const Tensor& y, const Tensor& codes, const formulas::ParamSource& p,
                              std::int64_t qmin, std::int64_t qmax, const Pool2dGeometry& g,
                              const NormalizedInput* normalized = nullptr);
void fake_quantize_max_pool2d_backward(const Tensor& dy, const Tensor& codes, const Tensor& dx,
                                       const Pool2dGeometry& g);
// No padding, each window's span (kernel - 1) * dilation + 1 equal to its
// stride, and the input exactly oh x ow windows: every element in one window.
bool windows_tile_input(const Pool2dGeometry& g);

// y = sum of the window / its divisor (formulas::avg_pool_window).
void avg_pool2d(const Tensor& x, const Tensor& y, const Pool2dGeometry& g, bool count_include_pad);
void avg_pool2d_backward(const Tensor& dy, const Tensor& dx, const Pool2dGeometry& g, bool count_include_pad);

// y = the mean of the adaptive window (g.kh .. g.dw unused); (1, 1) outputs
// take the row reduction of kernels/reduce.h.
void adaptive_avg_pool2d(const Tensor& x, const Tensor& y, const Pool2dGeometry& g);
void adaptive_avg_pool2d_backward(const Tensor& dy, const Tensor& dx, const Pool2dGeometry& g);

}  // namespace qgrad::kernels
