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

}  // namespace qgrad::formulas
