// quantized_conv2d: validation, then the quantized im2col and the int8 GEMM
// with its epilogue (kernels/qconv.h).
#include "qgrad/ops/quantized_conv.h"

#include "qgrad/kernels/qconv.h"
#include "qgrad/ops/check.h"

namespace qgrad {

namespace {

constexpr const char* kOp = "quantized_conv2d";

// Every argument, checked before anything is allocated; the shape of the
// convolution.
kernels::Conv2dShape qconv_shape(const Tensor& x, const Tensor& w_q, const Tensor& w_scale, const Tensor& bias,
                                 const ActivationQuant& act, std::array<std::int64_t, 2> stride,
                                 std::array<std::int64_t, 2> padding, std::array<std::int64_t, 2> dilation,
                                 std::int64_t groups, DType out_dtype) {
  check::floating(x, kOp, "x");
  QGRAD_CHECK(x.dim() == 4, kOp, "x", "expected rank 4 [N, C, H, W], got shape ", shape_str(x.shape()));
  check::dtype_is(w_q, DType::s8, kOp, "w_q");
  check::same_device(w_q, x, kOp, "w_q");
  QGRAD_CHECK(w_q.dim() == 4, kOp, "w_q", "expected rank 4 [O, C / groups, kh, kw], got shape ",
              shape_str(w_q.shape()));
  const std::int64_t O = w_q.size(0);
  check::dtype_is(w_scale, DType::f32, kOp, "w_scale");
  check::same_device(w_scale, x, kOp, "w_scale");
  QGRAD_CHECK(w_scale.shape() == Shape{O}, kOp, "w_scale", "expected shape [", O, "] (w_q's out channels), got ",
              shape_str(w_scale.shape()));
  if (w_scale.device().is_cpu()) {
    const float* s = w_scale.data<float>();
    for (std::int64_t o = 0; o < O; ++o) check::finite_positive(s[o], kOp, "w_scale");
  }
  if (bias.defined()) {
    check::floating(bias, kOp, "bias");
    check::same_device(bias, x, kOp, "bias");
    QGRAD_CHECK(bias.shape() == Shape{O}, kOp, "bias", "expected shape [", O, "] (w_q's out channels), got ",
                shape_str(bias.shape()));
  }
  QGRAD_CHECK(is_floating(out_dtype), kOp, "out_dtype", "expected f32, f64, f16 or bf16, got ",
              dtype_name(out_dtype));
  QGRAD_CHECK(act.kind == ActivationQuant::static_per_tensor, kOp, "act.kind",
              "the int8 convolution quantizes its input per tensor with static qparams "
              "(ActivationQuant::fixed), not dynamically per token");
  check::static_activation_quant(act, x.device(), kOp);
  const kernels::Conv2dShape s =
      kernels::conv2d_geometry(x.shape(), w_q.shape(), stride, padding, dilation, groups, kOp, "w_q");
  // The column matrix: groups x (N OH OW) rows of (C / groups) kh kw.
  shape_numel({s.groups, s.n * s.oh * s.ow, s.patch() + 16}, kOp);
  return s;
}

}  // namespace

// Not recorded on the tape (inference): saves nothing. Temporaries: the s8
// column matrix, groups * N OH OW * lda bytes (lda = K on the CPU, K rounded
// up to 16 on CUDA; K = C/groups kh kw), and on CUDA the int32 GEMM output
// [O, N OH OW] (4 bytes per output) and the padded weight when K % 16 != 0.
Tensor quantized_conv2d(const Tensor& x, const Tensor& w_q, const Tensor& w_scale, const Tensor& bias,
                        const ActivationQuant& act, std::array<std::int64_t, 2> stride,
                        std::array<std::int64_t, 2> padding, std::array<std::int64_t, 2> dilation, std::int64_t groups,
                        DType out_dtype) {
  const kernels::Conv2dShape s =
      qconv_shape(x, w_q, w_scale, bias, act, stride, padding, dilation, groups, out_dtype);
  const Device dev = x.device();
  const TensorOptions on = TensorOptions{}.with_device(dev);
  Tensor out = Tensor::empty({s.n, s.o, s.oh, s.ow}, TensorOptions(on).with_dtype(out_dtype));
  if (s.n == 0) return out;
  const std::int64_t lda = kernels::qconv_lda(dev, s.patch());
  Tensor col = Tensor::empty({s.groups, s.n * s.oh * s.ow, lda}, TensorOptions(on).with_dtype(DType::s8));
  kernels::qconv_columns(s, x, {act.scale, act.zero_point, static_cast<int>(act.qmin), static_cast<int>(act.qmax)},
                         col, lda);
  kernels::QLinearEpilogue ep;
  ep.sa = act.scale;
  ep.per_row = false;
  ep.sw = w_scale;
  if (bias.defined()) ep.bias = bias.detach().to(out_dtype == DType::f64 ? DType::f64 : DType::f32);
  kernels::qconv_gemm(s, col, lda, w_q, ep, out);
  return out;
}

}  // namespace qgrad
