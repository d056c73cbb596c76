// Gradient passes a backward pass may postpone and run together: the last,
// small pass of a parameter's gradient (a chunked column sum's finish, a
// weight fake quant's straight-through mask, a mixed-precision parameter's
// gradient cast back to its dtype). to_batch runs its forward casts through
// a queue of its own (one launch for a model's parameters). A captured training step
// spends about 2 us of dependency latency on each such pass, one per
// parameter; queued here, a device's passes of one dtype run as one launch.
//
// A queued pass has not written its output yet: code that queues one must
// hand that output only to a reader that flushes first. The backward engine
// owns the queue of a backward pass (autograd/node.h deferred_gradient_passes)
// and flushes it before a queued output reaches anything but an empty leaf
// gradient, before a leaf's hooks read it, and at the end of the pass. Each
// pass gives the bits it gives run where it was queued (the same formula
// over the same operands in the same order). A pass keeps its inputs alive
// until it runs (for a mask pass that is the incoming gradient, the size of
// the parameter).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "qgrad/core/tensor.h"

namespace qgrad::kernels {

struct DeferredPass {
  enum class Kind { column_sums_finish, masked_gradient, cast };
  Kind kind;
  Tensor in;    // column_sums_finish: partials [chunks, cols] in op math; masked_gradient: dy; cast: the source
  Tensor mask;  // masked_gradient: the saved bit mask (s32 words, kernels/bitmask.h)
  Tensor out;   // what the pass writes
  // 0, or one past the latest generation of a queued pass that writes what
  // this one reads (a cast of a gradient a finish has yet to write): flush
  // runs the generations in order.
  int generation = 0;
};

class DeferredPasses {
 public:
  DeferredPasses() = default;
  DeferredPasses(const DeferredPasses&) = delete;
  DeferredPasses& operator=(const DeferredPasses&) = delete;
  ~DeferredPasses();  // runs what is left (errors dropped: a backward is unwinding)

  // out[j] = the sum over c of partial[c, j] in lane_sum's order
  // (ChunkSumsFinish, kernels/loop.h, without a mean); partial is
  // [chunks, out.numel()] in op_math_t of out's dtype, on out's device.
  void column_sums_finish(const Tensor& partial, const Tensor& out);
  // dx = dy * bit (fake_quantize_backward); dy and dx of one shape. dy may
  // be of a narrower floating dtype than dx whose values dx's holds exactly
  // (bf16 or f16 into f32 or f64, f32 into f64): dx = cast(dy) * bit, the
  // bits of the cast's pass followed by the mask's (masked_gradient_exact_cast).
  void masked_gradient(const Tensor& dy, const Tensor& mask, const Tensor& dx);
  // out = in converted to out's dtype (kernels::cast, formulas::cast_value);
  // floating dtypes, the same numel and device.
  void cast(const Tensor& in, const Tensor& out);

  // What the backward already knows of its gradients: `partials` [chunks,
  // cols] (op math) hold t's column sums over chunks of `chunk_rows` rows in a
  // chunked column sum's lane order, written by the kernel that wrote t (the
  // norms' backward). column_partials(t, ...) gives them back to a column
  // sum of the same t, rows and columns (a bias gradient), which then only
  // queues the finish; undefined where none is known. Held by a weak
  // reference to t's storage: never matched to memory reused after t.
  void note_column_partials(const Tensor& t, const Tensor& partials, std::int64_t chunk_rows);
  Tensor column_partials(const Tensor& t, std::int64_t cols, std::int64_t chunk_rows) const;
  // How many column sums took known partials, since the process started (tests).
  static std::uint64_t column_partials_taken();

  // Whether a queued pass writes memory that t's elements cover.
  bool writes(const Tensor& t) const;
  bool empty() const { return passes_.empty(); }
  std::size_t size() const { return passes_.size(); }
  // Runs every queued pass: on the CPU one after another (queue order), on
  // CUDA one launch per generation, device and dtype (up to a table's worth
  // of passes each), the generations in order.
  void flush();

 private:
  // The generation of a pass reading a and b (undefined: nothing).
  int generation_reading(const Tensor& a, const Tensor& b) const;
  void push(DeferredPass pass);
  struct KnownPartials {
    std::weak_ptr<Storage> storage;
    std::int64_t offset, numel, chunk_rows;
    Tensor partials;
  };
  std::vector<DeferredPass> passes_;
  std::vector<KnownPartials> partials_;
};

// dx = dy * bit, queued on `defer` when it is given, else run now (dy's
// dtype as DeferredPasses::masked_gradient allows).
void masked_gradient(const Tensor& dy, const Tensor& mask, const Tensor& dx, DeferredPasses* defer);
// Whether a gradient in `from` converts to `to` exactly (equal, or bf16 / f16
// into f32 / f64, or f32 into f64): a masked gradient may take the cast with it.
bool masked_gradient_exact_cast(DType from, DType to);
// out = in in out's dtype, queued on `defer` when it is given, else run now.
void cast_gradient(const Tensor& in, const Tensor& out, DeferredPasses* defer);

}  // namespace qgrad::kernels
