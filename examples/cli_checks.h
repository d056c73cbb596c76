// Range checks for the examples' command lines that say what is wanted in
// words: "--batch: must be an integer in [1, 60000], got '0'" (CLI11's own
// PositiveNumber prints the whole double range instead).
#pragma once

#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "qgrad/core/device.h"

namespace qgrad_examples {

inline std::string range_text(double lo, double hi, bool lo_open, bool hi_open) {
  auto num = [](double v) {
    std::string s = std::to_string(v);
    s.erase(s.find_last_not_of('0') + 1);
    if (!s.empty() && s.back() == '.') s.pop_back();
    return s;
  };
  return (lo_open ? "(" : "[") + num(lo) + ", " + num(hi) + (hi_open ? ")" : "]");
}

// An integer in [lo, hi].
inline CLI::Validator integer_in(std::int64_t lo, std::int64_t hi) {
  const std::string range = "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  return CLI::Validator(
      [lo, hi, range](std::string& text) -> std::string {
        std::size_t used = 0;
        long long v = 0;
        try {
          v = std::stoll(text, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (text.empty() || used != text.size() || v < lo || v > hi)
          return "must be an integer in " + range + ", got '" + text + "'";
        return {};
      },
      "INT in " + range);
}

// A finite number in [lo, hi]; lo_open / hi_open leave out an end.
inline CLI::Validator number_in(double lo, double hi, bool lo_open = false, bool hi_open = false) {
  const std::string range = range_text(lo, hi, lo_open, hi_open);
  return CLI::Validator(
      [lo, hi, lo_open, hi_open, range](std::string& text) -> std::string {
        std::size_t used = 0;
        double v = 0;
        try {
          v = std::stod(text, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        const bool low_ok = lo_open ? v > lo : v >= lo;
        const bool high_ok = hi_open ? v < hi : v <= hi;
        if (text.empty() || used != text.size() || !std::isfinite(v) || !low_ok || !high_ok)
          return "must be a number in " + range + ", got '" + text + "'";
        return {};
      },
      "NUMBER in " + range);
}

// A seed: an integer in [0, 2^63 - 1] (CLI11 alone would wrap "-1" into an
// unsigned seed and answer "Could not convert" for "abc").
inline CLI::Validator seed_value() { return integer_in(0, std::numeric_limits<std::int64_t>::max()); }

// One of a fixed set of words ("must be int8, 8da4w or fp8, got 'int4'").
inline CLI::Validator one_of(std::vector<std::string> words) {
  std::string wanted;
  for (std::size_t i = 0; i < words.size(); ++i)
    wanted += (i == 0 ? "" : i + 1 == words.size() ? " or " : ", ") + words[i];
  return CLI::Validator(
      [words, wanted](std::string& text) -> std::string {
        for (const auto& w : words)
          if (text == w) return {};
        return "must be " + wanted + ", got '" + text + "'";
      },
      "one of " + wanted);
}

// A device name as Device::parse reads it ("cpu", "cuda", "cuda:N"), and
// "auto" where the example picks one itself.
inline CLI::Validator device_name(bool allow_auto) {
  const std::string wanted = allow_auto ? "auto, cpu, cuda or cuda:N" : "cpu, cuda or cuda:N";
  return CLI::Validator(
      [allow_auto, wanted](std::string& text) -> std::string {
        if (allow_auto && text == "auto") return {};
        try {
          (void)qgrad::Device::parse(text);
          return {};
        } catch (const std::exception&) {
          return "must be " + wanted + ", got '" + text + "'";
        }
      },
      "DEVICE (" + wanted + ")");
}

}  // namespace qgrad_examples
