// The libraries behind ProcessGroup (internal to dist/): gloo_backend.cpp
// (Gloo, CPU tensors) and nccl_backend.cpp (NCCL, CUDA tensors), or their
// stubs when the build has no such library. ProcessGroup validates every
// argument before a backend sees it; a backend throws qgrad::Error on a
// library error or a timeout.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "qgrad/dist/process_group.h"

namespace qgrad::dist::detail {

class Backend {
 public:
  virtual ~Backend() = default;
  virtual void all_reduce(const Tensor& t, ReduceOp op) = 0;
  // An all-reduce that may overlap the ops that follow it; the returned
  // Work's wait() orders it before the ops issued after wait(). By default
  // the blocking all_reduce (nullptr: nothing to wait for).
  virtual std::shared_ptr<Work> all_reduce_async(const Tensor& t, ReduceOp op) {
    all_reduce(t, op);
    return nullptr;
  }
  virtual void broadcast(const Tensor& t, int root) = 0;
  virtual void all_gather(const Tensor& out, const Tensor& t) = 0;
  virtual void barrier() = 0;
};

struct BackendArgs {
  TcpStore* store;
  int rank, world_size, device;
  std::chrono::milliseconds timeout;
  std::string master_addr;  // Gloo binds to the local address routed to it
};

bool gloo_built();
bool nccl_built();
std::unique_ptr<Backend> make_gloo(const BackendArgs& args);
std::unique_ptr<Backend> make_nccl(const BackendArgs& args);

}  // namespace qgrad::dist::detail
