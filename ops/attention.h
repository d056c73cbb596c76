// Scaled dot-product attention (PyTorch 2.11's F.scaled_dot_product_attention
// with the math backend; docs/ops.md "scaled_dot_product_attention").
#pragma once

#include <optional>

#include "qgrad/core/tensor.h"
#include "qgrad/ops/dynamic_quant.h"  // QuantMode

namespace qgrad {

// softmax(q · kᵀ * scale + mask) · v for q [..., L, D], k [..., S, D],
// v [..., S, Dv] of one floating dtype and device, with equal leading
// (batch) dims (at most 6 of them; not broadcast). scale defaults to
// 1 / sqrt(D). attn_mask: undefined, boolean (true: take part) or of q's
// dtype (added to the scores; differentiable), of a shape that broadcasts to
// [..., L, S]. causal: query i sees keys j <= i (top-left aligned, as
// PyTorch's is_causal); with a mask too, both apply. A row with every key
// masked gives zeros (PyTorch's _safe_softmax). dropout_p in [0, 1]: the
// probabilities are dropped with the dropout op's counter-based mask
// (element i of the [..., L, S] probabilities keeps iff
// random_uniform(seed, offset + i) >= p), the generator advancing by their
// count; dropout_p == 0 draws nothing. Saves the probabilities for the
// backward: batch * L * S elements of q's dtype.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& attn_mask = Tensor(), bool causal = false,
                                    std::optional<double> scale = std::nullopt, double dropout_p = 0.0,
                                    Generator& generator = default_generator());

// Self-attention over one packed projection, the shape of nn::MultiheadAttention
// without a mask or dropout: qkv [..., L, 3 * D] holds q, k and v one after
// the other along its last dim, each split into `heads` heads of D / heads
// (PyTorch's in_proj layout); the result [..., L, D] is every head's
// softmax(q kᵀ * scale) v side by side (scale defaults to 1 / sqrt(D / heads);
// causal: query i sees keys j <= i). Where L and the head dim are at most 64
// and the backward's working set fits 96 KiB (kernels/attention.h), one fused
// kernel a (batch, head) pair does it without splitting the heads out or
// merging them back, saving two numbers a query row (its logits' max and
// exp-sum) for a backward that writes the packed gradient directly; past that
// reach it is the composition permute -> scaled_dot_product_attention ->
// permute (the same function, another rounding). docs/ops.md "packed_attention".
Tensor packed_attention(const Tensor& qkv, std::int64_t heads, bool causal = false,
                        std::optional<double> scale = std::nullopt);

// fake_quantize_dynamic(packed_attention(qkv, heads, causal), per_token(),
// mode, qmin, qmax, eps) as one op, the same values bit for bit on each
// device: the input of a QAT linear after the attention (an 8da QAT
// out_proj). Where packed_attention runs its fused kernel on CUDA and
// fake_quantize_dynamic its row kernel (a width D of 128, 256, 384, 512, 768
// or 1024; f32, bf16, f16): those two kernels forward, and one backward, the
// attention's, reading dO masked by the fake quant's bits (no pass writing
// the masked gradient); saves packed_attention's state and the bit mask.
// Elsewhere the two ops. Errors: packed_attention's and
// fake_quantize_dynamic's, naming this op.
Tensor packed_attention_fake_quantize_dynamic(const Tensor& qkv, std::int64_t heads, bool causal, QuantMode mode,
                                              std::int64_t qmin, std::int64_t qmax, double eps);

}  // namespace qgrad
