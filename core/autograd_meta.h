// The per-tensor autograd record: what a tensor knows of the graph (whether
// it requires grad, its gradient, the node that produced it). It is data
// owned by the tensor, so it lives in core; the tape itself (nodes, edges,
// record, the backward engine) is the autograd layer's (autograd/node.h).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "qgrad/core/tensor.h"

namespace qgrad {

struct Node;  // autograd/node.h

struct TensorMeta {
  Shape shape;
  DType dtype = DType::f32;
  Device device;
  static TensorMeta of(const Tensor& t) { return {t.shape(), t.dtype(), t.device()}; }
};

struct AutogradMeta {
  bool requires_grad = false;
  bool is_parameter = false;
  std::string name;
  Tensor grad;                    // leaves only
  std::shared_ptr<Node> grad_fn;  // null for leaves
  TensorMeta meta;                // the tensor's own shape/dtype/device
  // Leaves only: run by the backward engine once per pass, after the pass
  // has accumulated its last gradient into `grad` (autograd/node.h,
  // add_post_accumulate_grad_hook). Keyed by a handle for removal.
  std::vector<std::pair<std::uint64_t, std::function<void()>>> post_accumulate_hooks;
};

}  // namespace qgrad
