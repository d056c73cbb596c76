// The int4 linear layers (ops/lowbit_linear.h): validation, then the
// kernels of kernels/lowbit_linear.h (W4A16, grouped W4A8) or, for W4A8 per
// channel with symmetric activations, the widened weight through
// quantized_linear's int8 GEMM and epilogue (kernels/qlinear.h).
#include "qgrad/ops/lowbit_linear.h"

#include "qgrad/kernels/dynamic_quant.h"
#include "qgrad/kernels/formulas/lowbit_linear.h"
#include "qgrad/kernels/lowbit_linear.h"
#include "qgrad/kernels/qlinear.h"
#include "qgrad/ops/check.h"

namespace qgrad {

namespace {

using I64 = std::int64_t;

void check_activation(const Tensor& x, const char* op) {
  check::floating(x, op, "x");
  QGRAD_CHECK(x.dtype() != DType::f64, op, "x", "expected f32, f16 or bf16, got f64");
  QGRAD_CHECK(x.dim() >= 1, op, "x", "expected rank >= 1 ([..., K]), got a scalar");
  QGRAD_CHECK(x.size(-1) >= 1, op, "x", "inner dimension K must be >= 1, got shape ", shape_str(x.shape()));
}

// w_q packed [N, K]: rank 2, N >= 1, K even and >= 2, G > 0 dividing K; returns N.
I64 check_weight_shape(const Tensor& w_q, I64 group_size, const char* op) {
  check::defined(w_q, op, "w_q");
  check::rank_is(w_q, 2, op, "w_q");
  const I64 N = w_q.size(0), K = w_q.size(1);
  QGRAD_CHECK(N >= 1 && K >= 2, op, "w_q", "needs at least one output and two input channels, got shape ",
              shape_str(w_q.shape()));
  QGRAD_CHECK(K % 2 == 0, op, "w_q", "packed int4 rows need an even K (two values per byte), got K = ", K);
  QGRAD_CHECK(group_size > 0, op, "group_size", "must be > 0, got ", group_size);
  QGRAD_CHECK(K % group_size == 0, op, "group_size", "K = ", K, " is not a multiple of the group size ", group_size);
  return N;
}

// ... and on x's device with x's K.
I64 check_weight(const Tensor& x, const Tensor& w_q, I64 group_size, const char* op) {
  const I64 N = check_weight_shape(w_q, group_size, op);
  check::same_device(w_q, x, op, "w_q");
  QGRAD_CHECK(w_q.size(1) == x.size(-1), op, "w_q", "shape ", shape_str(w_q.shape()), " does not match K = ",
              x.size(-1), " of x ", shape_str(x.shape()));
  return N;
}

// w_scale [N, groups] on ref's device, finite and > 0 (checked on the host).
void check_scale_placement(const Tensor& w_scale, const Tensor& ref, I64 N, I64 groups, const char* op) {
  check::same_device(w_scale, ref, op, "w_scale");
  QGRAD_CHECK(w_scale.shape() == (Shape{N, groups}), op, "w_scale", "expected shape [", N, ", ", groups, "], got ",
              shape_str(w_scale.shape()));
  if (w_scale.device().is_cpu()) {
    const Tensor s = w_scale.dtype() == DType::f32 ? w_scale : w_scale.to(DType::f32);  // exact widening
    const float* v = s.data<float>();
    for (I64 i = 0; i < N * groups; ++i) check::finite_positive(v[i], op, "w_scale");
  }
}

// w_scale as above on x's device; f32, or (allow_x_dtype, W4A16) x's 16-bit dtype.
void check_scale(const Tensor& x, const Tensor& w_scale, I64 N, I64 groups, const char* op, bool allow_x_dtype) {
  check::defined(w_scale, op, "w_scale");
  const bool x_dtype = allow_x_dtype && x.dtype() != DType::f32 && w_scale.dtype() == x.dtype();
  QGRAD_CHECK(w_scale.dtype() == DType::f32 || x_dtype, op, "w_scale", "expected f32",
              allow_x_dtype && x.dtype() != DType::f32 ? std::string(" or ") + dtype_name(x.dtype()) + " (x's dtype)"
                                                       : std::string(),
              ", got ", dtype_name(w_scale.dtype()));
  check_scale_placement(w_scale, x, N, groups, op);
}

// An int4 weight's zero point: undefined for s4 (symmetric); for u4 s32
// [N, groups] on ref's device, values in [0, 15] (checked on the host).
void check_zero_point(DType w_dtype, const Tensor& w_zero_point, const Tensor& ref, I64 N, I64 groups,
                      const char* op) {
  if (w_dtype == DType::s4) {
    QGRAD_CHECK(!w_zero_point.defined(), op, "w_zero_point",
                "s4 weights are symmetric: the zero point must be undefined (use u4 weights for a zero point)");
    return;
  }
  check::dtype_is(w_zero_point, DType::s32, op, "w_zero_point");
  check::same_device(w_zero_point, ref, op, "w_zero_point");
  QGRAD_CHECK(w_zero_point.shape() == (Shape{N, groups}), op, "w_zero_point", "expected shape [", N, ", ", groups,
              "], got ", shape_str(w_zero_point.shape()));
  if (w_zero_point.device().is_cpu()) {
    const std::int32_t* z = w_zero_point.data<std::int32_t>();
    for (I64 i = 0; i < N * groups; ++i)
      QGRAD_CHECK(z[i] >= 0 && z[i] <= 15, op, "w_zero_point", "u4 zero point ", z[i], " outside [0, 15]");
  }
}

void check_bias(const Tensor& x, const Tensor& bias, I64 N, const char* op) {
  if (!bias.defined()) return;
  check::floating(bias, op, "bias");
  check::same_device(bias, x, op, "bias");
  QGRAD_CHECK(bias.shape() == Shape{N}, op, "bias", "expected shape [", N, "], got ", shape_str(bias.shape()));
}

Shape out_shape_of(const Tensor& x, I64 N) {
  Shape s = x.shape();
  s.back() = N;
  return s;
}

}  // namespace

Tensor linear_w4a16(const Tensor& x, const Tensor& w_q, const Tensor& w_scale, const Tensor& w_zero_point,
                    std::int64_t group_size, const Tensor& bias) {
  constexpr const char* kOp = "linear_w4a16";
  // ---- validation: everything before any allocation or launch ----
  check_activation(x, kOp);
  check::defined(w_q, kOp, "w_q");
  QGRAD_CHECK(is_packed_int4(w_q.dtype()), kOp, "w_q", "expected dtype s4 or u4, got ", dtype_name(w_q.dtype()));
  const I64 N = check_weight(x, w_q, group_size, kOp);
  const I64 K = x.size(-1), groups = K / group_size;
  check_scale(x, w_scale, N, groups, kOp, /*allow_x_dtype=*/true);
  check_zero_point(w_q.dtype(), w_zero_point, x, N, groups, kOp);
  check_bias(x, bias, N, kOp);

  // ---- compute ----
  Tensor out = Tensor::empty(out_shape_of(x, N), TensorOptions{}.with_dtype(x.dtype()).with_device(x.device()));
  const I64 M = x.numel() / K;
  if (M == 0) return out;
  const Tensor b = bias.defined() ? bias.detach().to(x.dtype()) : Tensor();
  kernels::w4a16_linear(x.detach().reshape({M, K}), w_q, w_scale, w_zero_point, group_size, b, out.reshape({M, N}));
  return out;
}

std::int64_t PackedW4A16::nbytes() const {
  auto bytes = [](const Tensor& t) { return t.defined() ? t.numel() * static_cast<I64>(dtype_size(t.dtype())) : 0; };
  return bytes(frag_) + bytes(scale_) + bytes(zero_point_);
}

PackedW4A16 pack_w4a16(const Tensor& w_q, const Tensor& w_scale, const Tensor& w_zero_point, std::int64_t group_size) {
  constexpr const char* kOp = "pack_w4a16";
  // ---- validation (linear_w4a16's checks of the weight, without x) ----
  check::defined(w_q, kOp, "w_q");
  QGRAD_CHECK(is_packed_int4(w_q.dtype()), kOp, "w_q", "expected dtype s4 or u4, got ", dtype_name(w_q.dtype()));
  const I64 N = check_weight_shape(w_q, group_size, kOp), K = w_q.size(1);
  const I64 groups = K / group_size;
  check::defined(w_scale, kOp, "w_scale");
  QGRAD_CHECK(w_scale.dtype() == DType::f32 || w_scale.dtype() == DType::f16 || w_scale.dtype() == DType::bf16, kOp,
              "w_scale", "expected f32, f16 or bf16 (the activations' dtype), got ", dtype_name(w_scale.dtype()));
  check_scale_placement(w_scale, w_q, N, groups, kOp);
  check_zero_point(w_q.dtype(), w_zero_point, w_q, N, groups, kOp);

  // ---- compute: copies first, the pack (and its settling launch) last ----
  PackedW4A16 p;
  p.scale_ = w_scale.detach().clone();
  if (w_zero_point.defined()) p.zero_point_ = w_zero_point.detach().clone();
  p.frag_ = Tensor::empty({formulas::w4a16_frag_bytes(N, K)},
                          TensorOptions{}.with_dtype(DType::u8).with_device(w_q.device()));
  kernels::w4a16_frag_pack(w_q, p.frag_);
  p.n_ = N;
  p.k_ = K;
  p.g_ = group_size;
  p.wdtype_ = w_q.dtype();
  return p;
}

Tensor linear_w4a16(const Tensor& x, const PackedW4A16& w, const Tensor& bias) {
  constexpr const char* kOp = "linear_w4a16";
  // ---- validation: everything before any allocation or launch ----
  check_activation(x, kOp);
  QGRAD_CHECK(w.defined(), kOp, "w", "the packed weight is undefined (make it with pack_w4a16)");
  check::same_device(w.frag_, x, kOp, "w");
  const I64 N = w.n_, K = w.k_;
  QGRAD_CHECK(x.size(-1) == K, kOp, "x", "inner dimension ", x.size(-1), " of x ", shape_str(x.shape()),
              " does not match the packed weight's K = ", K);
  QGRAD_CHECK(w.scale_.dtype() == DType::f32 || w.scale_.dtype() == x.dtype(), kOp, "w", "its scales are ",
              dtype_name(w.scale_.dtype()), ": x must be ", dtype_name(w.scale_.dtype()), " too, got ",
              dtype_name(x.dtype()));
  check_bias(x, bias, N, kOp);

  // ---- compute ----
  Tensor out = Tensor::empty(out_shape_of(x, N), TensorOptions{}.with_dtype(x.dtype()).with_device(x.device()));
  const I64 M = x.numel() / K;
  if (M == 0) return out;
  const Tensor b = bias.defined() ? bias.detach().to(x.dtype()) : Tensor();
  const Tensor x2 = x.detach().reshape({M, K}), out2 = out.reshape({M, N});
  if (!kernels::w4a16_linear_frag(x2, w.frag_, w.scale_, w.zero_point_, w.g_, b, out2)) {
    // Other shapes and devices read the plain order: a scratch copy of it.
    Tensor w_q = Tensor::empty({N, K}, TensorOptions{}.with_dtype(w.wdtype_).with_device(x.device()));
    kernels::w4a16_frag_unpack(w.frag_, w_q);
    kernels::w4a16_linear(x2, w_q, w.scale_, w.zero_point_, w.g_, b, out2);
  }
  return out;
}

Tensor linear_w4a8(const Tensor& x, const Tensor& w_q, const Tensor& w_scale, std::int64_t group_size,
                   const Tensor& bias, QuantMode act_mode, DType out_dtype, const Tensor& w_s8) {
  constexpr const char* kOp = "linear_w4a8";
  // ---- validation: everything before any allocation or launch ----
  check_activation(x, kOp);
  check::defined(w_q, kOp, "w_q");
  QGRAD_CHECK(w_q.dtype() == DType::s4, kOp, "w_q", "expected dtype s4 (symmetric int4 weights), got ",
              dtype_name(w_q.dtype()));
  const I64 N = check_weight(x, w_q, group_size, kOp);
  const I64 K = x.size(-1), groups = K / group_size;
  check_scale(x, w_scale, N, groups, kOp, /*allow_x_dtype=*/false);
  check_bias(x, bias, N, kOp);
  QGRAD_CHECK(act_mode == QuantMode::symmetric || act_mode == QuantMode::asymmetric, kOp, "act_mode",
              "unknown activation quantization mode");
  QGRAD_CHECK(out_dtype == DType::f32 || out_dtype == DType::bf16 || out_dtype == DType::f16, kOp, "out_dtype",
              "expected f32, bf16 or f16, got ", dtype_name(out_dtype));
  if (w_s8.defined()) {
    check::dtype_is(w_s8, DType::s8, kOp, "w_s8");
    check::same_device(w_s8, x, kOp, "w_s8");
    QGRAD_CHECK(w_s8.shape() == (Shape{N, K}), kOp, "w_s8", "expected shape [", N, ", ", K, "] (w_q widened), got ",
                shape_str(w_s8.shape()));
    if (w_s8.device().is_cpu()) {
      Tensor ref = Tensor::empty({N, K}, TensorOptions{}.with_dtype(DType::s8));
      kernels::int4_widen(w_q, ref);
      const std::int8_t* a = w_s8.data<std::int8_t>();
      const std::int8_t* r = ref.data<std::int8_t>();
      for (I64 i = 0; i < N * K; ++i)
        QGRAD_CHECK(a[i] == r[i], kOp, "w_s8", "value ", static_cast<int>(a[i]), " at flat index ", i,
                    " differs from w_q's ", static_cast<int>(r[i]), " (a stale cache?)");
    }
  }

  // ---- compute ----
  const Device dev = x.device();
  const TensorOptions on = TensorOptions{}.with_device(dev);
  Tensor out = Tensor::empty(out_shape_of(x, N), TensorOptions(on).with_dtype(out_dtype));
  const I64 M = x.numel() / K;
  if (M == 0) return out;
  const bool symmetric = act_mode == QuantMode::symmetric;
  // Per-token int8 activations (dynamic_range_quantize's formulas), rows
  // padded to the int8 GEMM's stride on CUDA.
  const I64 lda = kernels::qlinear_lda(dev, K);
  Tensor a = Tensor::empty({M, lda}, TensorOptions(on).with_dtype(DType::s8));
  Tensor sa = Tensor::empty({M}, TensorOptions(on).with_dtype(DType::f32));
  Tensor za = symmetric ? Tensor() : Tensor::empty({M}, TensorOptions(on).with_dtype(DType::s32));
  const kernels::QuantSpec spec{symmetric, -128, 127};
  kernels::quantize_rows_dynamic(x.detach().reshape({M, K}), K, spec, a, lda, sa, za);
  const Tensor b = bias.defined() ? bias.detach().to(DType::f32) : Tensor();
  const Tensor out2 = out.reshape({M, N});
  if (group_size == K && symmetric) {
    // Per channel: widen to s8 (a scratch buffer, 1.5 bytes per weight moved)
    // and run quantized_linear's int8 GEMM + epilogue: the same bits as the
    // grouped formula with one group.
    // A caller's w_s8 (validated above) replaces the widening.
    Tensor w8 = w_s8;
    if (!w8.defined()) {
      w8 = Tensor::empty({N, K}, TensorOptions(on).with_dtype(DType::s8));
      kernels::int4_widen(w_q, w8);
    }
    kernels::QLinearEpilogue ep;
    ep.sa = sa;
    ep.per_row = true;
    ep.sw = w_scale.reshape({N});
    ep.bias = b;
    // A caller's w_s8: the kernels launched here (the activations' quantization,
    // the bias's cast) do not write it.
    ep.w_untouched_by_prior_kernel = w_s8.defined();
    kernels::qlinear(a, lda, K, w8, ep, out2);
  } else {
    kernels::w4a8_linear(a, lda, K, sa, za, w_q, w_scale, group_size, b, out2);
  }
  return out;
}

}  // namespace qgrad
