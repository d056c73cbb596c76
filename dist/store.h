// A minimal TCP key-value store for rendezvous, as torchrun's TCPStore: the
// process that is `server` (rank 0) listens on MASTER_ADDR:MASTER_PORT and
// serves keys from a thread; every process (the server's too) talks to it
// as a client over one socket. It carries only bootstrap data (Gloo's peer
// addresses, the ncclUniqueId); the collectives never go through it.
//
// Every call that waits (get, wait, connecting) gives up after the timeout
// with a qgrad::Error naming the store and the key.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace qgrad::dist {

class TcpStore {
 public:
  // server: bind and listen on `port` (all interfaces) before connecting.
  // Clients retry connecting until `timeout`.
  TcpStore(const std::string& host, int port, bool server, std::chrono::milliseconds timeout);
  ~TcpStore();
  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

  void set(const std::string& key, const std::vector<char>& value);
  // Waits until the key is set (or the timeout passes).
  std::vector<char> get(const std::string& key);
  std::vector<char> get(const std::string& key, std::chrono::milliseconds timeout);
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
  // Atomically adds delta to an integer key (absent: 0) and returns the sum.
  std::int64_t add(const std::string& key, std::int64_t delta);

  std::chrono::milliseconds timeout() const { return timeout_; }
  // The port the server listens on (useful with port 0: any free port).
  int port() const { return port_; }

 private:
  struct Server;
  std::vector<char> request(char cmd, const std::string& key, const std::vector<char>& value,
                            std::chrono::milliseconds timeout);
  std::unique_ptr<Server> server_;
  int fd_ = -1;
  int port_ = 0;
  std::chrono::milliseconds timeout_;
};

}  // namespace qgrad::dist
