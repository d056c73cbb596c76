// Graph export: the recorded graph behind a tensor as Graphviz DOT.
//
// Nodes are the recorded ops (name, creation number, output shape, dtype,
// device, gradient dtype when it differs, bytes the backward closure keeps
// alive); leaves that require grad are boxes with their name, shape and
// dtype, parameters drawn with a double border and marked "param"; inputs
// that need no gradient (constants) are dashed. Edges run from an input to
// the op that consumed it, labelled with the input's position.
#pragma once

#include <string>

#include "qgrad/core/tensor.h"

namespace qgrad {

// The DOT text of the graph that produced `root` (walked iteratively, so any
// depth works). A tensor outside any graph yields a graph with one box.
std::string to_dot(const Tensor& root);

// Writes to_dot(root) to `path`; throws qgrad::Error when it cannot be written.
void write_dot(const Tensor& root, const std::string& path);

// Runs Graphviz `dot` on `dot_path`, writing `out_path` (format from its
// extension: .svg or .png; anything else throws qgrad::Error). Returns false
// when `dot` is not on PATH or fails. No shell is involved.
bool render_dot(const std::string& dot_path, const std::string& out_path);

}  // namespace qgrad
