// The fused attention row kernels on the CPU (one OpenMP index per row, the
// lane order of formulas::lane_sum); CUDA tensors go to the warp-per-row
// kernels of kernels/cuda/attention.cu, which sum in the same order.
#include "qgrad/kernels/attention.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "qgrad/kernels/cpu/parallel.h"
#include "qgrad/kernels/cuda/entries.h"
#include "qgrad/kernels/dispatch.h"
#include "qgrad/kernels/formulas/attention.h"
#include "qgrad/kernels/formulas/transformer.h"

namespace qgrad::kernels {

namespace {

// Rows per OpenMP team worth its cost: a row is S exp's and a few passes.
std::int64_t row_grain(std::int64_t S) { return std::max<std::int64_t>(1, 8192 / std::max<std::int64_t>(S, 1)); }

template <class T, class MaskT>
void softmax_rows(const Tensor& scores, const Tensor& mask, const Tensor& probs, const Tensor& attn,
                  const AttentionRows& a) {
  using M = op_math_t<T>;
  const T* s = static_cast<const T*>(scores.data_ptr());
  const MaskT* mk = mask.defined() ? static_cast<const MaskT*>(mask.data_ptr()) : nullptr;
  T* pp = static_cast<T*>(probs.data_ptr());
  T* pa = attn.defined() ? static_cast<T*>(attn.data_ptr()) : nullptr;
  const M scale_d = M(a.p < 1.0 ? 1.0 / (1.0 - a.p) : 0.0);
  cpu::parallel_for(
      a.rows,
      [&](std::int64_t r) {
        const std::int64_t mrow = mk != nullptr ? a.mask_row(r) : 0;
        auto z = [&](std::int64_t j) { return formulas::attention_logit<T, MaskT>(a, s, mk, mrow, r, j); };
        M mx = -std::numeric_limits<M>::infinity();
        for (std::int64_t j = 0; j < a.S; ++j) mx = formulas::max_nan(mx, z(j));
        const M sum = formulas::lane_sum<M>(a.S, [&](std::int64_t j) { return formulas::exp_m(z(j) - mx); });
        for (std::int64_t j = 0; j < a.S; ++j) {
          const T p = T(formulas::attention_prob(z(j), mx, sum));
          pp[r * a.S + j] = p;
          if (pa != nullptr) pa[r * a.S + j] = T(formulas::attention_drop(a, r * a.S + j, M(p), scale_d));
        }
      },
      row_grain(a.S));
}

template <class T>
void softmax_backward_rows(const Tensor& probs, const Tensor& dattn, const Tensor& dscores, const Tensor& dlogits,
                           const AttentionRows& a) {
  using M = op_math_t<T>;
  const T* p = static_cast<const T*>(probs.data_ptr());
  const T* da = static_cast<const T*>(dattn.data_ptr());
  T* ds = static_cast<T*>(dscores.data_ptr());
  T* dz = dlogits.defined() ? static_cast<T*>(dlogits.data_ptr()) : nullptr;
  const M scale_d = M(a.p < 1.0 ? 1.0 / (1.0 - a.p) : 0.0), scale = M(a.scale);
  cpu::parallel_for(
      a.rows,
      [&](std::int64_t r) {
        const std::int64_t b = r * a.S;
        auto dp = [&](std::int64_t j) { return formulas::attention_drop(a, b + j, M(da[b + j]), scale_d); };
        const M dot = formulas::lane_sum<M>(a.S, [&](std::int64_t j) { return dp(j) * M(p[b + j]); });
        for (std::int64_t j = 0; j < a.S; ++j) {
          const M g = M(p[b + j]) * (dp(j) - dot);
          ds[b + j] = T(g * scale);
          if (dz != nullptr) dz[b + j] = T(g);
        }
      },
      row_grain(a.S));
}

// ---- packed_attention on the CPU: an OpenMP index per (batch, head) pair,
// every sum in the order the f32 / f64 CUDA kernel's tiles keep (kernels/
// cuda/attention.cu): dot products over the head dim, and the products with
// v, dO, k and q over their sequence index, each a chain of fused
// multiply-adds from 0 upward; the rows' exp-sums and dp . p in lane_sum's
// order. P and dS enter their products as formulas::packed_operand (rounded
// to f16 / bf16 as CUDA's tensor cores take them; unchanged in f32, f64). ----
template <class T>
struct PackedHead {
  using M = op_math_t<T>;
  const PackedAttention& a;
  std::int64_t n, h;
  std::vector<M> q, k, v, p;  // [L][head_dim] x 3, [L][L]
  PackedHead(const PackedAttention& a_, std::int64_t pair, const T* qkv)
      : a(a_), n(pair / a_.heads), h(pair % a_.heads) {
    const std::int64_t L = a.L, Dh = a.head_dim, W = a.width();
    q.resize(static_cast<std::size_t>(L * Dh));
    k.resize(q.size());
    v.resize(q.size());
    p.resize(static_cast<std::size_t>(L * L));
    for (std::int64_t i = 0; i < L; ++i)
      for (std::int64_t d = 0; d < Dh; ++d) {
        const T* src = qkv + (n * L + i) * 3 * W + h * Dh + d;
        q[at(i, d)] = M(src[0]);
        k[at(i, d)] = M(src[W]);
        v[at(i, d)] = M(src[2 * W]);
      }
    for (std::int64_t i = 0; i < L; ++i)
      for (std::int64_t j = 0; j < L; ++j) {
        M dot = M(0);
        for (std::int64_t d = 0; d < Dh; ++d) dot = formulas::fused_multiply_add(q[at(i, d)], k[at(j, d)], dot);
        p[sq(i, j)] = formulas::packed_logit(dot, M(a.scale), a.causal, i, j);
      }
  }
  std::size_t at(std::int64_t i, std::int64_t d) const { return static_cast<std::size_t>(i * a.head_dim + d); }
  std::size_t sq(std::int64_t i, std::int64_t j) const { return static_cast<std::size_t>(i * a.L + j); }
  std::int64_t stat(std::int64_t i) const { return (n * a.heads + h) * a.L + i; }
};

template <class T>
void packed_forward_cpu(const Tensor& qkv, const Tensor& out, const Tensor& row_max, const Tensor& row_sum,
                        const PackedAttention& a) {
  using M = op_math_t<T>;
  const T* x = static_cast<const T*>(qkv.data_ptr());
  T* o = static_cast<T*>(out.data_ptr());
  M* mxs = static_cast<M*>(row_max.data_ptr());
  M* sums = static_cast<M*>(row_sum.data_ptr());
  const std::int64_t L = a.L, Dh = a.head_dim, W = a.width();
  cpu::parallel_for(
      a.batch * a.heads,
      [&](std::int64_t pair) {
        PackedHead<T> hd(a, pair, x);
        for (std::int64_t i = 0; i < L; ++i) {
          M mx = -std::numeric_limits<M>::infinity();
          for (std::int64_t j = 0; j < L; ++j) mx = formulas::max_nan(mx, hd.p[hd.sq(i, j)]);
          const M sum = formulas::lane_sum<M>(L, [&](std::int64_t j) { return formulas::exp_m(hd.p[hd.sq(i, j)] - mx); });
          for (std::int64_t j = 0; j < L; ++j) hd.p[hd.sq(i, j)] = formulas::attention_prob(hd.p[hd.sq(i, j)], mx, sum);
          mxs[hd.stat(i)] = mx;
          sums[hd.stat(i)] = sum;
        }
        for (std::int64_t i = 0; i < L; ++i)
          for (std::int64_t d = 0; d < Dh; ++d) {
            M acc = M(0);
            for (std::int64_t j = 0; j < L; ++j)
              acc = formulas::fused_multiply_add(formulas::packed_operand<T>(hd.p[hd.sq(i, j)]), hd.v[hd.at(j, d)],
                                                 acc);
            o[(hd.n * L + i) * W + hd.h * Dh + d] = T(acc);
          }
      },
      1);
}

template <class T>
void packed_backward_cpu(const Tensor& qkv, const Tensor& dout, const Tensor& row_max, const Tensor& row_sum,
                         const Tensor& dqkv, const PackedAttention& a, const std::uint32_t* dout_mask) {
  using M = op_math_t<T>;
  const T* x = static_cast<const T*>(qkv.data_ptr());
  const T* go = static_cast<const T*>(dout.data_ptr());
  const M* mxs = static_cast<const M*>(row_max.data_ptr());
  const M* sums = static_cast<const M*>(row_sum.data_ptr());
  T* dx = static_cast<T*>(dqkv.data_ptr());
  const std::int64_t L = a.L, Dh = a.head_dim, W = a.width();
  cpu::parallel_for(
      a.batch * a.heads,
      [&](std::int64_t pair) {
        PackedHead<T> hd(a, pair, x);
        std::vector<M> g(hd.q.size()), ds(hd.p.size());
        for (std::int64_t i = 0; i < L; ++i) {
          for (std::int64_t d = 0; d < Dh; ++d)
            g[hd.at(i, d)] = formulas::masked_grad(go, dout_mask, (hd.n * L + i) * W + hd.h * Dh + d);
          for (std::int64_t j = 0; j < L; ++j)
            hd.p[hd.sq(i, j)] = formulas::attention_prob(hd.p[hd.sq(i, j)], mxs[hd.stat(i)], sums[hd.stat(i)]);
        }
        T* base = dx + hd.n * L * 3 * W + hd.h * Dh;  // row 0 of this pair's q part
        for (std::int64_t j = 0; j < L; ++j)
          for (std::int64_t d = 0; d < Dh; ++d) {
            M acc = M(0);
            for (std::int64_t i = 0; i < L; ++i)
              acc = formulas::fused_multiply_add(formulas::packed_operand<T>(hd.p[hd.sq(i, j)]), g[hd.at(i, d)], acc);
            base[j * 3 * W + 2 * W + d] = T(acc);
          }
        for (std::int64_t i = 0; i < L; ++i)
          for (std::int64_t j = 0; j < L; ++j) {
            M acc = M(0);
            for (std::int64_t d = 0; d < Dh; ++d) acc = formulas::fused_multiply_add(g[hd.at(i, d)], hd.v[hd.at(j, d)], acc);
            ds[hd.sq(i, j)] = acc;
          }
        for (std::int64_t i = 0; i < L; ++i) {
          const M dot = formulas::lane_sum<M>(L, [&](std::int64_t j) { return ds[hd.sq(i, j)] * hd.p[hd.sq(i, j)]; });
          for (std::int64_t j = 0; j < L; ++j)
            ds[hd.sq(i, j)] = formulas::packed_logit_grad(hd.p[hd.sq(i, j)], ds[hd.sq(i, j)], dot, M(a.scale));
        }
        for (std::int64_t i = 0; i < L; ++i)
          for (std::int64_t d = 0; d < Dh; ++d) {
            M acc = M(0);
            for (std::int64_t j = 0; j < L; ++j)
              acc = formulas::fused_multiply_add(formulas::packed_operand<T>(ds[hd.sq(i, j)]), hd.k[hd.at(j, d)], acc);
            base[i * 3 * W + d] = T(acc);
          }
        for (std::int64_t j = 0; j < L; ++j)
          for (std::int64_t d = 0; d < Dh; ++d) {
            M acc = M(0);
            for (std::int64_t i = 0; i < L; ++i)
              acc = formulas::fused_multiply_add(formulas::packed_operand<T>(ds[hd.sq(i, j)]), hd.q[hd.at(i, d)], acc);
            base[j * 3 * W + W + d] = T(acc);
          }
      },
      1);
}

}  // namespace

bool packed_attention_fits(std::int64_t L, std::int64_t head_dim, DType dtype) {
  const std::size_t math_bytes = dtype == DType::f64 ? sizeof(double) : sizeof(float);
  return L >= 1 && L <= kPackedAttentionMaxLength && head_dim >= 1 && head_dim <= kPackedAttentionMaxLength &&
         packed_attention_backward_smem(L, head_dim, math_bytes) <= kPackedAttentionMaxSmem;
}

void packed_attention_forward(const Tensor& qkv, const Tensor& out, const Tensor& row_max, const Tensor& row_sum,
                              const PackedAttention& a) {
  if (a.batch == 0 || a.heads == 0) return;
  if (qkv.is_cuda()) {
    QGRAD_ON_CUDA(cuda::packed_attention_forward(qkv, out, row_max, row_sum, a));
    return;
  }
  dispatch_floating(qkv.dtype(), "packed_attention", [&](auto tag) {
    packed_forward_cpu<typename decltype(tag)::type>(qkv, out, row_max, row_sum, a);
  });
}

void packed_attention_backward(const Tensor& qkv, const Tensor& dout, const Tensor& row_max, const Tensor& row_sum,
                               const Tensor& dqkv, const PackedAttention& a, const std::uint32_t* dout_mask) {
  if (a.batch == 0 || a.heads == 0) return;
  if (qkv.is_cuda()) {
    QGRAD_ON_CUDA(cuda::packed_attention_backward(qkv, dout, row_max, row_sum, dqkv, a, dout_mask));
    return;
  }
  dispatch_floating(qkv.dtype(), "packed_attention", [&](auto tag) {
    packed_backward_cpu<typename decltype(tag)::type>(qkv, dout, row_max, row_sum, dqkv, a, dout_mask);
  });
}

void attention_softmax(const Tensor& scores, const Tensor& mask, const Tensor& probs, const Tensor& attn,
                       const AttentionRows& a) {
  if (a.rows == 0 || a.S == 0) return;
  if (probs.is_cuda()) {
    QGRAD_ON_CUDA(cuda::attention_softmax_warp_rows(scores, mask, probs, attn, a));
    return;
  }
  dispatch_floating(probs.dtype(), "scaled_dot_product_attention", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (a.mask == AttentionMaskKind::boolean) softmax_rows<T, bool>(scores, mask, probs, attn, a);
    else softmax_rows<T, T>(scores, mask, probs, attn, a);
  });
}

void attention_dropout(const Tensor& probs, const Tensor& attn, const AttentionRows& a) {
  if (probs.numel() == 0) return;
  if (probs.is_cuda()) {
    QGRAD_ON_CUDA(cuda::attention_dropout(probs, attn, a));
    return;
  }
  dispatch_floating(probs.dtype(), "scaled_dot_product_attention", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using M = op_math_t<T>;
    const T* p = static_cast<const T*>(probs.data_ptr());
    T* o = static_cast<T*>(attn.data_ptr());
    const M scale_d = M(a.p < 1.0 ? 1.0 / (1.0 - a.p) : 0.0);
    cpu::parallel_for(probs.numel(), [&](std::int64_t i) { o[i] = T(formulas::attention_drop(a, i, M(p[i]), scale_d)); });
  });
}

void attention_softmax_backward(const Tensor& probs, const Tensor& dattn, const Tensor& dscores,
                                const Tensor& dlogits, const AttentionRows& a) {
  if (a.rows == 0 || a.S == 0) return;
  if (probs.is_cuda()) {
    QGRAD_ON_CUDA(cuda::attention_softmax_backward_warp_rows(probs, dattn, dscores, dlogits, a));
    return;
  }
  dispatch_floating(probs.dtype(), "scaled_dot_product_attention",
                    [&](auto tag) { softmax_backward_rows<typename decltype(tag)::type>(probs, dattn, dscores, dlogits, a); });
}

}  // namespace qgrad::kernels
