// layer_norm, rms_norm, embedding and dropout: validation, forward, saved
// state and backward.
#include "qgrad/ops/transformer.h"

#include <cmath>
#include <limits>
#include <vector>

#include "qgrad/autograd/node.h"
#include "qgrad/kernels/bitmask.h"
#include "qgrad/kernels/lowbit.h"
#include "qgrad/kernels/quantize.h"
#include "qgrad/kernels/transformer.h"
#include "qgrad/ops/check.h"
#include "qgrad/ops/lowbit.h"
#include "qgrad/ops/straight_through.h"

namespace qgrad {

namespace {

TensorOptions like(const Tensor& t) { return TensorOptions{}.with_dtype(t.dtype()).with_device(t.device()); }
using detail::new_mask;
// The dtype of the saved statistics: f32, or f64 for f64 inputs.
DType stat_dtype(DType x) { return x == DType::f64 ? DType::f64 : DType::f32; }

// Checks x, normalized_shape and an optional per-element parameter (weight,
// bias) and returns the row length d = prod(normalized_shape).
std::int64_t check_normalized(const char* op, const Tensor& x, const Shape& normalized_shape) {
  check::floating(x, op, "x");
  const auto k = static_cast<std::int64_t>(normalized_shape.size());
  QGRAD_CHECK(k > 0, op, "normalized_shape", "must name at least one dim");
  QGRAD_CHECK(k <= x.dim(), op, "normalized_shape", "shape ", shape_str(normalized_shape),
              " has more dims than x of shape ", shape_str(x.shape()));
  std::int64_t d = 1;
  for (std::int64_t i = 0; i < k; ++i) {
    const std::int64_t want = normalized_shape[static_cast<std::size_t>(i)];
    QGRAD_CHECK(want > 0 && x.size(x.dim() - k + i) == want, op, "normalized_shape", "shape ",
                shape_str(normalized_shape), " is not the trailing shape of x ", shape_str(x.shape()));
    d *= want;
  }
  return d;
}
void check_param(const char* op, const char* arg, const Tensor& p, const Tensor& x, const Shape& normalized_shape) {
  if (!p.defined()) return;
  check::same_dtype(p, x, op, arg);
  check::same_device(p, x, op, arg);
  QGRAD_CHECK(p.shape() == normalized_shape, op, arg, "shape ", shape_str(p.shape()), " differs from normalized_shape ",
              shape_str(normalized_shape));
}

// The shared backward of layer_norm and rms_norm (mean undefined: rms_norm):
// dx, and the column sums dweight = sum(dy * xhat), dbias = sum(dy). With a
// fake-quant mask (layer_norm_fake_quantize_dynamic), the kernels read dy
// masked as the fake quant's straight-through backward masks it (no pass
// writing the masked dy: kernels::norm_backward's dy_mask). A folding rule:
// where x's other consumers (a residual add) have already passed back their
// gradient, dx is written as that gradient plus the norm's (the engine's add
// of the two, in the same pass). The parameters' finishing passes are
// deferred where both are leaves (kernels/deferred.h).
void record_norm(const char* op, Tensor& out, const Tensor& x, const Shape& normalized_shape, const Tensor& weight,
                 const Tensor& bias, const Tensor& mean, const Tensor& rstd, std::int64_t d,
                 const Tensor& fq_mask = Tensor()) {
  const bool need_x = x.requires_grad();
  const bool need_w = weight.defined() && weight.requires_grad();
  const bool need_b = bias.defined() && bias.requires_grad();
  // Parameters that are leaves (or casts of leaves: mixed precision) take
  // their gradients' finishing passes deferred (autograd/node.h
  // deferred_gradient_passes, gradient_deferrable): one launch for all.
  const bool leaf_params = (!need_w || gradient_deferrable(weight)) && (!need_b || gradient_deferrable(bias));
  Tensor sw = weight.defined() ? weight.detach() : Tensor();
  record_folding(
      op, out, {x, weight, bias},
      [sx = x.detach(), sw, mean, rstd, d, normalized_shape, need_x, need_w, need_b, fq_mask, leaf_params](
          const Tensor& dy, const std::vector<Tensor>& pending, std::vector<char>& folded) {
        Tensor dx = need_x ? Tensor::empty(sx.shape(), like(dy)) : Tensor();
        Tensor dw = need_w ? Tensor::empty(normalized_shape, like(dy)) : Tensor();
        Tensor db = need_b ? Tensor::empty(normalized_shape, like(dy)) : Tensor();
        // x's gradient from its other consumers (a residual stream's): added
        // by the pass that writes dx rather than by an add of the engine's.
        Tensor dx_pending;
        if (need_x && !pending.empty() && pending[0].defined() && pending[0].dtype() == dx.dtype() &&
            pending[0].shape() == dx.shape() && pending[0].device() == dx.device()) {
          dx_pending = pending[0];
          folded[0] = 1;
        }
        kernels::norm_backward(sx, sw, mean, rstd, dy, dx, dw, db, d,
                               fq_mask.defined() ? static_cast<const std::uint32_t*>(fq_mask.data_ptr()) : nullptr,
                               dx_pending, leaf_params ? deferred_gradient_passes() : nullptr);
        return std::vector<Tensor>{dx, dw, db};
      },
      x.nbytes() + (sw.defined() ? sw.nbytes() : 0) + (mean.defined() ? mean.nbytes() : 0) + rstd.nbytes() +
          (fq_mask.defined() ? fq_mask.nbytes() : 0));
}

}  // namespace

Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, const Tensor& bias,
                  double eps) {
  constexpr const char* op = "layer_norm";
  const std::int64_t d = check_normalized(op, x, normalized_shape);
  check_param(op, "weight", weight, x, normalized_shape);
  check_param(op, "bias", bias, x, normalized_shape);
  check::finite_positive(eps, op, "eps");
  const std::int64_t rows = x.numel() / d;
  Tensor out = Tensor::empty(x.shape(), like(x));
  const TensorOptions so = TensorOptions{}.with_dtype(stat_dtype(x.dtype())).with_device(x.device());
  Tensor mean = Tensor::empty({rows}, so), rstd = Tensor::empty({rows}, so);
  if (rows > 0) kernels::layer_norm(x, weight, bias, out, mean, rstd, d, eps);
  if (any_requires_grad({x, weight, bias})) record_norm(op, out, x, normalized_shape, weight, bias, mean, rstd, d);
  return out;
}

Tensor layer_norm_fake_quantize_dynamic(const Tensor& x, const Shape& normalized_shape, const Tensor& weight,
                                        const Tensor& bias, double eps, QuantMode mode, std::int64_t qmin,
                                        std::int64_t qmax, double quant_eps) {
  constexpr const char* op = "layer_norm_fake_quantize_dynamic";
  const std::int64_t d = check_normalized(op, x, normalized_shape);
  check_param(op, "weight", weight, x, normalized_shape);
  check_param(op, "bias", bias, x, normalized_shape);
  check::finite_positive(eps, op, "eps");
  check::quant_mode(mode, op);
  const float qe = check::affine_range(qmin, qmax, quant_eps, op);
  const std::int64_t rows = x.numel() / d;
  if (x.is_cuda() && normalized_shape.size() == 1 && rows > 0 && x.dtype() != DType::f64) {
    Tensor out = Tensor::empty(x.shape(), like(x));
    const TensorOptions so = TensorOptions{}.with_dtype(stat_dtype(x.dtype())).with_device(x.device());
    Tensor mean = Tensor::empty({rows}, so), rstd = Tensor::empty({rows}, so);
    const bool need = any_requires_grad({x, weight, bias});
    Tensor mask = need ? new_mask(x) : Tensor();
    const kernels::NormQuantRows a{d, eps, static_cast<int>(qmin), static_cast<int>(qmax), mode == QuantMode::symmetric,
                                   qe};
    if (kernels::layer_norm_fake_quantize_dynamic_rows(
            x, weight, bias, out, mean, rstd, mask.defined() ? static_cast<std::uint32_t*>(mask.data_ptr()) : nullptr,
            a)) {
      if (need) record_norm(op, out, x, normalized_shape, weight, bias, mean, rstd, d, mask);
      return out;
    }
  }
  return fake_quantize_dynamic(layer_norm(x, normalized_shape, weight, bias, eps), QuantScope::per_token(), mode, qmin,
                               qmax, quant_eps);
}

Tensor rms_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, std::optional<double> eps) {
  constexpr const char* op = "rms_norm";
  const std::int64_t d = check_normalized(op, x, normalized_shape);
  check_param(op, "weight", weight, x, normalized_shape);
  if (eps.has_value()) check::finite_positive(*eps, op, "eps");
  const double e = eps.has_value() ? *eps
                   : x.dtype() == DType::f64 ? std::numeric_limits<double>::epsilon()
                                             : static_cast<double>(std::numeric_limits<float>::epsilon());
  const std::int64_t rows = x.numel() / d;
  Tensor out = Tensor::empty(x.shape(), like(x));
  Tensor rstd = Tensor::empty({rows}, TensorOptions{}.with_dtype(stat_dtype(x.dtype())).with_device(x.device()));
  if (rows > 0) kernels::rms_norm(x, weight, out, rstd, d, e);
  if (any_requires_grad({x, weight})) record_norm(op, out, x, normalized_shape, weight, Tensor(), Tensor(), rstd, d);
  return out;
}

// Backward: dweight rows summed over their occurrences in index order
// (kernels::embedding_backward). Saves the indices.
Tensor embedding(const Tensor& weight, const Tensor& indices, std::optional<std::int64_t> padding_idx) {
  constexpr const char* op = "embedding";
  check::floating(weight, op, "weight");
  check::rank_is(weight, 2, op, "weight");
  check::defined(indices, op, "indices");
  QGRAD_CHECK(indices.dtype() == DType::s32 || indices.dtype() == DType::s64, op, "indices",
              "expected dtype s32 or s64, got ", dtype_name(indices.dtype()));
  check::same_device(indices, weight, op, "indices");
  const std::int64_t V = weight.size(0), D = weight.size(1);
  std::int64_t pad = -1;
  if (padding_idx.has_value()) {
    QGRAD_CHECK(*padding_idx >= -V && *padding_idx < V, op, "padding_idx", "padding_idx ", *padding_idx,
                " out of range for ", V, " rows");
    pad = *padding_idx < 0 ? *padding_idx + V : *padding_idx;
  }
  if (indices.device().is_cpu()) {
    // The values, on the CPU only: on CUDA this would need a host sync
    // (out-of-range rows come out NaN there instead).
    auto check_values = [&](const auto* v) {
      for (std::int64_t i = 0; i < indices.numel(); ++i)
        QGRAD_CHECK(v[i] >= 0 && static_cast<std::int64_t>(v[i]) < V, op, "indices", "index ",
                    static_cast<std::int64_t>(v[i]), " at position ", i, " out of range for ", V, " rows");
    };
    if (indices.dtype() == DType::s32) check_values(static_cast<const std::int32_t*>(indices.data_ptr()));
    else check_values(static_cast<const std::int64_t*>(indices.data_ptr()));
  }
  Shape out_shape = indices.shape();
  out_shape.push_back(D);
  Tensor out = Tensor::empty(out_shape, like(weight));
  if (out.numel() > 0) kernels::embedding(weight, indices, out);
  if (any_requires_grad({weight}))
    record(
        op, out, {weight},
        [indices, shape = weight.shape(), pad](const Tensor& g) {
          Tensor dw = Tensor::empty(shape, like(g));
          if (dw.numel() > 0) kernels::embedding_backward(g, indices, dw, pad);
          return std::vector<Tensor>{dw};
        },
        indices.nbytes());
  return out;
}

// Backward: dy * mask / (1 - p). Saves the mask bits.
Tensor dropout(const Tensor& x, double p, bool training, Generator& generator) {
  constexpr const char* op = "dropout";
  check::floating(x, op, "x");
  QGRAD_CHECK(p >= 0.0 && p <= 1.0, op, "p", "probability must be in [0, 1], got ", p);
  if (!training || p == 0.0) return x;
  const std::uint64_t offset = generator.advance(static_cast<std::uint64_t>(x.numel()));
  const bool grad = any_requires_grad({x});
  Tensor out = Tensor::empty(x.shape(), like(x));
  Tensor mask;
  if (grad)
    mask = new_mask(x);
  if (x.numel() > 0) kernels::dropout(x, out, mask, generator.seed(), offset, p);
  if (grad)
    record(
        op, out, {x},
        [mask, p](const Tensor& g) {
          Tensor dx = Tensor::empty(g.shape(), like(g));
          if (g.numel() > 0) kernels::dropout_backward(g, mask, dx, p);
          return std::vector<Tensor>{dx};
        },
        mask.nbytes());
  return out;
}

}  // namespace qgrad
