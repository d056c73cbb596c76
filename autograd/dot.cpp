#include "qgrad/autograd/dot.h"

#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <unordered_map>
#include <vector>

#include "qgrad/autograd/node.h"
#include "qgrad/core/error.h"

extern char** environ;

namespace qgrad {

namespace {

// DOT string-literal escaping; "\n" in `s` becomes a label line break.
std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

std::string bytes_str(std::size_t b) {
  std::ostringstream s;
  if (b < 1024) s << b << " B";
  else if (b < 1024 * 1024) s << (b + 512) / 1024 << " KiB";
  else s << (b + (1u << 19)) / (1u << 20) << " MiB";
  return s.str();
}

// prefix + n, built without `"literal" + std::string` (GCC 12 -Wrestrict
// reports a false positive there).
std::string make_id(char prefix, std::size_t n) {
  std::string id(1, prefix);
  id += std::to_string(n);
  return id;
}

std::string meta_str(const TensorMeta& m) {
  return shape_str(m.shape) + " " + dtype_name(m.dtype) + " " + m.device.str();
}

class DotWriter {
 public:
  std::string run(const Tensor& root) {
    out_ << "digraph qgrad {\n"
         << "  rankdir=BT;\n"
         << "  node [fontname=\"Helvetica\", fontsize=10];\n"
         << "  edge [fontname=\"Helvetica\", fontsize=9];\n";
    const std::string root_id = "out";
    out_ << "  " << root_id << " [shape=note, label=\""
         << escape(std::string("output\n") + meta_str(TensorMeta::of(root))) << "\"];\n";
    if (std::shared_ptr<Node> fn = root.grad_fn()) {
      edge(node_id(fn.get()), root_id, "");
      walk(fn.get());
    } else if (root.requires_grad()) {
      edge(leaf_id(root.impl()->autograd.get()), root_id, "");
    }
    out_ << "}\n";
    return out_.str();
  }

 private:
  void walk(Node* root) {
    std::vector<Node*> stack{root};
    while (!stack.empty()) {
      Node* n = stack.back();
      stack.pop_back();
      const std::string id = node_id(n);
      for (std::size_t i = 0; i < n->inputs.size(); ++i) {
        const Edge& e = n->inputs[i];
        const std::string label = n->inputs.size() > 1 ? std::to_string(i) : "";
        if (e.node) {
          const bool fresh = !nodes_.count(e.node.get());
          edge(node_id(e.node.get()), id, label);
          if (fresh) stack.push_back(e.node.get());
        } else if (e.leaf) {
          edge(leaf_id(e.leaf.get()), id, label);
        } else {
          const std::string c = make_id('c', constants_++);
          out_ << "  " << c << " [shape=box, style=dashed, color=gray50, fontcolor=gray30, label=\""
               << escape(std::string("const\n") + shape_str(e.meta.shape) + " " + dtype_name(e.meta.dtype)) << "\"];\n";
          edge(c, id, label);
        }
      }
    }
  }

  // Declares the op node on first sight.
  std::string node_id(Node* n) {
    auto [it, inserted] = nodes_.try_emplace(n, make_id('n', nodes_.size()));
    if (inserted) {
      std::string label = n->name;
      label += " #";
      label += std::to_string(n->sequence);
      label += "\n";
      label += meta_str(n->output);
      if (n->grad_dtype != n->output.dtype) label += std::string("\ngrad ") + dtype_name(n->grad_dtype);
      label += "\nsaved ";
      label += bytes_str(n->saved_bytes);
      if (n->released) label += "\n(released)";
      out_ << "  " << it->second << " [shape=ellipse, style=filled, fillcolor=\"#dde8f7\", label=\""
           << escape(label) << "\"];\n";
    }
    return it->second;
  }

  std::string leaf_id(AutogradMeta* m) {
    auto [it, inserted] = leaves_.try_emplace(m, make_id('l', leaves_.size()));
    if (inserted) {
      std::string label = m->name.empty() ? std::string("leaf") : m->name;
      if (m->is_parameter) label += " (param)";
      label += "\n";
      label += meta_str(m->meta);
      out_ << "  " << it->second << " [shape=box, style=filled, fillcolor=\""
           << (m->is_parameter ? "#f7e3c6\", peripheries=2" : "#e6f2e0\"") << ", label=\"" << escape(label)
           << "\"];\n";
    }
    return it->second;
  }

  void edge(const std::string& from, const std::string& to, const std::string& label) {
    out_ << "  " << from << " -> " << to;
    if (!label.empty()) out_ << " [label=\"" << label << "\"]";
    out_ << ";\n";
  }

  std::ostringstream out_;
  std::unordered_map<Node*, std::string> nodes_;
  std::unordered_map<AutogradMeta*, std::string> leaves_;
  std::size_t constants_ = 0;
};

// The full path of `prog` on PATH, or "" when absent.
std::string find_on_path(const std::string& prog) {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    const std::string full = (dir.empty() ? "." : dir) + "/" + prog;
    if (::access(full.c_str(), X_OK) == 0) return full;
  }
  return "";
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

std::string to_dot(const Tensor& root) {
  QGRAD_CHECK(root.defined(), "to_dot", "root", "undefined tensor");
  return DotWriter().run(root);
}

void write_dot(const Tensor& root, const std::string& path) {
  const std::string text = to_dot(root);
  std::ofstream f(path, std::ios::binary);
  QGRAD_CHECK(f.good(), "write_dot", "path", "cannot open ", path, " for writing");
  f << text;
  f.close();
  QGRAD_CHECK(f.good(), "write_dot", "path", "writing ", path, " failed");
}

bool render_dot(const std::string& dot_path, const std::string& out_path) {
  std::string format;
  if (ends_with(out_path, ".svg")) format = "-Tsvg";
  else if (ends_with(out_path, ".png")) format = "-Tpng";
  QGRAD_CHECK(!format.empty(), "render_dot", "out_path", "expected a .svg or .png path, got ", out_path);
  QGRAD_CHECK(!dot_path.empty(), "render_dot", "dot_path", "empty path");
  const std::string dot = find_on_path("dot");
  if (dot.empty()) return false;
  // The output is glued to -o and an input name starting with '-' is made
  // relative, so no file name can be read as an option.
  std::vector<std::string> args{dot, format, std::string("-o") + out_path,
                                dot_path[0] == '-' ? std::string("./") + dot_path : dot_path};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  if (::posix_spawn(&pid, dot.c_str(), nullptr, nullptr, argv.data(), environ) != 0) return false;
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return false;
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return false;
  struct stat st {};
  return ::stat(out_path.c_str(), &st) == 0 && st.st_size > 0;
}

}  // namespace qgrad
