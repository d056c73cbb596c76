// Fashion-MNIST from gzipped IDX files (Debian's dataset-fashion-mnist:
// /usr/share/datasets/fashion-mnist/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz)
// and a seeded batch iterator.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "qgrad/core/tensor.h"
#include "qgrad/nn/module.h"

namespace qgrad::nn {

inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

struct Normalize {
  bool enabled = true;
  double mean = 0.2860;  // Fashion-MNIST training-set pixel mean and std
  double std = 0.3530;
};

struct Dataset {
  Tensor images;  // f32 [N, rows*cols] on the host, (x/255 - mean)/std
  Tensor labels;  // s64 [N] on the host, each < 10
  std::int64_t rows = 0, cols = 0;
  std::int64_t size() const { return labels.defined() ? labels.numel() : 0; }
};

// IDX readers (gzip or plain; zlib's gzread reads both). Every error is a
// qgrad::Error naming the file and what is wrong: missing or unreadable
// file, bad magic, dims of zero / whose product overflows / not
// expect_rows x expect_cols (0: any), truncated data, trailing bytes.
Tensor read_idx_images(const std::string& path, const Normalize& norm = {}, std::int64_t expect_rows = 28,
                       std::int64_t expect_cols = 28);
Tensor read_idx_labels(const std::string& path, std::int64_t num_classes = 10);
// The same parsers on bytes already in memory (decompressed); `name` stands
// for the file in error messages. The file readers call these; the fuzzer
// (fuzz/fuzz_idx.cpp) feeds them directly.
Tensor parse_idx_images(const std::vector<unsigned char>& bytes, const std::string& name, const Normalize& norm = {},
                        std::int64_t expect_rows = 28, std::int64_t expect_cols = 28);
Tensor parse_idx_labels(const std::vector<unsigned char>& bytes, const std::string& name,
                        std::int64_t num_classes = 10);

// split: "train" or "t10k" (alias "test"). Checks label count == image count.
Dataset load_fashion_mnist(const std::string& split, const std::string& folder = kFashionMnistDir,
                           const Normalize& norm = {});

struct Batch {
  Tensor images;  // [B, 784] on the loader's device
  Tensor labels;  // [B] s64
  std::int64_t index = 0;
};

// Iterates over a dataset in batches. With shuffle, each epoch uses a new
// permutation drawn from a Generator seeded with `seed` (Fisher-Yates on
// formulas::random_bits), so the same seed gives the same orders. Batches
// are gathered contiguously on the host and copied to `device`.
class DataLoader {
 public:
  DataLoader(const Dataset& data, std::int64_t batch_size, bool shuffle = true, std::uint64_t seed = 0,
             bool drop_last = false, Device device = Device::cpu());
  // Starts the next epoch (reshuffles). Called by the constructor.
  void start_epoch();
  // Fills `batch` and returns true, or returns false at the end of the epoch.
  bool next(Batch& batch);
  std::int64_t num_batches() const;
  const std::vector<std::int64_t>& order() const { return order_; }
  std::int64_t epoch() const { return epoch_; }
  // The loader's position, for resuming a run bit for bit: "order" (s64
  // [N], this epoch's permutation), "position" (s64 [3]: next example,
  // next batch index, epoch) and "generator" (generator_state: the
  // shuffling generator after this epoch's permutation was drawn).
  NamedTensors state_dict() const;
  // Validates every entry against this loader's data (sizes, a permutation
  // of 0..N-1, positions in range) before changing anything; throws
  // qgrad::Error naming the entry.
  void load_state_dict(const NamedTensors& state);

 private:
  Dataset data_;
  std::int64_t batch_size_;
  bool shuffle_, drop_last_;
  Device device_;
  Generator gen_;
  std::vector<std::int64_t> order_;
  std::int64_t pos_ = 0, batch_index_ = 0, epoch_ = -1;
};

}  // namespace qgrad::nn
