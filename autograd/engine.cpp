// The backward engine: an iterative topological order over the recorded
// nodes (no recursion, so graph depth is unbounded), one reverse pass,
// gradients summed where a tensor feeds several consumers.
#include <algorithm>
#include <atomic>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "qgrad/autograd/node.h"
#include "qgrad/kernels/basic.h"
#include "qgrad/kernels/binary.h"
#include "qgrad/kernels/deferred.h"

namespace qgrad {

namespace {
thread_local bool g_grad_enabled = true;
std::atomic<bool> g_gradient_folding{true};
std::atomic<std::uint64_t> g_folded{0};
std::atomic<bool> g_gradient_deferral{true};
std::atomic<std::uint64_t> g_deferred{0};
thread_local kernels::DeferredPasses* g_deferred_passes = nullptr;
std::atomic<std::uint64_t> g_sequence{0};
std::atomic<std::uint64_t> g_hook_handle{1};

// The queue of one backward pass, current on its thread for its scope (a
// hook may run a backward of its own: the outer queue comes back after it).
class DeferredScope {
 public:
  explicit DeferredScope(bool on) : previous_(g_deferred_passes) { g_deferred_passes = on ? &passes_ : nullptr; }
  ~DeferredScope() {
    g_deferred_passes = previous_;  // passes_'s destructor runs what an exception left
  }
  DeferredScope(const DeferredScope&) = delete;
  DeferredScope& operator=(const DeferredScope&) = delete;
  // Runs the queue when it writes t (any t: `everything`).
  void flush_if_writes(const Tensor& t, bool everything = false) {
    if (passes_.empty() || !(everything || passes_.writes(t))) return;
    MainStreamScope main;      // called inside a side node's scope too
    cuda_join_side_streams();  // a queued pass may read a side-stream gradient
    g_deferred.fetch_add(passes_.size(), std::memory_order_relaxed);
    passes_.flush();
  }

 private:
  kernels::DeferredPasses passes_;
  kernels::DeferredPasses* previous_;
};

// Joins the side streams when the backward pass ends, by return or by
// exception (before the deferred queue's leftovers run: they may read them).
struct SideJoin {
  SideJoin() = default;
  SideJoin(const SideJoin&) = delete;
  SideJoin& operator=(const SideJoin&) = delete;
  ~SideJoin() {
    try {
      cuda_join_side_streams();
    } catch (...) {  // unwinding or done: the error resurfaces at the next CUDA call
    }
  }
};

// A gradient waiting for its node, and whether it was made on a side stream.
struct Pending {
  Tensor g;
  bool side = false;
};

void run_hooks(const AutogradMeta& m) {
  // A copy: a hook may add or remove hooks.
  const auto hooks = m.post_accumulate_hooks;
  for (const auto& [h, f] : hooks) f();
}

Tensor like(const Tensor& t) {
  return Tensor::empty(t.shape(), TensorOptions{}.with_dtype(t.dtype()).with_device(t.device()));
}

// The engine sits below ops/ and calls the add kernel itself; the two
// gradients already have the input's shape, dtype and device (check_grad).
Tensor accumulate(const Tensor& sum, const Tensor& g) {
  if (!sum.defined()) return g;
  Tensor out = like(sum);  // out of place: a gradient may alias another one
  kernels::binary(formulas::BinaryOp::add, sum, g, out);
  return out;
}

// a + b where at least one was made on the side stream, run on the side
// (after the main stream's work so far where one was made there), so that the
// main stream goes on without waiting for the side's: the sum is a side
// gradient.
Tensor accumulate_on_side(const Tensor& a, bool a_side, const Tensor& b, bool b_side) {
  if (!a_side || !b_side) cuda_side_stream_wait_main(b.device());
  SideStreamScope side(b.device(), true, /*fork=*/false);
  return accumulate(a, b);
}

void check_grad(const Node& node, std::size_t i, const Tensor& g) {
  const Edge& e = node.inputs[i];
  QGRAD_CHECK(g.shape() == e.meta.shape, "backward", node.name,
              "backward rule returned a gradient of shape ", shape_str(g.shape()), " for input ", i,
              " of shape ", shape_str(e.meta.shape));
  QGRAD_CHECK(g.device() == e.meta.device, "backward", node.name, "gradient for input ", i, " is on ",
              g.device().str(), ", input on ", e.meta.device.str());
}
}  // namespace

Node::~Node() {
  std::vector<std::shared_ptr<Node>> stack;
  for (Edge& e : inputs)
    if (e.node) stack.push_back(std::move(e.node));
  while (!stack.empty()) {
    std::shared_ptr<Node> n = std::move(stack.back());
    stack.pop_back();
    if (n.use_count() == 1)  // we hold the last reference: adopt its inputs first
      for (Edge& e : n->inputs)
        if (e.node) stack.push_back(std::move(e.node));
  }
}

bool gradient_folding_enabled() { return g_gradient_folding.load(std::memory_order_relaxed); }
void set_gradient_folding(bool enabled) { g_gradient_folding.store(enabled, std::memory_order_relaxed); }
std::uint64_t folded_gradient_count() { return g_folded.load(std::memory_order_relaxed); }

kernels::DeferredPasses* deferred_gradient_passes() { return g_deferred_passes; }
bool gradient_deferrable(const Tensor& t) {
  if (t.is_leaf()) return true;
  const std::shared_ptr<Node> n = t.grad_fn();
  return n != nullptr && n->reads_gradient_deferred;
}
bool gradient_deferral_enabled() { return g_gradient_deferral.load(std::memory_order_relaxed); }
void set_gradient_deferral(bool enabled) { g_gradient_deferral.store(enabled, std::memory_order_relaxed); }
std::uint64_t deferred_gradient_pass_count() { return g_deferred.load(std::memory_order_relaxed); }

bool grad_enabled() { return g_grad_enabled; }
void set_grad_enabled(bool enabled) { g_grad_enabled = enabled; }

namespace {

bool any_requires_grad_of(const Tensor* begin, const Tensor* end) {
  if (!g_grad_enabled) return false;
  for (const Tensor* t = begin; t != end; ++t)
    if (t->defined() && t->requires_grad()) return true;
  return false;
}

void record_of(const char* name, Tensor& out, const Tensor* begin, const Tensor* end, BackwardFn backward,
               std::size_t saved_bytes, DType grad_dtype, bool grad_dtype_given);

}  // namespace

bool any_requires_grad(std::initializer_list<Tensor> inputs) {
  return any_requires_grad_of(inputs.begin(), inputs.end());
}
bool any_requires_grad(const std::vector<Tensor>& inputs) {
  return any_requires_grad_of(inputs.data(), inputs.data() + inputs.size());
}

void record(const char* name, Tensor& out, std::initializer_list<Tensor> inputs, BackwardFn backward,
            std::size_t saved_bytes, DType grad_dtype, bool grad_dtype_given) {
  record_of(name, out, inputs.begin(), inputs.end(), std::move(backward), saved_bytes, grad_dtype, grad_dtype_given);
}
void record(const char* name, Tensor& out, const std::vector<Tensor>& inputs, BackwardFn backward,
            std::size_t saved_bytes) {
  record_of(name, out, inputs.data(), inputs.data() + inputs.size(), std::move(backward), saved_bytes, DType::f32,
            false);
}

void record_folding(const char* name, Tensor& out, std::initializer_list<Tensor> inputs, FoldingBackwardFn backward,
                    std::size_t saved_bytes) {
  BackwardFn plain = [backward](const Tensor& g) {
    std::vector<char> folded;
    return backward(g, {}, folded);
  };
  record_of(name, out, inputs.begin(), inputs.end(), std::move(plain), saved_bytes, DType::f32, false);
  out.autograd_meta().grad_fn->folding_backward = std::move(backward);
}

namespace {

void record_of(const char* name, Tensor& out, const Tensor* begin, const Tensor* end, BackwardFn backward,
               std::size_t saved_bytes, DType grad_dtype, bool grad_dtype_given) {
  auto node = std::make_shared<Node>();
  node->name = name;
  node->output = TensorMeta::of(out);
  node->grad_dtype = grad_dtype_given ? grad_dtype : out.dtype();
  QGRAD_CHECK(is_floating(node->grad_dtype), name, "grad_dtype", "gradients must be floating, got ",
              dtype_name(node->grad_dtype));
  node->backward = std::move(backward);
  node->saved_bytes = saved_bytes;
  node->sequence = g_sequence++;
  node->inputs.reserve(static_cast<std::size_t>(end - begin));
  for (const Tensor* it = begin; it != end; ++it) {
    const Tensor& t = *it;
    Edge e;
    if (t.defined()) {
      e.meta = TensorMeta::of(t);
      if (t.requires_grad()) {
        AutogradMeta& m = t.autograd_meta();
        if (m.grad_fn) e.node = m.grad_fn;
        else e.leaf = t.impl()->autograd;
      }
    }
    node->inputs.push_back(std::move(e));
  }
  AutogradMeta& om = out.autograd_meta();
  om.requires_grad = true;
  om.grad_fn = std::move(node);
}

}  // namespace

void run_backward(const Tensor& root, const Tensor& grad_in, bool retain_graph) {
  QGRAD_CHECK(root.defined(), "backward", "tensor", "undefined tensor");
  QGRAD_CHECK(root.requires_grad(), "backward", "tensor",
              "tensor does not require grad and has no recorded graph");
  Tensor grad = grad_in;
  if (!grad.defined()) {
    QGRAD_CHECK(root.numel() == 1, "backward", "grad",
                "grad can be implied only for a one-element output; got shape ", shape_str(root.shape()));
    const DType gd = root.grad_fn() ? root.grad_fn()->grad_dtype : root.dtype();
    grad = Tensor::empty(root.shape(), TensorOptions{}.with_dtype(gd).with_device(root.device()));
    kernels::fill(grad, 1.0);
  }
  QGRAD_CHECK(grad.shape() == root.shape(), "backward", "grad", "shape ", shape_str(grad.shape()),
              " does not match the output's ", shape_str(root.shape()));
  NoGradGuard no_grad;  // backward rules are not themselves recorded

  std::shared_ptr<Node> root_node = root.grad_fn();
  if (!root_node) {  // a leaf
    AutogradMeta& m = root.autograd_meta();
    m.grad = accumulate(m.grad, grad);
    if (!m.post_accumulate_hooks.empty()) run_hooks(m);
    return;
  }

  // Count, for every reachable node, how many edges point at it; and for
  // every reachable leaf with hooks, how many edges reach it (its hooks
  // fire when the last one has been accumulated).
  std::unordered_map<Node*, int> dependencies;
  std::unordered_map<AutogradMeta*, int> leaf_edges;
  std::vector<Node*> stack{root_node.get()};
  dependencies[root_node.get()] = 0;
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const Edge& e : n->inputs) {
      if (e.leaf && !e.leaf->post_accumulate_hooks.empty()) leaf_edges[e.leaf.get()]++;
      if (!e.node) continue;
      auto [it, inserted] = dependencies.try_emplace(e.node.get(), 0);
      it->second++;
      if (inserted) stack.push_back(e.node.get());
    }
  }

  // Kahn's order: a node runs once every consumer has passed its gradient.
  DeferredScope deferred(gradient_deferral_enabled());
  SideJoin side_join;  // declared after `deferred`: joins before its destructor runs leftovers
  std::unordered_map<Node*, Pending> pending;
  // Leaves whose gradient so far was made on a side stream and not joined.
  std::unordered_set<AutogradMeta*> side_leaves;
  pending[root_node.get()] = {grad, false};
  std::vector<Node*> ready{root_node.get()};
  while (!ready.empty()) {
    Node* n = ready.back();
    ready.pop_back();
    Tensor g = std::move(pending[n].g);
    const bool on_side = pending[n].side && g.defined();
    pending.erase(n);
    QGRAD_CHECK(!n->released, "backward", n->name,
                "the graph's saved state was already freed by an earlier backward; "
                "pass retain_graph=true to the first backward to run it twice");
    std::vector<Tensor> input_grads;
    std::vector<char> folded(n->inputs.size(), 0);
    {
      // A node whose gradient came from a side stream runs its rule there too
      // (its launches on g's device, after the side's earlier work); the
      // engine's own adds below run on the side where either term was made
      // there, else on the main stream.
      SideStreamScope side_scope(g.defined() ? g.device() : Device::cpu(), on_side, /*fork=*/false);
      if (g.defined() && n->folding_backward && gradient_folding_enabled()) {
        // Offer each input's pending gradient, except where one producer
        // feeds several of this node's inputs (a fold would count it twice).
        std::vector<Tensor> offered(n->inputs.size());
        bool wait_main = false;
        for (std::size_t i = 0; i < n->inputs.size(); ++i) {
          const Node* p = n->inputs[i].node.get();
          if (p == nullptr) continue;
          bool shared = false;
          for (std::size_t j = 0; j < n->inputs.size(); ++j)
            shared = shared || (j != i && n->inputs[j].node.get() == p);
          const auto it = pending.find(n->inputs[i].node.get());
          if (shared || it == pending.end()) continue;
          // A rule on the side stream may fold a main-stream gradient: the
          // side waits for the main stream first (below).
          if (it->second.side && !on_side) continue;  // a main-stream rule would read it unjoined
          if (on_side && !it->second.side && it->second.g.device() != g.device()) continue;
          offered[i] = it->second.g;
          wait_main = wait_main || (on_side && !it->second.side);
        }
        for (const Tensor& o : offered) deferred.flush_if_writes(o);  // the rule may read them
        if (wait_main) cuda_side_stream_wait_main(g.device());
        input_grads = n->folding_backward(g, offered, folded);
        QGRAD_CHECK(folded.size() == n->inputs.size(), "backward", n->name, "folding rule resized its folded flags");
        for (std::size_t i = 0; i < folded.size(); ++i) {
          if (!folded[i]) continue;
          QGRAD_CHECK(offered[i].defined() && i < input_grads.size() && input_grads[i].defined(), "backward", n->name,
                      "folded a gradient for input ", i, " where none was pending or returned none");
          g_folded.fetch_add(1, std::memory_order_relaxed);
        }
      } else if (g.defined()) {
        input_grads = n->backward(g);
      }
    }
    QGRAD_CHECK(!g.defined() || input_grads.size() == n->inputs.size(), "backward", n->name,
                "backward rule returned ", input_grads.size(), " gradients for ", n->inputs.size(), " inputs");
    for (std::size_t i = 0; i < n->inputs.size(); ++i) {
      const Edge& e = n->inputs[i];
      const Tensor gi = i < input_grads.size() ? input_grads[i] : Tensor();
      if (gi.defined() && e.needs_grad()) check_grad(*n, i, gi);
      // Made on a side stream: by this node's rule there, or by its own fork.
      const bool gi_side = gi.defined() && gi.is_cuda() && gi.device() == g.device() &&
                           (on_side || ((n->side_inputs >> i) & 1u) != 0);
      if (e.node) {
        Pending& slot = pending[e.node.get()];
        // Another rule reads it, unless that rule only queues passes reading
        // it and it arrives alone (an add into a pending gradient reads both).
        const bool alone = !slot.g.defined() || folded[i];
        if (!(e.node->reads_gradient_deferred && alone)) deferred.flush_if_writes(gi);
        if (gi.defined() && !folded[i]) deferred.flush_if_writes(slot.g);
        if (gi.defined()) {
          if (folded[i] || !slot.g.defined()) {
            slot = {gi, gi_side};
          } else if (slot.side || gi_side) {
            // On the side stream: the main stream goes on without waiting for it.
            slot = {accumulate_on_side(slot.g, slot.side, gi, gi_side), true};
          } else {
            slot = {accumulate(slot.g, gi), false};
          }
        }
        if (--dependencies[e.node.get()] == 0) ready.push_back(e.node.get());
      } else if (e.leaf) {
        if (gi.defined()) {
          const bool leaf_side = side_leaves.count(e.leaf.get()) != 0;
          if (e.leaf->grad.defined()) {  // the add reads both
            deferred.flush_if_writes(gi);
            deferred.flush_if_writes(e.leaf->grad);
            if (leaf_side || gi_side) {
              e.leaf->grad = accumulate_on_side(e.leaf->grad, leaf_side, gi, gi_side);
              side_leaves.insert(e.leaf.get());
            } else {
              e.leaf->grad = accumulate(e.leaf->grad, gi);
            }
          } else {
            e.leaf->grad = gi;
            if (gi_side) side_leaves.insert(e.leaf.get());
          }
        }
        auto it = leaf_edges.find(e.leaf.get());
        if (it != leaf_edges.end() && --it->second == 0) {
          deferred.flush_if_writes(e.leaf->grad);  // the hooks read it
          cuda_join_side_streams();
          run_hooks(*e.leaf);
        }
      }
    }
    if (!retain_graph) n->release();
  }
  cuda_join_side_streams();
  deferred.flush_if_writes(Tensor(), /*everything=*/true);
}

std::uint64_t add_post_accumulate_grad_hook(const Tensor& leaf, std::function<void()> hook) {
  const char* op = "add_post_accumulate_grad_hook";
  QGRAD_CHECK(leaf.defined(), op, "leaf", "undefined tensor");
  QGRAD_CHECK(leaf.requires_grad() && leaf.is_leaf(), op, "leaf", "expected a leaf that requires grad");
  QGRAD_CHECK(hook != nullptr, op, "hook", "empty function");
  const std::uint64_t h = g_hook_handle++;
  leaf.autograd_meta().post_accumulate_hooks.emplace_back(h, std::move(hook));
  return h;
}

void remove_post_accumulate_grad_hook(const Tensor& leaf, std::uint64_t handle) {
  if (!leaf.defined() || !leaf.impl()->autograd) return;
  auto& hooks = leaf.autograd_meta().post_accumulate_hooks;
  std::erase_if(hooks, [&](const auto& p) { return p.first == handle; });
}

void Tensor::backward(const Tensor& g, bool retain_graph) const { run_backward(*this, g, retain_graph); }

}  // namespace qgrad
