#include "qgrad/kernels/optim.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <type_traits>
#include <utility>

#include "qgrad/kernels/cuda/entries.h"
#include "qgrad/kernels/loop.h"

namespace qgrad::kernels {

template <class M>
formulas::OptimScalars<M> optim_scalars(const OptimizerHyper& h) {
  formulas::OptimScalars<M> s;
  s.kind = h.kind;
  s.neg_lr = static_cast<M>(-h.lr);
  s.momentum = static_cast<M>(h.momentum);
  s.one_minus_dampening = static_cast<M>(1.0 - h.dampening);
  s.weight_decay = static_cast<M>(h.weight_decay);
  s.use_weight_decay = h.weight_decay != 0.0;
  s.use_momentum = h.momentum != 0.0;
  s.nesterov = h.nesterov;
  s.decay = static_cast<M>(1.0 - h.lr * h.weight_decay);
  s.lerp_weight = static_cast<M>(1.0 - h.beta1);
  s.beta2 = static_cast<M>(h.beta2);
  s.one_minus_beta2 = static_cast<M>(1.0 - h.beta2);
  s.eps = static_cast<M>(h.eps);
  return s;
}

// PyTorch computes the bias corrections with Python floats (double).
template <class M>
formulas::OptimTensorScalars<M> optim_tensor_scalars(const OptimizerHyper& h, const OptimizerSlot& slot) {
  formulas::OptimTensorScalars<M> t;
  t.first = slot.first;
  if (h.kind == OptimizerKind::adamw) {
    const double step = static_cast<double>(slot.step);
    const double bc1 = 1.0 - std::pow(h.beta1, step);
    const double bc2 = 1.0 - std::pow(h.beta2, step);
    t.neg_step_size = static_cast<M>(-(h.lr / bc1));
    t.bc2_sqrt = static_cast<M>(std::sqrt(bc2));
  }
  return t;
}

template formulas::OptimScalars<float> optim_scalars<float>(const OptimizerHyper&);
template formulas::OptimScalars<double> optim_scalars<double>(const OptimizerHyper&);
template formulas::OptimTensorScalars<float> optim_tensor_scalars<float>(const OptimizerHyper&, const OptimizerSlot&);
template formulas::OptimTensorScalars<double> optim_tensor_scalars<double>(const OptimizerHyper&, const OptimizerSlot&);

namespace {

template <class T>
struct OptimUpdate {
  OptimElems<T> e;
  formulas::OptimScalars<op_math_t<T>> s;
  bool scaled;
  op_math_t<T> scale;
  QGRAD_HD void operator()(std::int64_t i) const { e.update(i, s, scaled, scale); }
};

template <class T>
struct ScaleElems {
  T* p;
  op_math_t<T> scale;
  QGRAD_HD void operator()(std::int64_t i) const { p[i] = T(op_math_t<T>(p[i]) * scale); }
};

// The CPU's f32 SGD step over one parameter with the variant's switches as
// template arguments: formulas::sgd_update on local copies of the scalars
// whose switches are constants, over __restrict pointers, so the compiler
// drops the branches and vectorises the loop (the per-element functor above
// reloads every scalar and tests every switch each element). The same
// operations in the same order: the same bits.
template <bool kMomentum, bool kFirst, bool kNesterov, bool kWeightDecay, bool kScaled>
void sgd_f32(const OptimElems<float>& e, const formulas::OptimScalars<float>& s0, float scale, std::int64_t n) {
  formulas::OptimScalars<float> s = s0;
  s.use_momentum = kMomentum;
  s.nesterov = kNesterov;
  s.use_weight_decay = kWeightDecay;
  formulas::OptimTensorScalars<float> ts = e.ts;
  ts.first = kFirst;
  float* __restrict p = e.p;
  const float* __restrict g = e.g;
  float* __restrict buf = e.b1;
  constexpr std::int64_t kChunk = 4096;
  cpu::parallel_for(
      (n + kChunk - 1) / kChunk,
      [&](std::int64_t c) {
        const std::int64_t end = std::min(n, (c + 1) * kChunk);
        for (std::int64_t i = c * kChunk; i < end; ++i) {
          float pv = p[i], bv = kMomentum && !kFirst ? buf[i] : 0.0f;
          const float gv = kScaled ? g[i] * scale : g[i];
          formulas::sgd_update<float>(pv, gv, bv, s, ts);
          if constexpr (kMomentum) buf[i] = bv;
          p[i] = pv;
        }
      },
      cpu::kParallelGrain / kChunk);
}

// sgd_f32 of every combination of the five switches, indexed by their bits.
using SgdF32 = void (*)(const OptimElems<float>&, const formulas::OptimScalars<float>&, float, std::int64_t);
template <std::size_t... K>
constexpr std::array<SgdF32, sizeof...(K)> sgd_f32_table(std::index_sequence<K...>) {
  return {&sgd_f32<(K & 16) != 0, (K & 8) != 0, (K & 4) != 0, (K & 2) != 0, (K & 1) != 0>...};
}

// sgd_f32 for the slot's switches; false where a buffer exists without
// momentum or the reverse (the functor's general case takes those).
bool sgd_f32_fast(const OptimElems<float>& e, const formulas::OptimScalars<float>& s, bool scaled, float scale,
                  std::int64_t n) {
  if (s.kind != OptimizerKind::sgd || (e.b1 != nullptr) != s.use_momentum) return false;
  const unsigned key = (s.use_momentum ? 16u : 0u) | (e.ts.first ? 8u : 0u) | (s.nesterov ? 4u : 0u) |
                       (s.use_weight_decay ? 2u : 0u) | (scaled ? 1u : 0u);
  static constexpr auto kTable = sgd_f32_table(std::make_index_sequence<32>{});
  kTable[key](e, s, scale, n);
  return true;
}

// One chunk of formulas::NormKind's step 1, as the CUDA block runs it.
template <class T, class M>
M norm_chunk(formulas::NormKind k, const T* x, std::int64_t len) {
  using namespace formulas;
  M lanes[kNormLanes];
  for (M& l : lanes) l = M(0);
  for (std::int64_t base = 0; base < len; base += kNormLanes) {
    const std::int64_t m = std::min<std::int64_t>(kNormLanes, len - base);
    for (std::int64_t t = 0; t < m; ++t) lanes[t] = norm_fold(k, lanes[t], M(x[base + t]));
  }
  M groups[kNormGroup];
  for (M& g : groups) g = M(0);
  for (int w = 0; w < kNormLanes / kNormGroup; ++w) groups[w] = norm_tree(k, lanes + w * kNormGroup, kNormGroup);
  return norm_tree(k, groups, kNormLanes / kNormGroup);
}

}  // namespace

void optim_step(const OptimizerHyper& hyper, const std::vector<OptimizerSlot>& slots, const Tensor& grad_scale,
                const Tensor& skip) {
  if (slots.empty()) return;
  const Device dev = slots.front().param.device();
  if (dev.is_cuda()) {
    QGRAD_ON_CUDA(cuda::optim_step(hyper, slots, grad_scale, skip));
    return;
  }
  if (skip.defined() && *static_cast<const std::int32_t*>(skip.data_ptr()) != 0) return;
  dispatch_floating(slots.front().param.dtype(), "optim_step", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using M = op_math_t<T>;
    const formulas::OptimScalars<M> s = optim_scalars<M>(hyper);
    const bool scaled = grad_scale.defined();
    const M scale = scaled ? M(*static_cast<const T*>(grad_scale.data_ptr())) : M(1);
    for (const OptimizerSlot& slot : slots) {
      if constexpr (std::is_same_v<T, float>) {
        if (sgd_f32_fast(optim_elems<T>(hyper, slot), s, scaled, scale, slot.param.numel())) continue;
      }
      for_each_index(dev, slot.param.numel(), OptimUpdate<T>{optim_elems<T>(hyper, slot), s, scaled, scale},
                     "optim_step");
    }
  });
}

void grad_norm(const std::vector<Tensor>& tensors, formulas::NormKind kind, double max_norm, const Tensor& total,
               const Tensor& coef, const Tensor& nonfinite) {
  if (total.is_cuda()) {
    QGRAD_ON_CUDA(cuda::grad_norm(tensors, kind, max_norm, total, coef, nonfinite));
    return;
  }
  dispatch_floating(total.dtype(), "grad_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using M = op_math_t<T>;
    using formulas::kNormChunk;
    // Every chunk of every tensor, reduced in parallel (each alone).
    std::vector<std::int64_t> first(tensors.size() + 1, 0);
    for (std::size_t i = 0; i < tensors.size(); ++i)
      first[i + 1] = first[i] + (tensors[i].numel() + kNormChunk - 1) / kNormChunk;
    std::vector<M> partial(static_cast<std::size_t>(first.back()));
    std::vector<std::size_t> owner(partial.size());
    for (std::size_t i = 0; i < tensors.size(); ++i)
      for (std::int64_t c = first[i]; c < first[i + 1]; ++c) owner[static_cast<std::size_t>(c)] = i;
    cpu::parallel_for(
        first.back(),
        [&](std::int64_t c) {
          const std::size_t i = owner[static_cast<std::size_t>(c)];
          const std::int64_t begin = (c - first[i]) * kNormChunk;
          const std::int64_t len = std::min(kNormChunk, tensors[i].numel() - begin);
          partial[static_cast<std::size_t>(c)] =
              norm_chunk<T, M>(kind, static_cast<const T*>(tensors[i].data_ptr()) + begin, len);
        },
        1);
    // Each tensor's partials over 32 lanes, then the total.
    std::vector<M> acc(tensors.size());
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      M lanes[formulas::kNormGroup];
      for (M& l : lanes) l = M(0);
      for (std::int64_t c = first[i]; c < first[i + 1]; ++c) {
        M& l = lanes[(c - first[i]) % formulas::kNormGroup];
        l = formulas::norm_combine(kind, l, partial[static_cast<std::size_t>(c)]);
      }
      acc[i] = formulas::norm_tree(kind, lanes, formulas::kNormGroup);
    }
    formulas::norm_result<T, M>(kind, acc.data(), static_cast<std::int64_t>(acc.size()), static_cast<M>(max_norm),
                                static_cast<T*>(total.data_ptr()), static_cast<T*>(coef.data_ptr()),
                                nonfinite.defined() ? static_cast<std::int32_t*>(nonfinite.data_ptr()) : nullptr);
  });
}

void grad_scale(const std::vector<Tensor>& tensors, const Tensor& scale) {
  if (tensors.empty()) return;
  if (scale.is_cuda()) {
    QGRAD_ON_CUDA(cuda::grad_scale(tensors, scale));
    return;
  }
  dispatch_floating(scale.dtype(), "grad_scale", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const op_math_t<T> s = op_math_t<T>(*static_cast<const T*>(scale.data_ptr()));
    for (const Tensor& t : tensors)
      for_each_index(Device::cpu(), t.numel(), ScaleElems<T>{static_cast<T*>(t.data_ptr()), s}, "grad_scale");
  });
}

}  // namespace qgrad::kernels
