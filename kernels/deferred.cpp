// The deferred gradient passes (kernels/deferred.h): queued by backward
// rules, run by flush(). CUDA batches in kernels/cuda/deferred.cu.
#include "qgrad/kernels/deferred.h"

#include <algorithm>
#include <atomic>
#include <utility>

#include "qgrad/kernels/basic.h"
#include "qgrad/kernels/bitmask.h"
#include "qgrad/kernels/cuda/entries.h"
#include "qgrad/kernels/dispatch.h"
#include "qgrad/kernels/formulas/transformer.h"
#include "qgrad/kernels/loop.h"
#include "qgrad/kernels/quantize.h"

namespace qgrad::kernels {

namespace {

const std::uint32_t* words(const Tensor& mask) { return static_cast<const std::uint32_t*>(mask.data_ptr()); }

DType op_math_dtype(DType t) {
  return dispatch_floating(t, "column_sums_finish", [](auto tag) {
    return dtype_of<op_math_t<typename decltype(tag)::type>>;
  });
}

// dx = cast(dy) * bit for a dy of a narrower dtype S (formulas::masked_grad_cast).
template <class T, class S>
struct MaskedCast {
  const S* dy;
  const std::uint32_t* mask;
  T* dx;
  QGRAD_HD void operator()(std::int64_t i) const { dx[i] = T(formulas::masked_grad_cast<T>(dy, mask, i)); }
};

void masked_gradient_now(const Tensor& dy, const Tensor& mask, const Tensor& dx) {
  if (dy.dtype() == dx.dtype()) {
    fake_quantize_backward(dy, dx, words(mask));
    return;
  }
  dispatch_floating(dx.dtype(), "masked_gradient", [&](auto out_tag) {
    using T = typename decltype(out_tag)::type;
    dispatch_floating(dy.dtype(), "masked_gradient", [&](auto in_tag) {
      using S = typename decltype(in_tag)::type;
      for_each_index(dx.device(), dx.numel(),
                     MaskedCast<T, S>{static_cast<const S*>(dy.data_ptr()), words(mask), static_cast<T*>(dx.data_ptr())},
                     "masked_gradient");
    });
  });
}

// One pass where it would have run (the CPU; a CUDA pass that has no batch).
void run_now(const DeferredPass& p) {
  if (p.kind == DeferredPass::Kind::cast) {
    kernels::cast(p.in, p.out);
    return;
  }
  if (p.kind == DeferredPass::Kind::masked_gradient) {
    masked_gradient_now(p.in, p.mask, p.out);
    return;
  }
  dispatch_floating(p.out.dtype(), "column_sums_finish", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using M = op_math_t<T>;
    const std::int64_t cols = p.out.numel();
    for_each_column_sum(p.out.device(), cols,
                        ChunkSumsFinish<T>{static_cast<const M*>(p.in.data_ptr()), static_cast<T*>(p.out.data_ptr()),
                                           p.in.numel() / cols, cols},
                        "column_sums_finish");
  });
}

}  // namespace

DeferredPasses::~DeferredPasses() {
  try {
    flush();
  } catch (...) {  // NOLINT(bugprone-empty-catch): unwinding already; the first error is the one to report
  }
}

void DeferredPasses::column_sums_finish(const Tensor& partial, const Tensor& out) {
  QGRAD_CHECK(out.numel() > 0 && partial.numel() % out.numel() == 0 && partial.device() == out.device() &&
                  partial.dtype() == op_math_dtype(out.dtype()),
              "column_sums_finish", "partial", "expected [chunks, ", out.numel(), "] in ",
              dtype_name(op_math_dtype(out.dtype())), " on ", out.device().str(), ", got ", shape_str(partial.shape()),
              " ", dtype_name(partial.dtype()), " on ", partial.device().str());
  push({DeferredPass::Kind::column_sums_finish, partial, Tensor(), out});
}

void DeferredPasses::masked_gradient(const Tensor& dy, const Tensor& mask, const Tensor& dx) {
  QGRAD_CHECK(dy.shape() == dx.shape() && masked_gradient_exact_cast(dy.dtype(), dx.dtype()) &&
                  dy.device() == dx.device() && mask.device() == dx.device() &&
                  mask.numel() >= bitmask_words(dx.numel()),
              "masked_gradient", "dy", "dy ", shape_str(dy.shape()), " ", dtype_name(dy.dtype()), " and dx ",
              shape_str(dx.shape()), " ", dtype_name(dx.dtype()),
              " must match in shape and device, dy's dtype dx's or one it holds exactly, with a mask of ",
              bitmask_words(dx.numel()), " words");
  if (dx.numel() == 0) return;
  push({DeferredPass::Kind::masked_gradient, dy, mask, dx});
}

void DeferredPasses::cast(const Tensor& in, const Tensor& out) {
  QGRAD_CHECK(in.numel() == out.numel() && in.device() == out.device() && is_floating(in.dtype()) &&
                  is_floating(out.dtype()),
              "cast", "in", "in ", shape_str(in.shape()), " ", dtype_name(in.dtype()), " and out ",
              shape_str(out.shape()), " ", dtype_name(out.dtype()),
              " must be floating, of one element count and device");
  if (out.numel() == 0) return;
  push({DeferredPass::Kind::cast, in, Tensor(), out});
}

int DeferredPasses::generation_reading(const Tensor& a, const Tensor& b) const {
  int g = 0;
  for (const DeferredPass& p : passes_) {
    const auto& written = p.out.impl()->storage;
    if ((a.defined() && a.impl()->storage == written) || (b.defined() && b.impl()->storage == written))
      g = std::max(g, p.generation + 1);
  }
  return g;
}

void DeferredPasses::push(DeferredPass pass) {
  pass.generation = generation_reading(pass.in, pass.mask);
  passes_.push_back(std::move(pass));
}

namespace {
std::atomic<std::uint64_t> g_partials_taken{0};
}  // namespace

void DeferredPasses::note_column_partials(const Tensor& t, const Tensor& partials, std::int64_t chunk_rows) {
  partials_.push_back({t.impl()->storage, t.impl()->offset, t.numel(), chunk_rows, partials});
}

Tensor DeferredPasses::column_partials(const Tensor& t, std::int64_t cols, std::int64_t chunk_rows) const {
  if (!t.defined() || cols <= 0 || t.numel() % cols != 0) return Tensor();
  const std::int64_t chunks = (t.numel() / cols + chunk_rows - 1) / chunk_rows;
  for (const KnownPartials& k : partials_)
    if (k.storage.lock() == t.impl()->storage && k.offset == t.impl()->offset && k.numel == t.numel() &&
        k.chunk_rows == chunk_rows && k.partials.numel() == chunks * cols) {
      g_partials_taken.fetch_add(1, std::memory_order_relaxed);
      return k.partials;
    }
  return Tensor();
}

std::uint64_t DeferredPasses::column_partials_taken() { return g_partials_taken.load(std::memory_order_relaxed); }

bool DeferredPasses::writes(const Tensor& t) const {
  if (!t.defined()) return false;
  for (const DeferredPass& p : passes_)
    if (p.out.impl()->storage == t.impl()->storage) return true;
  return false;
}

void DeferredPasses::flush() {
  // Taken first: a pass that throws leaves nothing queued to run twice.
  std::vector<DeferredPass> passes = std::move(passes_);
  passes_.clear();
  std::vector<char> done(passes.size(), 0);
  int last = 0;
  for (const DeferredPass& p : passes) last = std::max(last, p.generation);
  for (std::size_t i = 0; i < passes.size(); ++i)  // the CPU: queue order keeps every writer before its readers
    if (!passes[i].out.is_cuda()) {
      run_now(passes[i]);
      done[i] = 1;
    }
  for (int gen = 0; gen <= last; ++gen)
    for (std::size_t i = 0; i < passes.size(); ++i) {
      if (done[i] || passes[i].generation != gen) continue;
      // Every CUDA pass of this generation, device and dtype, in queue order: one batch.
      std::vector<DeferredPass> group;
      for (std::size_t j = i; j < passes.size(); ++j)
        if (!done[j] && passes[j].generation == gen && passes[j].out.device() == passes[i].out.device() &&
            passes[j].out.dtype() == passes[i].out.dtype()) {
          group.push_back(passes[j]);
          done[j] = 1;
        }
      QGRAD_ON_CUDA(cuda::run_deferred_passes(group));
    }
}

void cast_gradient(const Tensor& in, const Tensor& out, DeferredPasses* defer) {
  if (defer != nullptr) defer->cast(in, out);
  else if (out.numel() > 0) kernels::cast(in, out);
}

void masked_gradient(const Tensor& dy, const Tensor& mask, const Tensor& dx, DeferredPasses* defer) {
  if (defer != nullptr) defer->masked_gradient(dy, mask, dx);
  else if (dx.numel() > 0) masked_gradient_now(dy, mask, dx);
}

bool masked_gradient_exact_cast(DType from, DType to) {
  if (from == to) return is_floating(from);
  const bool narrow16 = from == DType::bf16 || from == DType::f16;
  return (narrow16 && (to == DType::f32 || to == DType::f64)) || (from == DType::f32 && to == DType::f64);
}

}  // namespace qgrad::kernels
