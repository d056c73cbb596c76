// Data-parallel training over a ProcessGroup, with PyTorch's semantics.
//
// DistributedDataParallel wraps a module that every rank builds alike:
//   - at construction, rank 0's parameters and buffers are broadcast, so
//     every rank starts from the same weights;
//   - gradients are averaged across ranks in buckets (about 25 MiB each,
//     parameters in reverse registration order, the order backward produces
//     them): each bucket's all-reduce starts from a post-accumulate grad hook
//     (autograd/node.h) as soon as the bucket's last gradient is final, so it
//     overlaps with the rest of backward (CPU: on the group's worker thread;
//     CUDA: NCCL on the group's side stream, ProcessGroup::all_reduce_async).
//     When the last bucket has started, the
//     hook waits for all of them and writes the averages into the
//     parameters' .grad, still inside backward(): after loss.backward() the
//     optimizer step may run at once, as in PyTorch;
//   - every activation observer under the module gets a range sync
//     (Observer::set_range_sync): its running min/max are all-reduced (min,
//     max) after each update and before the qparams are computed, so every
//     rank fake-quantizes with the same scale and zero point (weight
//     observers see the same weights on every rank and need none);
//   - the result: identical inputs to identical optimizer steps, so every
//     rank's weights stay bit-identical (tests/test_dist.cpp checks it).
// Every parameter that requires grad must receive a gradient in every
// backward (PyTorch's find_unused_parameters=False); a parameter that got
// none is averaged as zeros. The set of parameters requiring grad may change
// between steps (LSQ's enable_param_learning): the buckets are rebuilt, on
// every rank alike, at the next forward.
//
// DistributedSampler: torch.utils.data.DistributedSampler's index split.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "qgrad/dist/process_group.h"
#include "qgrad/nn/module.h"

namespace qgrad::dist {

struct DDPOptions {
  std::size_t bucket_cap_bytes = std::size_t{25} << 20;  // PyTorch's bucket_cap_mb = 25
  bool broadcast_buffers = true;  // broadcast buffers (observer ranges, qparams) at construction too
  bool sync_observers = true;     // all-reduce observer ranges (min, max) before qparams
};

class DistributedDataParallel : public nn::Module {
 public:
  DistributedDataParallel(std::shared_ptr<nn::Module> module, std::shared_ptr<ProcessGroup> group,
                          DDPOptions options = {});
  ~DistributedDataParallel() override;

  // The wrapped module's forward; (re)builds the buckets first when the set
  // of parameters requiring grad changed. Throws when the previous backward
  // left a bucket unreduced (a parameter requiring grad got no gradient).
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "DistributedDataParallel"; }

  nn::Module& module() { return *module_; }
  const std::shared_ptr<nn::Module>& module_ptr() const { return module_; }
  ProcessGroup& group() { return *group_; }
  // Buckets of the current layout: parameter counts, in reduction order.
  std::vector<std::size_t> bucket_sizes() const;
  // Reductions completed (one per backward).
  std::int64_t sync_count() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::shared_ptr<nn::Module> module_;
  std::shared_ptr<ProcessGroup> group_;
};

// Broadcasts every parameter and buffer of `module` from `root` (in
// state_dict order).
void broadcast_state(nn::Module& module, ProcessGroup& group, int root = 0);

// Installs (or with group == nullptr removes) the min/max range sync on
// every observer under `module` but those of QAT weight fake quants
// (modules named "weight_fake_quant"), whose ranges the same weights keep
// equal on every rank.
void sync_observer_ranges(nn::Module& module, const std::shared_ptr<ProcessGroup>& group);

// This rank's share of a global batch: rows [rank * n / world, (rank + 1) *
// n / world) of t (dim 0 of size n, a multiple of the world size), copied on
// t's device. Every rank loading the same global batch (one seed) and taking
// its share trains on the same examples per step as one process with the
// global batch.
Tensor shard_rows(const Tensor& t, const ProcessGroup& group);

// torch.utils.data.DistributedSampler's split of [0, size) across
// world_size ranks: per rank num_samples() indices, rank-strided
// (rank, rank + world, ...) over a total_size() list that is the (shuffled)
// indices padded by repeating from the start (drop_last = false) or
// truncated (drop_last = true) to a multiple of world_size. With shuffle, the
// permutation of epoch e is a Fisher-Yates shuffle driven by
// std::mt19937_64(seed + e): the same on every rank and every run, new each
// epoch (set_epoch).
class DistributedSampler {
 public:
  DistributedSampler(std::int64_t size, int world_size, int rank, bool shuffle = true, std::uint64_t seed = 0,
                     bool drop_last = false);
  void set_epoch(std::int64_t epoch);
  std::int64_t epoch() const { return epoch_; }
  std::int64_t num_samples() const { return num_samples_; }
  std::int64_t total_size() const { return num_samples_ * world_; }
  // This rank's indices for the current epoch.
  std::vector<std::int64_t> indices() const;

 private:
  std::int64_t size_;
  int world_, rank_;
  bool shuffle_, drop_last_;
  std::uint64_t seed_;
  std::int64_t epoch_ = 0;
  std::int64_t num_samples_ = 0;
};

}  // namespace qgrad::dist
