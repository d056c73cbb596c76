// Golden data written by the generators in tests/python/ (PyTorch 2.11 on
// the GPU machine) and kept in tests/data/: loading, and the skip when a
// file was not generated.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <vector>

#include "qgrad/core/tensor.h"

namespace qgrad::testing {

inline bool load_golden(nlohmann::json& doc, const char* path) {
  std::ifstream f(path);
  if (!f) return false;
  doc = nlohmann::json::parse(f);
  return true;
}

inline Shape golden_shape(const nlohmann::json& j) { return j.get<std::vector<std::int64_t>>(); }

}  // namespace qgrad::testing

// Declares `doc` with the file's contents, or prints SKIPPED (a test of
// its own in ctest's count) and returns from the test case.
#define QGRAD_REQUIRE_GOLDEN(doc, path, generator)                                                    \
  nlohmann::json doc;                                                                                 \
  if (!::qgrad::testing::load_golden(doc, path)) {                                                    \
    std::printf("SKIPPED: golden data %s missing (run tests/python/%s on the GPU machine)\n", path, generator); \
    return;                                                                                           \
  }
