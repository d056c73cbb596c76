// NCCL (CUDA tensors): one non-blocking communicator per group on the
// rank's device (ncclCommInitRankConfig with blocking = 0), its
// ncclUniqueId passed from rank 0 through the group's store. Collectives are
// queued on qgrad's stream of the device (qgrad::cuda::stream), so they
// order with the ops around them without a host wait and can be captured in
// a CudaGraph. all_reduce_async forks to a side stream of the highest
// priority instead (an event on qgrad's stream, waited for there), so the
// collective overlaps the ops issued after it (DDP's bucket all-reduces and
// the rest of backward); its Work joins back (qgrad's stream waits for an
// event recorded after the collective), without a host wait, and the fork and
// join are captured like any cross-stream dependency.
//
// Deadlines: a non-blocking call may return ncclInProgress; it is polled
// with ncclCommGetAsyncError until done or the timeout (then
// ncclCommAbort). A watchdog thread records an event after each collective
// (not while the stream is capturing) and aborts the communicator when one
// has not completed within the timeout, or when ncclCommGetAsyncError
// reports an error: the NCCL kernels then return, and every later call
// throws qgrad::Error with the reason.
#include <nccl.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "qgrad/core/cuda/common.cuh"
#include "qgrad/dist/backend.h"
#include "qgrad/dist/store.h"

namespace qgrad::dist::detail {

namespace {
using Clock = std::chrono::steady_clock;

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    case DType::f16: return ncclFloat16;
    case DType::bf16: return ncclBfloat16;
    case DType::s8: return ncclInt8;
    case DType::u8: return ncclUint8;
    case DType::s32: return ncclInt32;
    case DType::s64: return ncclInt64;
    default: QGRAD_CHECK(false, "ProcessGroup", "dtype", "unsupported dtype ", dtype_name(t));
  }
  return ncclFloat32;
}

// A collective on the side stream: wait() (or the destructor, if wait() was
// never called) makes qgrad's stream wait for it. Holds the tensor until
// then, so its memory cannot go back to the allocator (whose reuse is
// ordered on qgrad's stream only) while the side stream still uses it.
class SideStreamWork : public Work {
 public:
  SideStreamWork(Tensor t, cudaEvent_t done, cudaStream_t stream, int device)
      : tensor_(std::move(t)), done_(done), stream_(stream), device_(device) {}
  ~SideStreamWork() override {
    if (!joined_) {
      cuda::DeviceGuard guard(device_);
      cudaStreamWaitEvent(stream_, done_, 0);
    }
    cudaEventDestroy(done_);
  }
  void wait() override {
    if (joined_) return;
    cuda::DeviceGuard guard(device_);
    QGRAD_CUDA_CHECK(cudaStreamWaitEvent(stream_, done_, 0));
    joined_ = true;
    tensor_ = Tensor();
  }

 private:
  Tensor tensor_;
  cudaEvent_t done_;
  cudaStream_t stream_;
  int device_;
  bool joined_ = false;
};

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::avg: return ncclAvg;
    case ReduceOp::min: return ncclMin;
    case ReduceOp::max: return ncclMax;
  }
  return ncclSum;
}

class NcclBackend : public Backend {
 public:
  explicit NcclBackend(const BackendArgs& a) : device_(a.device), timeout_(a.timeout) {
    const char* op = "ProcessGroup";
    cuda::DeviceGuard guard(device_);
    stream_ = cuda::stream(device_);
    ncclUniqueId id;
    // The id of this group's communicator number `generation` (one per group today).
    const std::string key = "nccl/unique_id";
    if (a.rank == 0) {
      check(ncclGetUniqueId(&id), "ncclGetUniqueId");
      std::vector<char> bytes(sizeof id);
      std::memcpy(bytes.data(), &id, sizeof id);
      a.store->set(key, bytes);
    } else {
      const std::vector<char> bytes = a.store->get(key, a.timeout);
      QGRAD_CHECK(bytes.size() == sizeof id, op, "nccl", "bad ncclUniqueId from the store");
      std::memcpy(&id, bytes.data(), sizeof id);
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&comm_, a.world_size, id, a.rank, &config);
    if (r != ncclSuccess && r != ncclInProgress) check(r, "ncclCommInitRankConfig");
    wait_ready("ncclCommInitRankConfig");
    // Highest priority: the collective's blocks are scheduled ahead of the
    // compute kernels it overlaps, so they do not wait behind a long GEMM.
    int least = 0, greatest = 0;
    QGRAD_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    QGRAD_CUDA_CHECK(cudaStreamCreateWithPriority(&side_stream_, cudaStreamNonBlocking, greatest));
    watchdog_ = std::thread([this] { watch(); });
  }

  ~NcclBackend() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    cv_.notify_one();
    if (watchdog_.joinable()) watchdog_.join();
    cuda::DeviceGuard guard(device_);
    for (auto& p : pending_) cudaEventDestroy(p.event);
    for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
    if (!comm_) {
      cudaStreamDestroy(side_stream_);
      return;
    }
    // Finish queued work, then free; abort when a peer never finishes.
    ncclResult_t r = ncclCommFinalize(comm_);
    bool ok = r == ncclSuccess || r == ncclInProgress;
    const auto deadline = Clock::now() + timeout_;
    while (ok) {
      ncclResult_t s = ncclSuccess;
      if (ncclCommGetAsyncError(comm_, &s) != ncclSuccess || (s != ncclSuccess && s != ncclInProgress)) ok = false;
      if (s != ncclInProgress) break;
      if (Clock::now() > deadline) ok = false;
      std::this_thread::yield();
    }
    if (ok) ncclCommDestroy(comm_);
    else ncclCommAbort(comm_);
    cudaStreamDestroy(side_stream_);
  }

  void all_reduce(const Tensor& t, ReduceOp op) override {
    if (t.numel() == 0) return;  // nothing to send (and no data pointer)
    enqueue("all_reduce", stream_, [&] {
      return ncclAllReduce(t.data_ptr(), t.data_ptr(), static_cast<std::size_t>(t.numel()), nccl_type(t.dtype()),
                           nccl_op(op), comm_, stream_);
    });
  }

  std::shared_ptr<Work> all_reduce_async(const Tensor& t, ReduceOp op) override {
    if (t.numel() == 0) return nullptr;
    cuda::DeviceGuard guard(device_);
    cudaEvent_t ready = nullptr, done = nullptr;
    QGRAD_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
    QGRAD_CUDA_CHECK(cudaEventRecord(ready, stream_));
    QGRAD_CUDA_CHECK(cudaStreamWaitEvent(side_stream_, ready, 0));
    cudaEventDestroy(ready);  // released once recorded; the wait above is already issued
    enqueue("all_reduce", side_stream_, [&] {
      return ncclAllReduce(t.data_ptr(), t.data_ptr(), static_cast<std::size_t>(t.numel()), nccl_type(t.dtype()),
                           nccl_op(op), comm_, side_stream_);
    });
    QGRAD_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    QGRAD_CUDA_CHECK(cudaEventRecord(done, side_stream_));
    return std::make_shared<SideStreamWork>(t, done, stream_, device_);
  }

  void broadcast(const Tensor& t, int root) override {
    if (t.numel() == 0) return;
    enqueue("broadcast", stream_, [&] {
      return ncclBroadcast(t.data_ptr(), t.data_ptr(), static_cast<std::size_t>(t.numel()), nccl_type(t.dtype()),
                           root, comm_, stream_);
    });
  }

  void all_gather(const Tensor& out, const Tensor& t) override {
    if (t.numel() == 0) return;
    enqueue("all_gather", stream_, [&] {
      return ncclAllGather(t.data_ptr(), out.data_ptr(), static_cast<std::size_t>(t.numel()), nccl_type(t.dtype()),
                           comm_, stream_);
    });
  }

  // One-element all-reduce, then a host wait bounded by the timeout.
  void barrier() override {
    cuda::DeviceGuard guard(device_);
    if (!scratch_.defined()) scratch_ = Tensor::empty({1}, TensorOptions{}.with_device(Device::cuda(device_)));
    all_reduce(scratch_, ReduceOp::sum);
    cudaEvent_t e = nullptr;
    QGRAD_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    QGRAD_CUDA_CHECK(cudaEventRecord(e, stream_));
    const auto deadline = Clock::now() + timeout_;
    cudaError_t q;
    while ((q = cudaEventQuery(e)) == cudaErrorNotReady) {
      if (Clock::now() > deadline) {
        cudaEventDestroy(e);
        fail("barrier", "a peer did not reach the barrier within " + std::to_string(timeout_.count()) + " ms");
      }
      check_async("barrier");
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    cudaEventDestroy(e);
    QGRAD_CUDA_CHECK(q);
    check_async("barrier");
  }

 private:
  static void check(ncclResult_t r, const char* what) {
    QGRAD_CHECK(r == ncclSuccess, "ProcessGroup", "nccl", what, " failed: ", ncclGetErrorString(r));
  }

  // Aborts the communicator (once) and throws.
  [[noreturn]] void fail(const char* op, const std::string& why) {
    abort_comm(std::string(op) + ": " + why);
    throw Error(op, "nccl", error_);
  }

  void abort_comm(const std::string& why) {
    std::lock_guard<std::mutex> lock(comm_mutex_);
    if (error_.empty()) error_ = why;
    if (comm_) {
      ncclCommAbort(comm_);
      comm_ = nullptr;
    }
  }

  void check_async(const char* op) {
    ncclResult_t s = ncclSuccess;
    {
      std::lock_guard<std::mutex> lock(comm_mutex_);
      if (!comm_) throw Error(op, "nccl", "the communicator was aborted: " + error_);
      if (ncclCommGetAsyncError(comm_, &s) != ncclSuccess) s = ncclInternalError;
    }
    if (s != ncclSuccess && s != ncclInProgress) fail(op, std::string("NCCL error: ") + ncclGetErrorString(s));
  }

  // Waits (bounded) until the communicator has no call in progress.
  void wait_ready(const char* op) {
    const auto deadline = Clock::now() + timeout_;
    for (;;) {
      ncclResult_t s = ncclSuccess;
      {
        std::lock_guard<std::mutex> lock(comm_mutex_);
        if (!comm_) throw Error(op, "nccl", "the communicator was aborted: " + error_);
        if (ncclCommGetAsyncError(comm_, &s) != ncclSuccess) s = ncclInternalError;
      }
      if (s == ncclSuccess) return;
      if (s != ncclInProgress) fail(op, std::string("NCCL error: ") + ncclGetErrorString(s));
      if (Clock::now() > deadline)
        fail(op, "not done within " + std::to_string(timeout_.count()) + " ms (a peer died or did not join)");
      std::this_thread::yield();
    }
  }

  template <class F>
  void enqueue(const char* op, cudaStream_t stream, F&& call) {
    cuda::DeviceGuard guard(device_);
    {
      std::lock_guard<std::mutex> lock(comm_mutex_);
      if (!comm_) throw Error(op, "nccl", "the communicator was aborted: " + error_);
    }
    const ncclResult_t r = call();
    if (r != ncclSuccess && r != ncclInProgress) fail(op, std::string("NCCL error: ") + ncclGetErrorString(r));
    wait_ready(op);
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    QGRAD_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
    if (status != cudaStreamCaptureStatusNone) return;  // replays are not watched
    std::lock_guard<std::mutex> lock(mutex_);
    cudaEvent_t e = nullptr;
    if (!free_events_.empty()) {
      e = free_events_.back();
      free_events_.pop_back();
    } else {
      QGRAD_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    }
    QGRAD_CUDA_CHECK(cudaEventRecord(e, stream));
    pending_.push_back({e, Clock::now() + timeout_, op});
    cv_.notify_one();
  }

  void watch() {
    cudaSetDevice(device_);
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stopping_) {
      cv_.wait_for(lock, std::chrono::milliseconds(pending_.empty() ? 100 : 2));
      while (!pending_.empty()) {
        Pending& p = pending_.front();
        const cudaError_t q = cudaEventQuery(p.event);
        if (q == cudaSuccess) {
          free_events_.push_back(p.event);
          pending_.pop_front();
          continue;
        }
        std::string why;
        if (q != cudaErrorNotReady) {
          why = std::string(p.op) + ": CUDA error " + cudaGetErrorString(q);
        } else if (Clock::now() > p.deadline) {
          why = std::string(p.op) + ": not finished on the device within " + std::to_string(timeout_.count()) +
                " ms (a peer died or stopped calling collectives)";
        } else {
          ncclResult_t s = ncclSuccess;
          std::lock_guard<std::mutex> cl(comm_mutex_);
          if (comm_ && ncclCommGetAsyncError(comm_, &s) == ncclSuccess && s != ncclSuccess && s != ncclInProgress)
            why = std::string(p.op) + ": NCCL error " + ncclGetErrorString(s);
        }
        if (!why.empty()) {
          lock.unlock();
          abort_comm(why);
          lock.lock();
        }
        break;
      }
    }
  }

  struct Pending {
    cudaEvent_t event;
    Clock::time_point deadline;
    const char* op;
  };
  int device_;
  std::chrono::milliseconds timeout_;
  cudaStream_t stream_ = nullptr;       // qgrad's stream of the device
  cudaStream_t side_stream_ = nullptr;  // all_reduce_async's
  ncclComm_t comm_ = nullptr;
  std::mutex comm_mutex_;
  std::string error_;
  Tensor scratch_;
  std::thread watchdog_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Pending> pending_;
  std::vector<cudaEvent_t> free_events_;
  bool stopping_ = false;
};

}  // namespace

bool nccl_built() { return true; }
std::unique_ptr<Backend> make_nccl(const BackendArgs& args) { return std::make_unique<NcclBackend>(args); }

}  // namespace qgrad::dist::detail
