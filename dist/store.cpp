#include "qgrad/dist/store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "qgrad/core/error.h"

namespace qgrad::dist {

namespace {
using Clock = std::chrono::steady_clock;
constexpr char kSet = 'S', kGet = 'G', kWait = 'W', kAdd = 'A';
const char* kOp = "TcpStore";

int remaining_ms(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left < 0 ? 0 : static_cast<int>(std::min<long long>(left, 1 << 30));
}

enum class Read { ok, timeout, closed };

// Reads exactly n bytes before the deadline.
Read read_all(int fd, void* buf, std::size_t n, Clock::time_point deadline) {
  char* p = static_cast<char*>(buf);
  while (n > 0) {
    pollfd pfd{fd, POLLIN, 0};
    const int r = ::poll(&pfd, 1, remaining_ms(deadline));
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) return Read::timeout;
    if (r < 0) return Read::closed;
    const ssize_t got = ::recv(fd, p, n, 0);
    if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (got <= 0) return Read::closed;
    p += got;
    n -= static_cast<std::size_t>(got);
  }
  return Read::ok;
}

bool write_all(int fd, const void* buf, std::size_t n) {
  const char* p = static_cast<const char*>(buf);
  while (n > 0) {
    const ssize_t put = ::send(fd, p, n, MSG_NOSIGNAL);
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) return false;
    p += put;
    n -= static_cast<std::size_t>(put);
  }
  return true;
}

void append_u32(std::vector<char>& out, std::uint32_t v) {
  const char* b = reinterpret_cast<const char*>(&v);
  out.insert(out.end(), b, b + 4);
}

std::vector<char> frame(const std::vector<char>& payload) {
  std::vector<char> out;
  append_u32(out, static_cast<std::uint32_t>(payload.size()));
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}
}  // namespace

// The server: one thread polling the listening socket, a wake-up pipe and
// every client; a GET or WAIT of a missing key is parked until a SET.
struct TcpStore::Server {
  int listen_fd = -1;
  int wake[2] = {-1, -1};
  std::thread thread;
  std::map<std::string, std::vector<char>> data;
  struct Conn {
    int fd;
    std::vector<char> in;  // bytes received, not yet a whole request
  };
  std::vector<Conn> conns;
  std::vector<std::tuple<int, char, std::string>> parked;  // fd, GET/WAIT, key

  void reply(int fd, const std::vector<char>& payload) { (void)write_all(fd, frame(payload).data(), payload.size() + 4); }

  void answer(int fd, char cmd, const std::string& key, const std::vector<char>& value) {
    if (cmd == kSet) {
      data[key] = value;
      reply(fd, {});
      for (auto it = parked.begin(); it != parked.end();) {
        if (std::get<2>(*it) == key) {
          reply(std::get<0>(*it), std::get<1>(*it) == kGet ? value : std::vector<char>{});
          it = parked.erase(it);
        } else {
          ++it;
        }
      }
    } else if (cmd == kGet || cmd == kWait) {
      auto it = data.find(key);
      if (it == data.end()) parked.emplace_back(fd, cmd, key);
      else reply(fd, cmd == kGet ? it->second : std::vector<char>{});
    }
  }

  // Parses whole requests out of c.in; false when the client sent garbage.
  bool consume(Conn& c) {
    for (;;) {
      if (c.in.size() < 5) return true;
      std::uint32_t klen = 0, vlen = 0;
      std::memcpy(&klen, c.in.data() + 1, 4);
      if (klen > (1u << 20)) return false;
      if (c.in.size() < 9 + klen) return true;
      std::memcpy(&vlen, c.in.data() + 5 + klen, 4);
      if (vlen > (1u << 30)) return false;
      const std::size_t total = 9 + klen + vlen;
      if (c.in.size() < total) return true;
      const char cmd = c.in[0];
      std::string key(c.in.data() + 5, klen);
      std::vector<char> value(c.in.begin() + 9 + klen, c.in.begin() + static_cast<std::ptrdiff_t>(total));
      c.in.erase(c.in.begin(), c.in.begin() + static_cast<std::ptrdiff_t>(total));
      if (cmd == kAdd) {
        // ADD stores and replies with the sum, and wakes waiters on the key.
        std::int64_t delta = 0, sum = 0;
        std::memcpy(&delta, value.data(), std::min<std::size_t>(8, value.size()));
        auto it = data.find(key);
        if (it != data.end() && it->second.size() == 8) std::memcpy(&sum, it->second.data(), 8);
        sum += delta;
        std::vector<char> out(8);
        std::memcpy(out.data(), &sum, 8);
        data[key] = out;
        reply(c.fd, out);
        for (auto it2 = parked.begin(); it2 != parked.end();) {
          if (std::get<2>(*it2) == key) {
            reply(std::get<0>(*it2), std::get<1>(*it2) == kGet ? out : std::vector<char>{});
            it2 = parked.erase(it2);
          } else {
            ++it2;
          }
        }
      } else if (cmd == kSet || cmd == kGet || cmd == kWait) {
        answer(c.fd, cmd, key, value);
      } else {
        return false;
      }
    }
  }

  void drop(std::size_t i) {
    const int fd = conns[i].fd;
    for (auto it = parked.begin(); it != parked.end();) it = std::get<0>(*it) == fd ? parked.erase(it) : it + 1;
    ::close(fd);
    conns.erase(conns.begin() + static_cast<std::ptrdiff_t>(i));
  }

  void run() {
    std::vector<char> buf(1 << 16);
    for (;;) {
      std::vector<pollfd> pfds{{wake[0], POLLIN, 0}, {listen_fd, POLLIN, 0}};
      for (const Conn& c : conns) pfds.push_back({c.fd, POLLIN, 0});
      const int r = ::poll(pfds.data(), pfds.size(), -1);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) return;
      if (pfds[0].revents) return;  // shutting down
      if (pfds[1].revents & POLLIN) {
        const int fd = ::accept(listen_fd, nullptr, nullptr);
        if (fd >= 0) {
          int one = 1;
          ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
          conns.push_back({fd, {}});
        }
      }
      for (std::size_t i = pfds.size(); i-- > 2;) {
        if (!pfds[i].revents) continue;
        const std::size_t ci = i - 2;
        const ssize_t got = ::recv(conns[ci].fd, buf.data(), buf.size(), 0);
        if (got <= 0) {
          if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
          drop(ci);
          continue;
        }
        conns[ci].in.insert(conns[ci].in.end(), buf.begin(), buf.begin() + got);
        if (!consume(conns[ci])) drop(ci);
      }
    }
  }

  ~Server() {
    if (wake[1] >= 0) {
      const char b = 1;
      (void)!::write(wake[1], &b, 1);
    }
    if (thread.joinable()) thread.join();
    for (const Conn& c : conns) ::close(c.fd);
    for (int fd : {listen_fd, wake[0], wake[1]})
      if (fd >= 0) ::close(fd);
  }
};

TcpStore::TcpStore(const std::string& host, int port, bool server, std::chrono::milliseconds timeout)
    : port_(port), timeout_(timeout) {
  QGRAD_CHECK(port >= 0 && port < 65536, kOp, "port", "must be in [0, 65535], got ", port);
  QGRAD_CHECK(timeout.count() > 0, kOp, "timeout", "must be positive");
  if (server) {
    auto s = std::make_unique<Server>();
    s->listen_fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    QGRAD_CHECK(s->listen_fd >= 0, kOp, "socket", std::strerror(errno));
    int one = 1;
    ::setsockopt(s->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    addr.sin_port = htons(static_cast<std::uint16_t>(port));
    QGRAD_CHECK(::bind(s->listen_fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0, kOp, "MASTER_PORT",
                "cannot listen on port ", port, ": ", std::strerror(errno));
    QGRAD_CHECK(::listen(s->listen_fd, 1024) == 0, kOp, "MASTER_PORT", "listen: ", std::strerror(errno));
    socklen_t len = sizeof addr;
    ::getsockname(s->listen_fd, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    QGRAD_CHECK(::pipe2(s->wake, O_CLOEXEC) == 0, kOp, "pipe", std::strerror(errno));
    Server* raw = s.get();
    s->thread = std::thread([raw] { raw->run(); });
    server_ = std::move(s);
  }
  // Connect (the server's own process too), retrying until the deadline:
  // the server may not be up yet.
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  const auto deadline = Clock::now() + timeout;
  std::string last_error = "no attempt";
  while (fd_ < 0) {
    addrinfo* res = nullptr;
    const int gai = ::getaddrinfo(host.c_str(), std::to_string(port_).c_str(), &hints, &res);
    if (gai != 0) {
      last_error = ::gai_strerror(gai);
    } else {
      for (addrinfo* a = res; a && fd_ < 0; a = a->ai_next) {
        const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) continue;
        if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
          fd_ = fd;
        } else {
          last_error = std::strerror(errno);
          ::close(fd);
        }
      }
      ::freeaddrinfo(res);
    }
    if (fd_ >= 0) break;
    QGRAD_CHECK(Clock::now() < deadline, kOp, "MASTER_ADDR", "could not reach the store at ", host, ":", port_,
                " within ", timeout.count(), " ms (", last_error, ")");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  int one = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

TcpStore::~TcpStore() {
  if (fd_ >= 0) ::close(fd_);
}

std::vector<char> TcpStore::request(char cmd, const std::string& key, const std::vector<char>& value,
                                    std::chrono::milliseconds timeout) {
  std::vector<char> msg{cmd};
  append_u32(msg, static_cast<std::uint32_t>(key.size()));
  msg.insert(msg.end(), key.begin(), key.end());
  append_u32(msg, static_cast<std::uint32_t>(value.size()));
  msg.insert(msg.end(), value.begin(), value.end());
  QGRAD_CHECK(write_all(fd_, msg.data(), msg.size()), kOp, key, "the store (rank 0) is gone: ",
              std::strerror(errno));
  const auto deadline = Clock::now() + timeout;
  std::uint32_t len = 0;
  const Read r = read_all(fd_, &len, 4, deadline);
  if (r != Read::ok) {
    // A late reply would desynchronise the socket: this store is done.
    ::close(fd_);
    fd_ = -1;
    QGRAD_CHECK(false, kOp, key,
                r == Read::timeout ? "timed out after " + std::to_string(timeout.count()) +
                                         " ms waiting for the key (a peer did not join or died)"
                                   : std::string("the store (rank 0) is gone (its process exited or died)"));
  }
  std::vector<char> out(len);
  QGRAD_CHECK(read_all(fd_, out.data(), len, deadline) == Read::ok, kOp, key, "the store (rank 0) closed mid-reply");
  return out;
}

void TcpStore::set(const std::string& key, const std::vector<char>& value) {
  QGRAD_CHECK(fd_ >= 0, kOp, key, "the store is closed after an earlier error");
  (void)request(kSet, key, value, timeout_);
}

std::vector<char> TcpStore::get(const std::string& key) { return get(key, timeout_); }

std::vector<char> TcpStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  QGRAD_CHECK(fd_ >= 0, kOp, key, "the store is closed after an earlier error");
  return request(kGet, key, {}, timeout);
}

void TcpStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (const std::string& k : keys) {
    QGRAD_CHECK(fd_ >= 0, kOp, k, "the store is closed after an earlier error");
    (void)request(kWait, k, {}, std::chrono::milliseconds(std::max(1, remaining_ms(deadline))));
  }
}

std::int64_t TcpStore::add(const std::string& key, std::int64_t delta) {
  QGRAD_CHECK(fd_ >= 0, kOp, key, "the store is closed after an earlier error");
  std::vector<char> v(8);
  std::memcpy(v.data(), &delta, 8);
  const std::vector<char> out = request(kAdd, key, v, timeout_);
  std::int64_t sum = 0;
  QGRAD_CHECK(out.size() == 8, kOp, key, "bad reply to add");
  std::memcpy(&sum, out.data(), 8);
  return sum;
}

}  // namespace qgrad::dist
