// log_softmax and the fused softmax + cross-entropy loss.
#pragma once

#include <cstdint>

#include "qgrad/core/tensor.h"

namespace qgrad {

// x - logsumexp(x) along `axis` (max-subtracted, numerically stable).
Tensor log_softmax(const Tensor& x, std::int64_t axis = -1);
// mean over b of -log_softmax(logits)[b, labels[b]]; logits [B, C] floating,
// labels [B] s64 or s32. A scalar of logits' dtype. Labels outside [0, C)
// throw on the CPU; on CUDA (where checking would need a host sync) they give
// a NaN loss and NaN gradient rows, and nothing is read out of bounds.
Tensor cross_entropy(const Tensor& logits, const Tensor& labels);
// mean over b of -logp[b, labels[b]] for log-probabilities logp [B, C]
// (nll_loss(log_softmax(x), y) == cross_entropy(x, y)). Same label rules.
Tensor nll_loss(const Tensor& logp, const Tensor& labels);

}  // namespace qgrad
