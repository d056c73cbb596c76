// Fuzzes the safetensors reader (nn/checkpoint.h): the in-memory parser on
// the input; on success, the tensors must fit in the input, and the
// "model.*" entries are loaded into a small model (strict name, shape and
// dtype checks).
#include <cstdint>
#include <cstring>

#include "fuzz_common.h"
#include "qgrad/nn/checkpoint.h"
#include "qgrad/nn/layers.h"

using namespace qgrad;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz::expect_ok_or_error([&] {
    nn::SafetensorsFile f = nn::parse_safetensors(reinterpret_cast<const char*>(data), size, "fuzz");
    std::size_t total = 0;
    for (const auto& [name, t] : f.tensors) {
      if (name.empty() || !t.defined()) __builtin_trap();
      total += t.nbytes();
    }
    if (total > size) __builtin_trap();
    // Into a model: Linear(2, 3) has "weight" [3, 2] and "bias" [3].
    Generator gen(1);
    nn::Linear lin(2, 3, gen);
    nn::NamedTensors m;
    for (const auto& [name, t] : f.tensors)
      if (name.rfind("model.", 0) == 0) m.emplace_back(name.substr(6), t);
    fuzz::expect_ok_or_error([&] { lin.load_state_dict(m); });
  });
  return 0;
}
