// Gloo (CPU tensors): one context per group, its full mesh of TCP pairs made
// through the group's store; the collectives are Gloo's (allreduce: ring,
// so every rank receives the same reduced bits; broadcast; allgather;
// barrier), each given the group's timeout.
#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <csignal>
#include <cstdlib>
#include <cstring>

#include "qgrad/core/half.h"
#include "qgrad/dist/backend.h"
#include "qgrad/dist/store.h"

namespace qgrad::dist::detail {

namespace {

// Gloo's rendezvous over qgrad's TcpStore, under a prefix.
class StoreAdapter : public ::gloo::rendezvous::Store {
 public:
  StoreAdapter(TcpStore& s, std::string prefix, std::chrono::milliseconds timeout)
      : s_(s), prefix_(std::move(prefix)), timeout_(timeout) {}
  void set(const std::string& key, const std::vector<char>& data) override { s_.set(prefix_ + key, data); }
  std::vector<char> get(const std::string& key) override { return s_.get(prefix_ + key, timeout_); }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    std::vector<std::string> k;
    for (const auto& key : keys) k.push_back(prefix_ + key);
    s_.wait(k, timeout);
  }

 private:
  TcpStore& s_;
  std::string prefix_;
  std::chrono::milliseconds timeout_;
};

// The local address the kernel routes to `peer` from (a UDP connect sends
// nothing): what Gloo listens on, reachable by every rank on any network
// (loopback, a veth pair between namespaces, a cluster). QGRAD_GLOO_HOST
// overrides it.
std::string local_address_towards(const std::string& peer) {
  if (const char* h = std::getenv("QGRAD_GLOO_HOST"); h && *h) return h;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  QGRAD_CHECK(::getaddrinfo(peer.c_str(), "9", &hints, &res) == 0 && res, "ProcessGroup", "MASTER_ADDR",
              "cannot resolve '", peer, "'");
  std::string out;
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
    sockaddr_in local{};
    socklen_t len = sizeof local;
    char buf[INET_ADDRSTRLEN] = {};
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0 &&
        ::inet_ntop(AF_INET, &local.sin_addr, buf, sizeof buf))
      out = buf;
  }
  if (fd >= 0) ::close(fd);
  ::freeaddrinfo(res);
  QGRAD_CHECK(!out.empty(), "ProcessGroup", "MASTER_ADDR", "no route to '", peer, "'");
  return out;
}

template <class T>
struct Reduce {
  using M = typename OpMath<T>::type;
  static void sum(void* c, const void* a, const void* b, std::size_t n) {
    auto* o = static_cast<T*>(c);
    auto* x = static_cast<const T*>(a);
    auto* y = static_cast<const T*>(b);
    for (std::size_t i = 0; i < n; ++i) o[i] = T(static_cast<M>(x[i]) + static_cast<M>(y[i]));
  }
  // NaN propagates (as torch.minimum / NCCL on floats do not promise; here
  // a NaN on any rank gives NaN on every rank).
  static void min(void* c, const void* a, const void* b, std::size_t n) {
    auto* o = static_cast<T*>(c);
    auto* x = static_cast<const T*>(a);
    auto* y = static_cast<const T*>(b);
    for (std::size_t i = 0; i < n; ++i) {
      const M u = static_cast<M>(x[i]), v = static_cast<M>(y[i]);
      o[i] = (u != u) ? x[i] : (v != v) ? y[i] : (v < u ? y[i] : x[i]);
    }
  }
  static void max(void* c, const void* a, const void* b, std::size_t n) {
    auto* o = static_cast<T*>(c);
    auto* x = static_cast<const T*>(a);
    auto* y = static_cast<const T*>(b);
    for (std::size_t i = 0; i < n; ++i) {
      const M u = static_cast<M>(x[i]), v = static_cast<M>(y[i]);
      o[i] = (u != u) ? x[i] : (v != v) ? y[i] : (v > u ? y[i] : x[i]);
    }
  }
};

template <class T>
void divide(T* p, std::size_t n, int world) {
  using M = typename OpMath<T>::type;
  for (std::size_t i = 0; i < n; ++i) p[i] = T(static_cast<M>(p[i]) / static_cast<M>(world));
}

template <class F>
void dispatch_comm(DType t, F&& f) {
  switch (t) {
    case DType::f32: f(float{}); break;
    case DType::f64: f(double{}); break;
    case DType::f16: f(half{}); break;
    case DType::bf16: f(bfloat16{}); break;
    case DType::s8: f(std::int8_t{}); break;
    case DType::u8: f(std::uint8_t{}); break;
    case DType::s32: f(std::int32_t{}); break;
    case DType::s64: f(std::int64_t{}); break;
    default: QGRAD_CHECK(false, "ProcessGroup", "dtype", "unsupported dtype ", dtype_name(t));
  }
}

class GlooBackend : public Backend {
 public:
  explicit GlooBackend(const BackendArgs& a) : world_(a.world_size), timeout_(a.timeout) {
    // gloo's TCP pairs write with writev, which raises SIGPIPE when a peer has
    // died: the default action would kill this rank before gloo could report
    // the broken pair as an error. Ignored (unless the program set a handler
    // of its own), the write fails with EPIPE and the collective throws.
    struct sigaction previous {};
    if (::sigaction(SIGPIPE, nullptr, &previous) == 0 && previous.sa_handler == SIG_DFL)
      std::signal(SIGPIPE, SIG_IGN);
    try {
      ::gloo::transport::tcp::attr attr;
      attr.hostname = local_address_towards(a.master_addr);
      auto dev = ::gloo::transport::tcp::CreateDevice(attr);
      auto ctx = std::make_shared<::gloo::rendezvous::Context>(a.rank, a.world_size);
      ctx->setTimeout(a.timeout);
      StoreAdapter store(*a.store, "gloo/", a.timeout);
      ctx->connectFullMesh(store, dev);
      // connectFullMesh returns once this rank's pairs are up, while a peer may
      // still be finishing its side of the handshake; a rank that then left at
      // once would fail that peer. The barrier returns only when every rank has
      // joined, so a group built on one rank is whole on all.
      ::gloo::BarrierOptions joined(ctx);
      joined.setTimeout(a.timeout);
      joined.setTag(next_tag());
      ::gloo::barrier(joined);
      ctx_ = std::move(ctx);
    } catch (const qgrad::Error&) {
      throw;
    } catch (const std::exception& e) {
      QGRAD_CHECK(false, "ProcessGroup", "gloo", "connecting the ranks failed: ", e.what());
    }
  }

  void all_reduce(const Tensor& t, ReduceOp op) override {
    run("all_reduce", [&] {
      dispatch_comm(t.dtype(), [&](auto tag) {
        using T = decltype(tag);
        T* p = static_cast<T*>(t.data_ptr());
        const auto n = static_cast<std::size_t>(t.numel());
        if (n == 0) return;
        ::gloo::AllreduceOptions o(ctx_);
        o.setOutput(p, n);
        o.setTimeout(timeout_);
        o.setTag(next_tag());
        if (op == ReduceOp::min) o.setReduceFunction(&Reduce<T>::min);
        else if (op == ReduceOp::max) o.setReduceFunction(&Reduce<T>::max);
        else o.setReduceFunction(&Reduce<T>::sum);
        ::gloo::allreduce(o);
        if (op == ReduceOp::avg) divide(p, n, world_);
      });
    });
  }

  void broadcast(const Tensor& t, int root) override {
    run("broadcast", [&] {
      const std::size_t n = t.nbytes();
      if (n == 0) return;
      ::gloo::BroadcastOptions o(ctx_);
      o.setOutput(static_cast<char*>(t.data_ptr()), n);
      o.setRoot(root);
      o.setTimeout(timeout_);
      o.setTag(next_tag());
      ::gloo::broadcast(o);
    });
  }

  void all_gather(const Tensor& out, const Tensor& t) override {
    run("all_gather", [&] {
      const std::size_t n = t.nbytes();
      if (n == 0) return;
      ::gloo::AllgatherOptions o(ctx_);
      o.setInput(static_cast<char*>(t.data_ptr()), n);
      o.setOutput(static_cast<char*>(out.data_ptr()), n * static_cast<std::size_t>(world_));
      o.setTimeout(timeout_);
      o.setTag(next_tag());
      ::gloo::allgather(o);
    });
  }

  void barrier() override {
    run("barrier", [&] {
      ::gloo::BarrierOptions o(ctx_);
      o.setTimeout(timeout_);
      o.setTag(next_tag());
      ::gloo::barrier(o);
    });
  }

 private:
  template <class F>
  void run(const char* op, F&& f) {
    try {
      f();
    } catch (const qgrad::Error&) {
      throw;
    } catch (const std::exception& e) {
      QGRAD_CHECK(false, op, "gloo", "failed (a peer died, or did not reach this collective within ",
                  timeout_.count(), " ms): ", e.what());
    }
  }
  std::uint32_t next_tag() { return tag_++; }

  std::shared_ptr<::gloo::Context> ctx_;
  int world_;
  std::chrono::milliseconds timeout_;
  std::uint32_t tag_ = 0;
};

}  // namespace

bool gloo_built() { return true; }
std::unique_ptr<Backend> make_gloo(const BackendArgs& args) { return std::make_unique<GlooBackend>(args); }

}  // namespace qgrad::dist::detail
