// The library's CUDA sources keep the launch contract of core/cuda/common.cuh:
// every kernel is launched by launch_kernel() (never <<<...>>>), which may
// dispatch it as a programmatic dependent of the kernel before it, and every
// kernel's first statement is wait_for_prior_kernels(). A kernel that read or
// wrote memory before that wait would race with the kernel still running
// before it: a bug that tests over results catch only by chance.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

// The text with comments blanked out (string literals are kept).
std::string without_comments(const std::string& s) {
  std::string out = s;
  for (std::size_t i = 0; i + 1 < out.size(); ++i) {
    if (out[i] == '"') {
      for (++i; i < out.size() && out[i] != '"'; ++i)
        if (out[i] == '\\') ++i;
    } else if (out[i] == '/' && out[i + 1] == '/') {
      for (; i < out.size() && out[i] != '\n'; ++i) out[i] = ' ';
    } else if (out[i] == '/' && out[i + 1] == '*') {
      for (; i + 1 < out.size() && !(out[i] == '*' && out[i + 1] == '/'); ++i)
        if (out[i] != '\n') out[i] = ' ';
      if (i + 1 < out.size()) out[i] = out[i + 1] = ' ';
    }
  }
  return out;
}

struct Finding {
  std::string file;
  std::size_t kernels = 0;
  std::vector<std::string> problems;
};

Finding scan(const fs::path& path, const std::string& rel) {
  std::ifstream in(path);
  std::stringstream buf;
  buf << in.rdbuf();
  const std::string text = without_comments(buf.str());
  Finding f{rel, 0, {}};
  const auto line_of = [&](std::size_t pos) {
    return std::to_string(1 + std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(pos), '\n'));
  };
  for (std::size_t p = text.find("<<<"); p != std::string::npos; p = text.find("<<<", p + 3))
    f.problems.push_back(rel + ":" + line_of(p) + ": a launch by <<<...>>> (use ::qgrad::cuda::launch_kernel)");
  static const std::regex first_statement(R"(^\s*(::qgrad::)?(cuda::)?wait_for_prior_kernels\(\);)");
  // The sanctioned exception (core/cuda/common.cuh): a DeferredPriorWait
  // declared first, whose wait() the body calls.
  static const std::regex deferred(R"(^\s*(const\s+)?(::qgrad::)?(cuda::)?DeferredPriorWait\s+(\w+)\s*;)");
  for (std::size_t p = text.find("__global__"); p != std::string::npos; p = text.find("__global__", p + 10)) {
    // The body's brace: the first '{' outside parentheses (attributes and
    // the parameter list come before it); a ';' first means a declaration.
    int depth = 0;
    std::size_t q = p;
    for (; q < text.size(); ++q) {
      const char c = text[q];
      if (c == '(') ++depth;
      if (c == ')') --depth;
      if (depth == 0 && (c == '{' || c == ';')) break;
    }
    if (q >= text.size() || text[q] == ';') continue;
    ++f.kernels;
    const auto body = text.begin() + static_cast<std::ptrdiff_t>(q) + 1;
    std::smatch m;
    if (std::regex_search(body, text.end(), m, deferred, std::regex_constants::match_continuous)) {
      // Its wait() before the body's end (the brace closing the body).
      int braces = 1;
      std::size_t end = q + 1;
      for (; end < text.size() && braces > 0; ++end) braces += text[end] == '{' ? 1 : text[end] == '}' ? -1 : 0;
      const std::string call = m[4].str() + ".wait()";
      const std::size_t at = text.find(call, q);
      if (at == std::string::npos || at >= end)
        f.problems.push_back(rel + ":" + line_of(p) + ": a kernel that defers its wait and never calls " + call);
      continue;
    }
    if (!std::regex_search(body, text.end(), first_statement, std::regex_constants::match_continuous))
      f.problems.push_back(rel + ":" + line_of(p) + ": a kernel whose first statement is not wait_for_prior_kernels()");
  }
  return f;
}

}  // namespace

TEST_CASE("every library kernel waits for the kernels before it and is launched by launch_kernel") {
  const fs::path root = QGRAD_SOURCE_DIR;
  std::size_t kernels = 0, files = 0;
  std::vector<std::string> problems;
  for (const char* dir : {"core", "kernels", "ops", "nn", "autograd", "dist", "export"}) {
    if (!fs::exists(root / dir)) continue;
    for (const auto& entry : fs::recursive_directory_iterator(root / dir)) {
      const std::string ext = entry.path().extension().string();
      if (!entry.is_regular_file() || (ext != ".cu" && ext != ".cuh" && ext != ".h" && ext != ".cpp")) continue;
      const Finding f = scan(entry.path(), fs::relative(entry.path(), root).string());
      ++files;
      kernels += f.kernels;
      problems.insert(problems.end(), f.problems.begin(), f.problems.end());
    }
  }
  std::string all;
  for (const std::string& p : problems) all += p + "\n";
  INFO(all);
  CHECK(problems.empty());
  // The scan found the sources (34 kernels when this test was written).
  CHECK(files > 50);
  CHECK(kernels >= 30);
}

TEST_CASE("the kernel-source check flags a kernel that touches memory before waiting") {
  const fs::path dir = fs::temp_directory_path() / "qgrad_kernel_sources_test";
  fs::create_directories(dir);
  const fs::path bad = dir / "bad.cu";
  {
    std::ofstream out(bad);
    out << "// wait_for_prior_kernels(); in a comment does not count\n"
           "template <class T>\n__global__ void __launch_bounds__(256) k(T* p) {\n  p[0] = T(1);\n"
           "  ::qgrad::cuda::wait_for_prior_kernels();\n}\n"
           "__global__ void good(int* p) {\n  ::qgrad::cuda::wait_for_prior_kernels();\n  *p = 0;\n}\n"
           "__global__ void declared(int* p);\n"
           "__global__ void deferred_ok(int* p) {\n  ::qgrad::cuda::DeferredPriorWait prior;\n  prior.wait();\n}\n"
           "__global__ void deferred_bad(int* p) {\n  ::qgrad::cuda::DeferredPriorWait prior;\n  *p = 0;\n}\n"
           "void host() { k<<<1, 1>>>(nullptr); }\n";
  }
  const Finding f = scan(bad, "bad.cu");
  CHECK(f.kernels == 4);
  REQUIRE(f.problems.size() == 3);
  CHECK(f.problems[0].find("bad.cu:20: a launch by <<<") == 0);
  CHECK(f.problems[1].find("bad.cu:3: a kernel whose first statement") == 0);
  CHECK(f.problems[2].find("bad.cu:16: a kernel that defers its wait and never calls prior.wait()") == 0);
  fs::remove_all(dir);
}
