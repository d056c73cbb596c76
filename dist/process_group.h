// qgrad::dist::ProcessGroup: collectives across the processes of one
// training job, on the libraries PyTorch uses: Gloo for CPU tensors, NCCL
// for CUDA tensors (one communicator per group, made on the first CUDA
// collective, on the tensor's device).
//
// Bootstrap as torchrun's: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and
// MASTER_PORT (from_env). Rank 0 serves a TCP key-value store on
// MASTER_ADDR:MASTER_PORT (dist/store.h) through which the ranks exchange
// Gloo's peer addresses and the ncclUniqueId; the launcher qgrad-run sets
// the variables.
//
// Every collective is in place on contiguous tensors (qgrad's always are)
// of dtype f32, f64, f16, bf16, s8, u8, s32 or s64, and every rank must
// call the same collectives in the same order with tensors of one shape and
// dtype. Every collective has a deadline (the group's timeout, default 300 s,
// QGRAD_DIST_TIMEOUT_MS overrides it in from_env): a peer that died or never
// joined gives a qgrad::Error naming the collective, never a hang.
//   CPU: Gloo's own timeout; a closed peer connection fails at once.
//   CUDA: the communicator is non-blocking (ncclCommInitRankConfig,
//   blocking = 0); every call polls ncclCommGetAsyncError against the
//   deadline, and a watchdog thread checks that each collective finishes on
//   the device in time, else aborts the communicator (ncclCommAbort): the
//   kernels return, and the next call into the group throws.
// After an error the group is unusable (as in PyTorch): every later call
// throws.
//
// CUDA collectives are queued on qgrad's stream of the tensor's device
// (core/cuda: the stream every op runs on), so they order with the ops
// around them without a host wait, and can be captured in a CudaGraph
// (the watchdog skips captured work); all_reduce_async alone runs on a side
// stream of the group, forked from and joined back to qgrad's stream by
// events (captured too), so that it overlaps compute.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "qgrad/core/tensor.h"

namespace qgrad::dist {

class TcpStore;

enum class ReduceOp : unsigned char { sum, avg, min, max };
const char* reduce_op_name(ReduceOp op);

struct ProcessGroupOptions {
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
};

// An asynchronous collective. wait() returns once the result may be read
// by the ops that follow: for a CPU tensor when the collective is done; for
// a CUDA tensor at once, without a host wait: the collective runs on a side
// stream (overlapping the ops issued between the call and wait()), and
// wait() makes qgrad's stream wait for it. Until wait(), no op may read or
// write the tensor. A CPU wait() rethrows the collective's error.
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
};

// Which library serves a device: "gloo", "nccl", or "" when this build has
// none (the call would throw).
const char* backend_for(Device device);
bool gloo_available();  // built with Gloo
bool nccl_available();  // built with NCCL (CUDA builds only)

class ProcessGroup {
 public:
  // Joins the group: rank 0 serves the store on master_port (0: any free
  // port, for tests that start every rank in one process), all connect to
  // master_addr:master_port; then Gloo's full mesh is made when this build
  // has Gloo. Throws qgrad::Error when a peer does not join within the
  // timeout. local_rank (-1: rank) picks the CUDA device of NCCL.
  ProcessGroup(int rank, int world_size, const std::string& master_addr, int master_port,
               ProcessGroupOptions options = {}, int local_rank = -1);
  // From RANK, WORLD_SIZE, LOCAL_RANK (default RANK), MASTER_ADDR (default
  // 127.0.0.1), MASTER_PORT (default 29500) and QGRAD_DIST_TIMEOUT_MS.
  static std::shared_ptr<ProcessGroup> from_env(ProcessGroupOptions options = {});
  // True when WORLD_SIZE is set and above 1.
  static bool env_is_distributed();
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const;
  int world_size() const;
  int local_rank() const;
  std::chrono::milliseconds timeout() const;

  // t <- op over ranks of t. avg: floating dtypes only (sum, then divide by
  // the world size: every rank gets the same bits).
  void all_reduce(const Tensor& t, ReduceOp op = ReduceOp::sum);
  std::shared_ptr<Work> all_reduce_async(const Tensor& t, ReduceOp op = ReduceOp::sum);
  // t <- root's t.
  void broadcast(const Tensor& t, int root = 0);
  // out [world_size, *t.shape] <- every rank's t, in rank order.
  void all_gather(const Tensor& out, const Tensor& t);
  Tensor all_gather(const Tensor& t);
  // Returns when every rank has entered it (CPU: Gloo; CUDA: an NCCL
  // all-reduce of one element, waited for on the host).
  void barrier(Device device = Device::cpu());
  TcpStore& store();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace qgrad::dist
