// The tape: each op that sees an input requiring grad records a Node
// holding its backward rule (a closure over the state the rule needs) and
// edges to the nodes, or leaves, that produced its inputs.
//
// Ownership runs one way, from a tensor to the node that made it and on to
// that node's inputs, never back, so a graph frees itself when its last
// tensor goes. A backward closure must therefore capture only detached
// tensors (`t.detach()`) or buffers of its own, never a tensor that carries
// this node.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "qgrad/core/autograd_meta.h"
#include "qgrad/core/tensor.h"

namespace qgrad {

struct Edge {
  std::shared_ptr<Node> node;          // the producer, for a non-leaf input
  std::shared_ptr<AutogradMeta> leaf;  // the leaf record, for a leaf that requires grad
  TensorMeta meta;                     // the input as the op saw it
  bool needs_grad() const { return node != nullptr || leaf != nullptr; }
};

// grad_output -> one gradient per input (undefined where none is needed).
using BackwardFn = std::function<std::vector<Tensor>(const Tensor& grad_output)>;
// The same rule, told per input the gradient other consumers have already
// passed back for that input (pending[i]; undefined where none, or where the
// engine does not offer it). A rule may fold pending[i] into its own result
// for input i, computing pending[i] + its gradient in the pass that writes
// it, and set folded[i]; the engine then takes that as the input's gradient
// instead of adding the two in a pass of its own (the same bits: the add is
// the engine's formula, and IEEE addition commutes).
using FoldingBackwardFn = std::function<std::vector<Tensor>(const Tensor& grad_output,
                                                            const std::vector<Tensor>& pending,
                                                            std::vector<char>& folded)>;

struct Node {
  std::string name;
  std::vector<Edge> inputs;
  TensorMeta output;
  DType grad_dtype = DType::f32;  // the output's gradient dtype (float even for an integer output)
  BackwardFn backward;
  FoldingBackwardFn folding_backward;  // optional: what the engine calls, where set
  std::size_t saved_bytes = 0;    // what the closure keeps alive, for docs and DOT
  std::uint64_t sequence = 0;     // creation order
  // The rule reads its incoming gradient only through passes it queues on
  // deferred_gradient_passes() (a cast into a leaf): the engine hands it a
  // gradient that a queued pass has yet to write without running the queue
  // first, and a rule above may queue its last pass for it as for a leaf.
  bool reads_gradient_deferred = false;
  // Bit i: the rule computes input i's gradient on the device's side stream
  // (core/device.h SideStreamScope: a parameter gradient off the critical
  // path). The engine then runs the nodes that gradient reaches there too,
  // and joins before anything on the main stream reads it.
  std::uint32_t side_inputs = 0;
  bool released = false;
  Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;
  ~Node();  // iterative: a long chain must not destroy recursively
  void release() {
    backward = nullptr;
    folding_backward = nullptr;
    released = true;
  }
};

// ---- grad mode ----
bool grad_enabled();
void set_grad_enabled(bool enabled);

// Disables recording for its scope (e.g. evaluation, optimizer updates).
class NoGradGuard {
 public:
  NoGradGuard() : previous_(grad_enabled()) { set_grad_enabled(false); }
  ~NoGradGuard() { set_grad_enabled(previous_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

// True when grad mode is on and some input requires grad: only then does an
// op compute the state its backward needs and call record().
bool any_requires_grad(std::initializer_list<Tensor> inputs);
bool any_requires_grad(const std::vector<Tensor>& inputs);  // ops with a list of inputs (cat)

// Records `out` as produced by op `name` from `inputs`. Call it only when
// any_requires_grad(inputs). `grad_dtype` is the dtype gradients of `out`
// travel in; it defaults to out's dtype and must be floating (quantize ops
// pass the dtype of their float input).
void record(const char* name, Tensor& out, std::initializer_list<Tensor> inputs, BackwardFn backward,
            std::size_t saved_bytes = 0, DType grad_dtype = DType::f32, bool grad_dtype_given = false);
// The same for an op with a list of inputs (cat): one edge per element.
void record(const char* name, Tensor& out, const std::vector<Tensor>& inputs, BackwardFn backward,
            std::size_t saved_bytes = 0);

// Records `out` as record() does, with a rule that may fold pending
// gradients (FoldingBackwardFn); its plain form (node->backward, for callers
// of one node's rule) is the same rule offered none.
void record_folding(const char* name, Tensor& out, std::initializer_list<Tensor> inputs, FoldingBackwardFn backward,
                    std::size_t saved_bytes = 0);

// Whether backward offers pending gradients to folding rules (default on).
// Off, every sum of gradients is the engine's own add: for A/B runs and for
// tests that check the folded gradients against the added ones.
bool gradient_folding_enabled();
void set_gradient_folding(bool enabled);
// How many gradients backward has taken folded since the process started
// (every thread): what tests read to see that a rule folded.
std::uint64_t folded_gradient_count();

// Deferred gradient passes (kernels/deferred.h). While backward runs, a rule
// may queue the last small pass of a gradient bound for a leaf (a chunked
// column sum's finish, a weight fake quant's mask) on
// deferred_gradient_passes() instead of running it; the engine runs the
// queue, one launch per CUDA device and dtype, before such a gradient reaches
// anything but an empty leaf gradient (another node's rule, an add into an
// existing leaf gradient, the leaf's hooks) and at the end of the pass. Null
// outside backward, or when deferral is off (default on; off: every pass runs
// where its rule calls it, for A/B runs and tests: the same bits either way).
namespace kernels {
class DeferredPasses;
}
kernels::DeferredPasses* deferred_gradient_passes();
// Whether a rule may queue the last pass of t's gradient there: t is a leaf,
// or its node reads its gradient only through deferred passes
// (Node::reads_gradient_deferred: a mixed-precision parameter's cast).
bool gradient_deferrable(const Tensor& t);
bool gradient_deferral_enabled();
void set_gradient_deferral(bool enabled);
// How many passes backward has run deferred since the process started
// (every thread): what tests read to see that a rule deferred.
std::uint64_t deferred_gradient_pass_count();

// Post-accumulate hooks (PyTorch's register_post_accumulate_grad_hook):
// `hook` runs once in every backward pass that reaches the leaf `leaf`,
// right after the pass has summed the last gradient it contributes into
// leaf.grad() (so several uses of the leaf still fire it once), in grad
// mode off, on the thread running backward. Gradients flow in the reverse
// order of the graph, so hooks fire as soon as each leaf is final: what
// DistributedDataParallel starts its bucket all-reduces from. An exception
// from a hook propagates out of backward. Returns a handle for removal.
std::uint64_t add_post_accumulate_grad_hook(const Tensor& leaf, std::function<void()> hook);
// Removes the hook (no-op when the handle is not there).
void remove_post_accumulate_grad_hook(const Tensor& leaf, std::uint64_t handle);

// Runs backward from `root` (see Tensor::backward).
void run_backward(const Tensor& root, const Tensor& grad, bool retain_graph);

}  // namespace qgrad
