// Fuzzes the IDX readers (nn/data.h). The first byte picks images or labels,
// the in-memory parser or the file reader (gzip or plain, through zlib, on a
// memfd), and the expected image size; the rest is the file.
#include <cstdint>
#include <vector>

#include "fuzz_common.h"
#include "qgrad/nn/data.h"

using namespace qgrad;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const std::uint8_t mode = data[0];
  ++data;
  --size;
  const bool labels = mode & 1, via_file = mode & 2, any_size = mode & 4;
  nn::Normalize norm;
  norm.enabled = (mode & 8) == 0;
  const std::int64_t num_classes = (mode & 16) ? 256 : 10;
  const std::int64_t rows = any_size ? 0 : 28, cols = any_size ? 0 : 28;
  fuzz::expect_ok_or_error([&] {
    Tensor t;
    if (via_file) {
      fuzz::MemFile f(data, size);
      t = labels ? nn::read_idx_labels(f.path(), num_classes) : nn::read_idx_images(f.path(), norm, rows, cols);
    } else {
      const std::vector<unsigned char> bytes(data, data + size);
      t = labels ? nn::parse_idx_labels(bytes, "fuzz", num_classes)
                 : nn::parse_idx_images(bytes, "fuzz", norm, rows, cols);
    }
    // A successful read holds what the header promised.
    if (labels) {
      if (t.dim() != 1) __builtin_trap();
      for (std::int64_t v : t.to_vector<std::int64_t>())
        if (v < 0 || v >= num_classes) __builtin_trap();
    } else if (t.dim() != 2 || t.numel() > static_cast<std::int64_t>(size) * 1100) {
      __builtin_trap();
    }
  });
  return 0;
}
