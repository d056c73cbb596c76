#include "qgrad/dist/process_group.h"

#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>

#include "qgrad/dist/backend.h"
#include "qgrad/dist/store.h"

namespace qgrad::dist {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::avg: return "avg";
    case ReduceOp::min: return "min";
    case ReduceOp::max: return "max";
  }
  return "?";
}

bool gloo_available() { return detail::gloo_built(); }
bool nccl_available() { return detail::nccl_built(); }
const char* backend_for(Device device) {
  if (device.is_cpu()) return gloo_available() ? "gloo" : "";
  return nccl_available() ? "nccl" : "";
}

namespace {
bool supported(DType t) {
  switch (t) {
    case DType::f32: case DType::f64: case DType::f16: case DType::bf16:
    case DType::s8: case DType::u8: case DType::s32: case DType::s64: return true;
    default: return false;
  }
}

long env_long(const char* name, long fallback, const char* what) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  QGRAD_CHECK(end && *end == '\0', "ProcessGroup::from_env", name, "expected ", what, ", got '", v, "'");
  return x;
}

// A CPU collective running on the group's worker thread.
class FutureWork : public Work {
 public:
  explicit FutureWork(std::shared_future<void> f) : f_(std::move(f)) {}
  void wait() override { f_.get(); }

 private:
  std::shared_future<void> f_;
};

// A collective already ordered on qgrad's stream when returned.
class DoneWork : public Work {
 public:
  void wait() override {}
};
}  // namespace

struct ProcessGroup::Impl {
  int rank = 0, world = 1, local_rank = 0;
  ProcessGroupOptions options;
  std::string master_addr;
  std::unique_ptr<TcpStore> store;
  std::unique_ptr<detail::Backend> gloo;
  std::unique_ptr<detail::Backend> nccl;
  int nccl_device = -1;
  std::mutex error_mutex;
  std::string error;  // the first failure; the group is unusable after it

  // The worker thread: every Gloo call runs here, in submission order (the
  // ranks must issue collectives in one order; one thread keeps it).
  std::thread worker;
  std::mutex mutex;
  std::condition_variable cv;
  std::deque<std::packaged_task<void()>> queue;
  bool stopping = false;

  void run_worker() {
    for (;;) {
      std::packaged_task<void()> task;
      {
        std::unique_lock<std::mutex> lock(mutex);
        cv.wait(lock, [&] { return stopping || !queue.empty(); });
        if (queue.empty()) return;
        task = std::move(queue.front());
        queue.pop_front();
      }
      task();
    }
  }

  void check_usable(const char* op) {
    std::lock_guard<std::mutex> lock(error_mutex);
    QGRAD_CHECK(error.empty(), op, "group", "the process group is unusable after an earlier error: ", error);
  }

  // Runs f, recording the first error.
  void guarded(const std::function<void()>& f) {
    try {
      f();
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (error.empty()) error = e.what();
      throw;
    }
  }

  std::shared_future<void> submit_cpu(std::function<void()> f) {
    std::packaged_task<void()> task([this, f = std::move(f)] { guarded(f); });
    std::shared_future<void> fut = task.get_future().share();
    {
      std::lock_guard<std::mutex> lock(mutex);
      queue.push_back(std::move(task));
    }
    cv.notify_one();
    return fut;
  }

  detail::Backend& cuda_backend(const char* op, const Tensor& t) {
    const int dev = t.device().index;
    if (!nccl) {
      detail::BackendArgs a{store.get(), rank, world, dev, options.timeout, master_addr};
      guarded([&] { nccl = detail::make_nccl(a); });
      nccl_device = dev;
    }
    QGRAD_CHECK(dev == nccl_device, op, "tensor", "the group's NCCL communicator is on cuda:", nccl_device,
                ", the tensor on ", t.device().str(), " (one device per rank)");
    return *nccl;
  }

  void check_all_reduce(const Tensor& t, ReduceOp op) {
    const char* name = "all_reduce";
    check_tensor(name, "tensor", t);
    QGRAD_CHECK(op != ReduceOp::avg || is_floating(t.dtype()), name, "op",
                "avg needs a floating tensor, got ", dtype_name(t.dtype()));
    check_usable(name);
  }

  void check_tensor(const char* op, const char* name, const Tensor& t) {
    QGRAD_CHECK(t.defined(), op, name, "undefined tensor");
    QGRAD_CHECK(supported(t.dtype()), op, name, "dtype ", dtype_name(t.dtype()),
                " is not supported (f32, f64, f16, bf16, s8, u8, s32, s64)");
    if (t.device().is_cpu()) {
      QGRAD_CHECK(detail::gloo_built(), op, name,
                  "a CPU tensor needs Gloo, and this build has none (install libgloo-dev and reconfigure)");
      QGRAD_CHECK(gloo != nullptr, op, name, "the group has no Gloo context");
    } else {
      QGRAD_CHECK(detail::nccl_built(), op, name,
                  "a CUDA tensor needs NCCL, and this build has none (configure with QGRAD_NCCL_ROOT or the "
                  "CUDA toolkit's NCCL)");
    }
  }
};

ProcessGroup::ProcessGroup(int rank, int world_size, const std::string& master_addr, int master_port,
                           ProcessGroupOptions options, int local_rank)
    : impl_(std::make_unique<Impl>()) {
  const char* op = "ProcessGroup";
  QGRAD_CHECK(world_size >= 1, op, "world_size", "must be >= 1, got ", world_size);
  QGRAD_CHECK(rank >= 0 && rank < world_size, op, "rank", "must be in [0, ", world_size, "), got ", rank);
  QGRAD_CHECK(options.timeout.count() > 0, op, "timeout", "must be positive");
  QGRAD_CHECK(!master_addr.empty(), op, "master_addr", "empty");
  QGRAD_CHECK(master_port >= 0 && master_port < 65536, op, "master_port", "must be in [0, 65535], got ",
              master_port);
  Impl& m = *impl_;
  m.rank = rank;
  m.world = world_size;
  m.local_rank = local_rank < 0 ? rank : local_rank;
  m.options = options;
  m.master_addr = master_addr;
  m.store = std::make_unique<TcpStore>(master_addr, master_port, rank == 0, options.timeout);
  // Every rank checks in and waits for all the others (a rendezvous that
  // also catches a missing rank when the build has no Gloo).
  m.store->set("qgrad/rank/" + std::to_string(rank), {'1'});
  std::vector<std::string> keys;
  for (int r = 0; r < world_size; ++r) keys.push_back("qgrad/rank/" + std::to_string(r));
  try {
    m.store->wait(keys, options.timeout);
  } catch (const Error& e) {
    QGRAD_CHECK(false, op, "world_size", "not every one of the ", world_size, " ranks joined within ",
                options.timeout.count(), " ms (", e.what(), ")");
  }
  if (detail::gloo_built()) {
    detail::BackendArgs a{m.store.get(), rank, world_size, -1, options.timeout, master_addr};
    m.gloo = detail::make_gloo(a);
  }
  m.worker = std::thread([&m] { m.run_worker(); });
}

ProcessGroup::~ProcessGroup() {
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->stopping = true;
  }
  impl_->cv.notify_one();
  if (impl_->worker.joinable()) impl_->worker.join();
  impl_->nccl.reset();
  impl_->gloo.reset();
  // Rank 0 serves the store: wait (bounded) until the others are done with
  // it, so that a peer still reading a key does not see it vanish.
  if (!impl_->error.empty()) return;  // a peer failed: nobody to wait for
  try {
    impl_->store->add("qgrad/left", 1);
    if (impl_->rank == 0) {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (impl_->store->add("qgrad/left", 0) < impl_->world && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  } catch (const std::exception&) {
    // A peer or the store is gone: nothing to wait for.
  }
}

bool ProcessGroup::env_is_distributed() {
  const char* w = std::getenv("WORLD_SIZE");
  return w && std::atol(w) > 1;
}

std::shared_ptr<ProcessGroup> ProcessGroup::from_env(ProcessGroupOptions options) {
  const char* op = "ProcessGroup::from_env";
  const char* r = std::getenv("RANK");
  const char* w = std::getenv("WORLD_SIZE");
  QGRAD_CHECK(r && w, op, "RANK", "RANK and WORLD_SIZE must be set (start the program with qgrad-run or torchrun)");
  const int rank = static_cast<int>(env_long("RANK", 0, "an integer"));
  const int world = static_cast<int>(env_long("WORLD_SIZE", 1, "an integer"));
  const int local = static_cast<int>(env_long("LOCAL_RANK", rank, "an integer"));
  const char* addr = std::getenv("MASTER_ADDR");
  const int port = static_cast<int>(env_long("MASTER_PORT", 29500, "a port number"));
  const long t = env_long("QGRAD_DIST_TIMEOUT_MS", static_cast<long>(options.timeout.count()), "milliseconds");
  options.timeout = std::chrono::milliseconds(t);
  return std::make_shared<ProcessGroup>(rank, world, addr && *addr ? addr : "127.0.0.1", port, options, local);
}

int ProcessGroup::rank() const { return impl_->rank; }
int ProcessGroup::world_size() const { return impl_->world; }
int ProcessGroup::local_rank() const { return impl_->local_rank; }
std::chrono::milliseconds ProcessGroup::timeout() const { return impl_->options.timeout; }
TcpStore& ProcessGroup::store() { return *impl_->store; }

std::shared_ptr<Work> ProcessGroup::all_reduce_async(const Tensor& t, ReduceOp op) {
  Impl& m = *impl_;
  m.check_all_reduce(t, op);
  if (t.device().is_cpu()) {
    detail::Backend* b = m.gloo.get();
    return std::make_shared<FutureWork>(m.submit_cpu([b, t, op] { b->all_reduce(t, op); }));
  }
  detail::Backend& b = m.cuda_backend("all_reduce", t);
  std::shared_ptr<Work> work;
  m.guarded([&] { work = b.all_reduce_async(t, op); });
  if (!work) return std::make_shared<DoneWork>();
  return work;
}

void ProcessGroup::all_reduce(const Tensor& t, ReduceOp op) {
  Impl& m = *impl_;
  if (t.device().is_cpu()) {
    all_reduce_async(t, op)->wait();
    return;
  }
  // CUDA: on qgrad's stream itself (no side stream to fork and join).
  m.check_all_reduce(t, op);
  detail::Backend& b = m.cuda_backend("all_reduce", t);
  m.guarded([&] { b.all_reduce(t, op); });
}

void ProcessGroup::broadcast(const Tensor& t, int root) {
  const char* name = "broadcast";
  Impl& m = *impl_;
  m.check_tensor(name, "tensor", t);
  QGRAD_CHECK(root >= 0 && root < m.world, name, "root", "must be in [0, ", m.world, "), got ", root);
  m.check_usable(name);
  if (t.device().is_cpu()) {
    detail::Backend* b = m.gloo.get();
    m.submit_cpu([b, t, root] { b->broadcast(t, root); }).get();
    return;
  }
  detail::Backend& b = m.cuda_backend(name, t);
  m.guarded([&] { b.broadcast(t, root); });
}

void ProcessGroup::all_gather(const Tensor& out, const Tensor& t) {
  const char* name = "all_gather";
  Impl& m = *impl_;
  m.check_tensor(name, "tensor", t);
  m.check_tensor(name, "out", out);
  Shape want{static_cast<std::int64_t>(m.world)};
  for (std::int64_t d : t.shape()) want.push_back(d);
  QGRAD_CHECK(out.shape() == want && out.dtype() == t.dtype() && out.device() == t.device(), name, "out",
              "expected ", dtype_name(t.dtype()), " ", shape_str(want), " on ", t.device().str(), ", got ",
              dtype_name(out.dtype()), " ", shape_str(out.shape()), " on ", out.device().str());
  QGRAD_CHECK(out.data_ptr() != t.data_ptr() || t.numel() == 0, name, "out", "must not alias the input");
  m.check_usable(name);
  if (t.device().is_cpu()) {
    detail::Backend* b = m.gloo.get();
    m.submit_cpu([b, out, t] { b->all_gather(out, t); }).get();
    return;
  }
  detail::Backend& b = m.cuda_backend(name, t);
  m.guarded([&] { b.all_gather(out, t); });
}

Tensor ProcessGroup::all_gather(const Tensor& t) {
  impl_->check_tensor("all_gather", "tensor", t);
  Shape s{static_cast<std::int64_t>(impl_->world)};
  for (std::int64_t d : t.shape()) s.push_back(d);
  Tensor out = Tensor::empty(s, TensorOptions{}.with_dtype(t.dtype()).with_device(t.device()));
  all_gather(out, t);
  return out;
}

void ProcessGroup::barrier(Device device) {
  const char* name = "barrier";
  Impl& m = *impl_;
  if (device.is_cpu()) {
    QGRAD_CHECK(m.gloo != nullptr, name, "device", "a CPU barrier needs Gloo, and this build has none");
    m.check_usable(name);
    detail::Backend* b = m.gloo.get();
    m.submit_cpu([b] { b->barrier(); }).get();
    return;
  }
  QGRAD_CHECK(detail::nccl_built(), name, "device", "a CUDA barrier needs NCCL, and this build has none");
  m.check_usable(name);
  Tensor probe = Tensor::empty({1}, TensorOptions{}.with_device(device));
  detail::Backend& b = m.cuda_backend(name, probe);
  m.guarded([&] { b.barrier(); });
}

}  // namespace qgrad::dist
