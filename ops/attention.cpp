// scaled_dot_product_attention: validation, forward (batched GEMM, the fused
// scale/mask/softmax/dropout row kernel, batched GEMM), saved state and
// backward.
#include "qgrad/ops/attention.h"

#include <cmath>
#include <climits>

#include "qgrad/autograd/node.h"
#include "qgrad/kernels/attention.h"
#include "qgrad/kernels/linalg.h"
#include "qgrad/kernels/lowbit.h"
#include "qgrad/ops/check.h"
#include "qgrad/ops/elementwise.h"
#include "qgrad/ops/linalg.h"
#include "qgrad/ops/lowbit.h"
#include "qgrad/ops/shape.h"
#include "qgrad/ops/straight_through.h"

namespace qgrad {

using detail::mask_words;
using detail::new_mask;
using kernels::AttentionRows;
using kernels::GemmShape;

namespace {

TensorOptions like(const Tensor& t) { return TensorOptions{}.with_dtype(t.dtype()).with_device(t.device()); }

// math: GemmShape::f32_math (the forward's float32_matmul(), kept for its backward).
Tensor gemm_new(const Shape& shape, GemmShape s, const Tensor& a, const Tensor& b, Float32Matmul math) {
  Tensor c = Tensor::empty(shape, like(a));
  s.f32_math = math;
  kernels::gemm(s, a, b, c);
  return c;
}

Shape with_last2(const Shape& lead, std::int64_t r, std::int64_t c) {
  Shape s = lead;
  s.push_back(r);
  s.push_back(c);
  return s;
}

}  // namespace

// Backward (dO: the output's gradient; A = dropout(P), recomputed from the
// saved P and the seed): dV = Aᵀ · dO; dA = dO · Vᵀ; dZ = P * (dP - rowsum(dP * P))
// with dP = dropout(dA); dQ = scale * dZ · K; dK = scale * dZᵀ · Q; d mask =
// dZ summed to the mask's shape. Saves q, k, v (those the rule reads) and P.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& attn_mask,
                                    bool causal, std::optional<double> scale, double dropout_p,
                                    Generator& generator) {
  constexpr const char* op = "scaled_dot_product_attention";
  check::floating(q, op, "q");
  check::floating(k, op, "k");
  check::floating(v, op, "v");
  check::same_dtype(k, q, op, "k");
  check::same_dtype(v, q, op, "v");
  check::same_device(k, q, op, "k");
  check::same_device(v, q, op, "v");
  QGRAD_CHECK(q.dim() >= 2 && q.dim() <= 8, op, "q", "expected rank 2 to 8 ([..., L, D]), got shape ",
              shape_str(q.shape()));
  QGRAD_CHECK(k.dim() == q.dim(), op, "k", "rank differs from q's: shapes ", shape_str(q.shape()), " and ",
              shape_str(k.shape()));
  QGRAD_CHECK(v.dim() == q.dim(), op, "v", "rank differs from q's: shapes ", shape_str(q.shape()), " and ",
              shape_str(v.shape()));
  const Shape lead(q.shape().begin(), q.shape().end() - 2);
  QGRAD_CHECK(Shape(k.shape().begin(), k.shape().end() - 2) == lead, op, "k", "batch dims differ from q's: shapes ",
              shape_str(q.shape()), " and ", shape_str(k.shape()));
  QGRAD_CHECK(Shape(v.shape().begin(), v.shape().end() - 2) == lead, op, "v", "batch dims differ from q's: shapes ",
              shape_str(q.shape()), " and ", shape_str(v.shape()));
  const std::int64_t L = q.size(-2), D = q.size(-1), S = k.size(-2), Dv = v.size(-1);
  QGRAD_CHECK(k.size(-1) == D, op, "k", "head dim ", k.size(-1), " differs from q's ", D);
  QGRAD_CHECK(v.size(-2) == S, op, "v", "sequence length ", v.size(-2), " differs from k's ", S);
  const Shape score_shape = with_last2(lead, L, S);
  const std::int64_t batch = shape_numel(lead, op);
  shape_numel(score_shape, op);
  for (std::int64_t dim : {batch, L, S, D, Dv})
    QGRAD_CHECK(dim <= INT_MAX, op, "q", "dimension ", dim, " exceeds the GEMM limit ", INT_MAX);
  AttentionRows a;
  a.L = L;
  a.S = S;
  a.rows = batch * L;
  a.causal = causal;
  if (attn_mask.defined()) {
    QGRAD_CHECK(attn_mask.dtype() == DType::boolean || attn_mask.dtype() == q.dtype(), op, "attn_mask",
                "expected dtype bool or q's ", dtype_name(q.dtype()), ", got ", dtype_name(attn_mask.dtype()));
    check::same_device(attn_mask, q, op, "attn_mask");
    const Shape& ms = attn_mask.shape();
    bool ok = ms.size() <= score_shape.size();
    for (std::size_t i = 0; ok && i < ms.size(); ++i) {
      const std::int64_t want = score_shape[score_shape.size() - ms.size() + i];
      ok = ms[i] == 1 || ms[i] == want;
    }
    QGRAD_CHECK(ok, op, "attn_mask", "shape ", shape_str(ms), " does not broadcast to the scores' ",
                shape_str(score_shape));
    a.mask = attn_mask.dtype() == DType::boolean ? kernels::AttentionMaskKind::boolean
                                                 : kernels::AttentionMaskKind::additive;
    // Strides of the mask over [lead..., L] (rows) and S (columns), 0 where broadcast.
    const std::size_t rank = score_shape.size(), lead_dims = rank - ms.size();
    std::int64_t stride = 1;
    std::vector<std::int64_t> strides(rank, 0);
    for (std::size_t d = rank; d-- > lead_dims;) {
      const std::int64_t size = ms[d - lead_dims];
      strides[d] = size == 1 ? 0 : stride;
      stride *= size;
    }
    a.mask_ndim = static_cast<int>(rank - 1);
    for (std::size_t d = 0; d + 1 < rank; ++d) {
      a.mask_sizes[d] = score_shape[d];
      a.mask_strides[d] = strides[d];
    }
    a.mask_col_stride = strides[rank - 1];
  }
  const double sc = scale.has_value() ? *scale : 1.0 / std::sqrt(static_cast<double>(D));
  QGRAD_CHECK(std::isfinite(sc), op, "scale", "must be finite, got ", sc);
  a.scale = sc;
  QGRAD_CHECK(dropout_p >= 0.0 && dropout_p <= 1.0, op, "dropout_p", "probability must be in [0, 1], got ",
              dropout_p);
  a.p = dropout_p;
  const std::int64_t score_numel = batch * L * S;
  if (dropout_p > 0.0) {
    a.seed = generator.seed();
    a.offset = generator.advance(static_cast<std::uint64_t>(score_numel));
  }

  // probs in place of the scores.
  const Float32Matmul math = float32_matmul();
  Tensor probs = gemm_new(score_shape, GemmShape{batch, L, S, D, false, true}, q, k, math);
  Tensor attn;
  if (dropout_p > 0.0) attn = Tensor::empty(score_shape, like(q));
  kernels::attention_softmax(probs, attn_mask, probs, attn, a);
  Tensor out = gemm_new(with_last2(lead, L, Dv), GemmShape{batch, L, Dv, S}, attn.defined() ? attn : probs, v, math);
  attn = Tensor();
  if (any_requires_grad({q, k, v, attn_mask})) {
    const bool need_q = q.requires_grad(), need_k = k.requires_grad(), need_v = v.requires_grad();
    const bool need_mask = attn_mask.defined() && attn_mask.requires_grad();
    const bool need_scores = need_q || need_k || need_mask;
    Tensor sq = need_k ? q.detach() : Tensor(), sk = need_q ? k.detach() : Tensor();
    Tensor sv = need_scores ? v.detach() : Tensor();
    const std::size_t saved = probs.nbytes() + (sq.defined() ? q.nbytes() : 0) + (sk.defined() ? k.nbytes() : 0) +
                              (sv.defined() ? v.nbytes() : 0);
    record(
        op, out, {q, k, v, attn_mask},
        [sq, sk, sv, probs, a, math, batch, L, S, D, Dv, need_v, need_mask, need_scores, shape_q = q.shape(),
         shape_k = k.shape(), shape_v = v.shape(),
         shape_mask = attn_mask.defined() ? attn_mask.shape() : Shape{}](const Tensor& g) {
          Tensor dq, dk, dv, dmask;
          if (need_v) {
            Tensor A = probs;
            if (a.p > 0.0) {
              A = Tensor::empty(probs.shape(), like(probs));
              kernels::attention_dropout(probs, A, a);
            }
            dv = gemm_new(shape_v, GemmShape{batch, S, Dv, L, true, false}, A, g, math);
          }
          if (need_scores) {
            Tensor dattn = gemm_new(probs.shape(), GemmShape{batch, L, S, Dv, false, true}, g, sv, math);
            Tensor dz = need_mask ? Tensor::empty(probs.shape(), like(probs)) : Tensor();
            // dS (scaled) in place of dA: a row is read before it is written.
            kernels::attention_softmax_backward(probs, dattn, dattn, dz, a);
            if (sk.defined()) dq = gemm_new(shape_q, GemmShape{batch, L, D, S}, dattn, sk, math);
            if (sq.defined()) dk = gemm_new(shape_k, GemmShape{batch, S, D, L, true, false}, dattn, sq, math);
            if (need_mask) dmask = dz.shape() == shape_mask ? dz : sum_to_shape(dz, shape_mask);
          }
          return std::vector<Tensor>{dq, dk, dv, dmask};
        },
        saved);
  }
  return out;
}

namespace {

// packed_attention's checks; the shape of its fused kernels' launch.
kernels::PackedAttention packed_args(const char* op, const Tensor& qkv, std::int64_t heads,
                                     std::optional<double> scale, bool causal) {
  check::floating(qkv, op, "qkv");
  QGRAD_CHECK(qkv.dim() >= 2 && qkv.dim() <= 8, op, "qkv", "expected rank 2 to 8 ([..., L, 3 * D]), got shape ",
              shape_str(qkv.shape()));
  const std::int64_t L = qkv.size(-2), packed = qkv.size(-1);
  QGRAD_CHECK(packed > 0 && packed % 3 == 0, op, "qkv", "last dim ", packed,
              " is not 3 * D (q, k and v side by side) for a D > 0");
  const std::int64_t D = packed / 3;
  QGRAD_CHECK(heads > 0, op, "heads", "must be > 0, got ", heads);
  QGRAD_CHECK(D % heads == 0, op, "heads", "width ", D, " is not divisible by heads ", heads);
  const std::int64_t Dh = D / heads;
  const double sc = scale.has_value() ? *scale : 1.0 / std::sqrt(static_cast<double>(Dh));
  QGRAD_CHECK(std::isfinite(sc), op, "scale", "must be finite, got ", sc);
  const Shape lead(qkv.shape().begin(), qkv.shape().end() - 2);
  return kernels::PackedAttention{
      .batch = shape_numel(lead, op), .L = L, .heads = heads, .head_dim = Dh, .scale = sc, .causal = causal};
}

Shape packed_out_shape(const Tensor& qkv) {
  Shape s(qkv.shape().begin(), qkv.shape().end() - 1);
  s.push_back(qkv.size(-1) / 3);
  return s;
}

// The fused kernel's forward into out, with the row statistics its backward needs.
void packed_forward(const Tensor& qkv, const kernels::PackedAttention& a, Tensor& out, Tensor& row_max,
                    Tensor& row_sum) {
  const DType math = qkv.dtype() == DType::f64 ? DType::f64 : DType::f32;
  const TensorOptions stat_options = TensorOptions{}.with_dtype(math).with_device(qkv.device());
  out = Tensor::empty(packed_out_shape(qkv), like(qkv));
  row_max = Tensor::empty({a.batch, a.heads, a.L}, stat_options);
  row_sum = Tensor::empty({a.batch, a.heads, a.L}, stat_options);
  kernels::packed_attention_forward(qkv, out, row_max, row_sum, a);
}

// The fused kernel's backward as the rule of `out` (with a fake quant's mask
// on dO where mask is defined).
void record_packed(const char* op, Tensor& out, const Tensor& qkv, const kernels::PackedAttention& a,
                   const Tensor& row_max, const Tensor& row_sum, const Tensor& mask) {
  Tensor saved_qkv = qkv.detach();
  record(
      op, out, {qkv},
      [saved_qkv, row_max, row_sum, a, mask](const Tensor& g) {
        Tensor dqkv = Tensor::empty(saved_qkv.shape(), like(saved_qkv));
        kernels::packed_attention_backward(saved_qkv, g, row_max, row_sum, dqkv, a,
                                           mask.defined() ? mask_words(mask) : nullptr);
        return std::vector<Tensor>{dqkv};
      },
      row_max.nbytes() + row_sum.nbytes() + (mask.defined() ? mask.nbytes() : 0));
}

}  // namespace

// Backward (the rule of scaled_dot_product_attention per head, kernels/
// attention.h): the probabilities recomputed from the saved row max and sum;
// dV = Pᵀ dO, dP = dO Vᵀ, dZ = P * (dP - rowsum(dP * P)) * scale, dQ = dZ K,
// dK = dZᵀ Q, written into the packed gradient. Saves qkv (the projection's
// output, held anyway) and 2 * batch * heads * L numbers of the math type.
Tensor packed_attention(const Tensor& qkv, std::int64_t heads, bool causal, std::optional<double> scale) {
  constexpr const char* op = "packed_attention";
  const kernels::PackedAttention a = packed_args(op, qkv, heads, scale, causal);
  if (!kernels::packed_attention_fits(a.L, a.head_dim, qkv.dtype())) {
    // [N, L, 3, H, Dh] -> [3, N, H, L, Dh]: q, k, v of every head, then back to [..., L, D].
    Tensor parts = permute(qkv.reshape({a.batch, a.L, 3, heads, a.head_dim}), {2, 0, 3, 1, 4});
    std::vector<Tensor> qkv3 = chunk(parts, 3, 0);
    auto head_view = [&](const Tensor& t) { return t.reshape({a.batch, heads, a.L, a.head_dim}); };
    Tensor o = scaled_dot_product_attention(head_view(qkv3[0]), head_view(qkv3[1]), head_view(qkv3[2]), Tensor(),
                                            causal, a.scale);
    return permute(o, {0, 2, 1, 3}).reshape(packed_out_shape(qkv));
  }
  Tensor out, row_max, row_sum;
  packed_forward(qkv, a, out, row_max, row_sum);
  if (any_requires_grad({qkv})) record_packed(op, out, qkv, a, row_max, row_sum, Tensor());
  return out;
}

// Forward: the fused attention into a temporary, then the per-token fake
// quant's row kernel; backward: the attention's, dO masked by the saved bits.
Tensor packed_attention_fake_quantize_dynamic(const Tensor& qkv, std::int64_t heads, bool causal, QuantMode mode,
                                              std::int64_t qmin, std::int64_t qmax, double eps) {
  constexpr const char* op = "packed_attention_fake_quantize_dynamic";
  const kernels::PackedAttention a = packed_args(op, qkv, heads, std::nullopt, causal);
  check::quant_mode(mode, op);
  const float e = check::affine_range(qmin, qmax, eps, op);
  if (qkv.is_cuda() && qkv.dtype() != DType::f64 && a.batch * a.L > 0 &&
      kernels::packed_attention_fits(a.L, a.head_dim, qkv.dtype())) {
    Tensor attn, row_max, row_sum;
    packed_forward(qkv, a, attn, row_max, row_sum);
    Tensor out = Tensor::empty(attn.shape(), like(attn));
    const bool need = any_requires_grad({qkv});
    Tensor mask = need ? new_mask(attn) : Tensor();
    if (kernels::fake_quantize_dynamic_rows(attn, out, need ? mask_words(mask) : nullptr, a.width(),
                                            static_cast<int>(qmin), static_cast<int>(qmax),
                                            mode == QuantMode::symmetric, e)) {
      if (need) record_packed(op, out, qkv, a, row_max, row_sum, mask);
      return out;
    }
    // A width the row kernel does not take: the composition from the attention already computed.
    if (need) record_packed("packed_attention", attn, qkv, a, row_max, row_sum, Tensor());
    return fake_quantize_dynamic(attn, QuantScope::per_token(), mode, qmin, qmax, eps);
  }
  return fake_quantize_dynamic(packed_attention(qkv, heads, causal), QuantScope::per_token(), mode, qmin, qmax, eps);
}

}  // namespace qgrad
