// Helpers shared by the nn tests: a temporary directory and the message
// of the qgrad::Error a call throws.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <string>

#include "qgrad/core/error.h"

namespace qgrad::testing {

struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const char* prefix = "qgrad_nn") {
    std::string tmpl = std::string("/tmp/") + prefix + "_XXXXXX";
    path = ::mkdtemp(tmpl.data());
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& n) const { return (path / n).string(); }
};

// The what() of the qgrad::Error f() throws, or "" when it throws none.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const ::qgrad::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace qgrad::testing
