// The deferred gradient passes (kernels/deferred.h): queued by backward
// rules, run by flush(). CUDA batches in kernels/cuda/deferred.cu.
#include "qgrad/kernels/deferred.h"

#include <atomic>
#include <utility>

#include "qgrad/kernels/basic.h"
#include "qgrad/kernels/bitmask.h"
#include "qgrad/kernels/cuda/entries.h"
#include "qgrad/kernels/dispatch.h"
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

// One pass where it would have run (the CPU; a CUDA pass that has no batch).
void run_now(const DeferredPass& p) {
  if (p.kind == DeferredPass::Kind::cast) {
    kernels::cast(p.in, p.out);
    return;
  }
  if (p.kind == DeferredPass::Kind::masked_gradient) {
    fake_quantize_backward(p.in, p.out, words(p.mask));
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
  passes_.push_back({DeferredPass::Kind::column_sums_finish, partial, Tensor(), out});
}

void DeferredPasses::masked_gradient(const Tensor& dy, const Tensor& mask, const Tensor& dx) {
  QGRAD_CHECK(dy.shape() == dx.shape() && dy.dtype() == dx.dtype() && dy.device() == dx.device() &&
                  mask.device() == dx.device() && mask.numel() >= bitmask_words(dx.numel()),
              "masked_gradient", "dy", "dy ", shape_str(dy.shape()), " and dx ", shape_str(dx.shape()),
              " must match in shape, dtype and device, with a mask of ", bitmask_words(dx.numel()), " words");
  if (dx.numel() == 0) return;
  passes_.push_back({DeferredPass::Kind::masked_gradient, dy, mask, dx});
}

void DeferredPasses::cast(const Tensor& in, const Tensor& out) {
  QGRAD_CHECK(in.numel() == out.numel() && in.device() == out.device() && is_floating(in.dtype()) &&
                  is_floating(out.dtype()),
              "cast", "in", "in ", shape_str(in.shape()), " ", dtype_name(in.dtype()), " and out ",
              shape_str(out.shape()), " ", dtype_name(out.dtype()),
              " must be floating, of one element count and device");
  if (out.numel() == 0) return;
  passes_.push_back({DeferredPass::Kind::cast, in, Tensor(), out});
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
  for (std::size_t i = 0; i < passes.size(); ++i) {
    if (done[i]) continue;
    if (!passes[i].out.is_cuda()) {
      run_now(passes[i]);
      continue;
    }
    // Every CUDA pass of this device and dtype, in queue order: one batch.
    std::vector<DeferredPass> group;
    for (std::size_t j = i; j < passes.size(); ++j)
      if (!done[j] && passes[j].out.device() == passes[i].out.device() &&
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
  else if (dx.numel() > 0) fake_quantize_backward(dy, dx, words(mask));
}

}  // namespace qgrad::kernels
