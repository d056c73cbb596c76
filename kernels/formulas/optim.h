// Scalar update formulas of the fused optimizers (SGD, AdamW), shared by
// the CPU and CUDA kernels so both devices update bit for bit alike.
//
// The order of operations is PyTorch's single-tensor implementation
// (torch/optim/sgd.py `_single_tensor_sgd`, torch/optim/adamw.py
// `_single_tensor_adam` with decoupled weight decay); each PyTorch op
// rounds to the op-math type M (float for f32/f16/bf16, double for f64), so
// every intermediate here is an M. `a + alpha*b` is evaluated unfused
// (qgrad builds without FMA contraction; PyTorch's vectorized CPU add may
// fuse it, a difference of at most one rounding).
#pragma once

#include <cmath>
#include <cstdint>

#include "qgrad/core/macros.h"
#include "qgrad/core/optimizer_args.h"

namespace qgrad::formulas {


// Step-wide scalars, already converted to M on the host (PyTorch converts a
// Python float to the op-math type the same way).
template <class M>
struct OptimScalars {
  OptimizerKind kind = OptimizerKind::sgd;
  // SGD
  M neg_lr = M(0);         // -lr
  M momentum = M(0);
  M one_minus_dampening = M(1);
  M weight_decay = M(0);
  bool use_weight_decay = false;
  bool use_momentum = false;
  bool nesterov = false;
  // AdamW
  M decay = M(1);          // 1 - lr * weight_decay (computed in double on the host, then rounded)
  M lerp_weight = M(0);    // 1 - beta1
  M beta2 = M(0);
  M one_minus_beta2 = M(0);
  M eps = M(0);
};

// Per-parameter scalars (AdamW's bias corrections depend on the parameter's
// own step count; SGD's first step initialises the momentum buffer).
template <class M>
struct OptimTensorScalars {
  M neg_step_size = M(0);  // -lr / (1 - beta1^step)
  M bc2_sqrt = M(1);       // sqrt(1 - beta2^step)
  bool first = false;      // SGD: momentum buffer not yet initialised (buf = d_p)
};

// Correctly rounded square roots on host and device.
QGRAD_HD float optim_sqrt(float x) { return sqrtf(x); }
QGRAD_HD double optim_sqrt(double x) { return sqrt(x); }

// torch.lerp's formula (aten/src/ATen/native/Lerp.h).
template <class M>
QGRAD_HD M lerp(M a, M b, M w) {
  const M aw = w < M(0) ? -w : w;
  return aw < M(0.5) ? a + w * (b - a) : b - (b - a) * (M(1) - w);
}

// SGD:  d_p = g + wd*p;  buf = first ? d_p : buf*momentum + (1-dampening)*d_p;
//       d_p = nesterov ? d_p + momentum*buf : buf;  p = p + (-lr)*d_p.
template <class M>
QGRAD_HD void sgd_update(M& p, M g, M& buf, const OptimScalars<M>& s, const OptimTensorScalars<M>& t) {
  M d = g;
  if (s.use_weight_decay) d = d + s.weight_decay * p;
  if (s.use_momentum) {
    if (t.first) {
      buf = d;
    } else {
      buf = buf * s.momentum;
      buf = buf + s.one_minus_dampening * d;
    }
    d = s.nesterov ? d + s.momentum * buf : buf;
  }
  p = p + s.neg_lr * d;
}

// AdamW:  p = p * (1 - lr*wd);  m = lerp(m, g, 1-beta1);  v = v*beta2 + ((1-beta2)*g)*g;
//         denom = sqrt(v) / sqrt(bc2) + eps;  p = p + ((-step_size)*m) / denom.
template <class M>
QGRAD_HD void adamw_update(M& p, M g, M& m, M& v, const OptimScalars<M>& s, const OptimTensorScalars<M>& t) {
  p = p * s.decay;
  m = lerp(m, g, s.lerp_weight);
  v = v * s.beta2;
  v = v + (s.one_minus_beta2 * g) * g;
  const M denom = optim_sqrt(v) / t.bc2_sqrt + s.eps;
  p = p + (t.neg_step_size * m) / denom;
}

// ---- the global gradient norm of clip_grad_norm (ops/optim.h grad_norm) ----
//
// One summation order, fixed by these constants and run alike by the CPU
// loop (kernels/optim.cpp) and the CUDA kernels (kernels/cuda/optim.cu), so
// both give the same bits:
//  1. every tensor is cut into chunks of kNormChunk elements; a chunk has
//     kNormLanes lanes, lane t folds elements t, t + kNormLanes, ... in
//     increasing order (norm_fold), and the lanes meet in norm_tree: a
//     halving tree inside each group of 32 lanes (lane l takes lane l + s,
//     s = 16, 8, 4, 2, 1: CUDA's shuffle-down), then the same over the 8
//     group results (s = 4, 2, 1) -> one partial per chunk;
//  2. a tensor's partials meet the same way over 32 lanes (lane l folds
//     partials l, l + 32, ..., then the halving tree of one group) -> its
//     accumulated value, finished (sqrt for the 2-norm) and rounded to the
//     tensor dtype T: the per-tensor norm (PyTorch's torch._foreach_norm);
//  3. the per-tensor norms, in the order given, fold from the identity
//     (norm_fold of each norm: squared again for the 2-norm) and finish ->
//     the total norm, rounded to T (PyTorch's vector_norm of the stacked norms).
enum class NormKind : unsigned char { l1, l2, linf };

inline constexpr int kNormLanes = 256;
inline constexpr int kNormGroup = 32;
inline constexpr std::int64_t kNormChunk = kNormLanes * 16;

// NaN wins the max (PyTorch's inf-norm of a NaN is NaN).
template <class M>
QGRAD_HD M norm_combine(NormKind k, M a, M b) {
  if (k != NormKind::linf) return a + b;
  return (a != a || b != b) ? a + b : (a < b ? b : a);
}
// Folds one value: |x| (1-norm, inf-norm) or x*x (2-norm).
template <class M>
QGRAD_HD M norm_fold(NormKind k, M acc, M x) {
  const M v = k == NormKind::l2 ? x * x : (x < M(0) ? -x : x);
  return norm_combine(k, acc, v);
}
template <class M>
QGRAD_HD M norm_finish(NormKind k, M acc) {
  return k == NormKind::l2 ? optim_sqrt(acc) : acc;
}
// The halving tree over `n` (a power of two, <= 32) values in a[0..n):
// a[0] = the result. The CPU's copy of CUDA's shuffle-down reduction.
template <class M>
QGRAD_HD M norm_tree(NormKind k, M* a, int n) {
  for (int s = n / 2; s >= 1; s /= 2)
    for (int l = 0; l < s; ++l) a[l] = norm_combine(k, a[l], a[l + s]);
  return a[0];
}

// clip_grad_norm's coefficient from the total norm, in PyTorch's op order:
// clip_coef = (total + 1e-6).reciprocal() * max_norm (Python's
// `max_norm / tensor`), then clamp(max = 1) (NaN stays NaN); every op
// rounds to T, the Python scalars enter as M (ATen's op-math scalar). A
// max_norm of 0 gives 0 (the gradients are zeroed).
template <class T, class M>
QGRAD_HD T clip_coefficient(T total, M max_norm) {
  const T shifted = T(M(total) + M(1e-6));
  const T recip = T(M(1) / M(shifted));
  const T coef = T(M(recip) * max_norm);
  const M c = M(coef);
  return c != c ? coef : (c > M(1) ? T(M(1)) : coef);
}

// Step 3 of the order above and the coefficient: acc[i] is tensor i's
// accumulated value (step 2, not yet finished). Writes the total norm, the
// clip coefficient, and, when `nonfinite` is given and the total is NaN or
// infinite, sets *nonfinite = 1 (never clears it).
template <class T, class M>
QGRAD_HD void norm_result(NormKind k, const M* acc, std::int64_t n, M max_norm, T* total, T* coef,
                          std::int32_t* nonfinite) {
  M sum = M(0);
  for (std::int64_t i = 0; i < n; ++i) sum = norm_fold(k, sum, M(T(norm_finish(k, acc[i]))));
  const T t = T(norm_finish(k, sum));
  *total = t;
  *coef = clip_coefficient<T, M>(t, max_norm);
  const M tm = M(t);
  if (nonfinite && (tm != tm || tm - tm != M(0))) *nonfinite = 1;
}

}  // namespace qgrad::formulas
