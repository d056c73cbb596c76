// qgrad-run: starts the local ranks of a distributed job, as torchrun does.
//
//   qgrad-run --nproc-per-node N [--nnodes M --node-rank K --master-addr A --master-port P] PROGRAM ARGS...
//
// Each of the N children runs PROGRAM ARGS... with RANK (K*N + i),
// LOCAL_RANK (i), WORLD_SIZE (M*N), LOCAL_WORLD_SIZE (N), MASTER_ADDR and
// MASTER_PORT set. SIGINT, SIGTERM and SIGHUP are forwarded to every child.
// When a child fails (non-zero exit, or killed by a signal), the others get
// SIGTERM, then SIGKILL after --grace seconds, and qgrad-run exits with the
// first failure's code (128 + signal for a signal); otherwise it exits 0
// once all have. On one node without --master-port it picks a free port.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace {

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 29500;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  int port = 29500;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

int exit_code(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"qgrad-run: start the local ranks of a distributed qgrad program (as torchrun)"};
  int nproc = 1, nnodes = 1, node_rank = 0, port = -1;
  double grace = 5.0;
  std::string addr = "127.0.0.1";
  app.add_option("--nproc-per-node", nproc, "processes (ranks) on this node")->required()->check(CLI::Range(1, 4096));
  app.add_option("--nnodes", nnodes, "nodes in the job")->check(CLI::Range(1, 65536));
  app.add_option("--node-rank", node_rank, "this node's index in [0, nnodes)")->check(CLI::NonNegativeNumber);
  app.add_option("--master-addr", addr, "address of rank 0's node (its store)");
  app.add_option("--master-port", port, "port of rank 0's store (default: a free port on one node, else 29500)")
      ->check(CLI::Range(1, 65535));
  app.add_option("--grace", grace, "seconds between SIGTERM and SIGKILL when stopping the others")
      ->check(CLI::NonNegativeNumber);
  app.prefix_command();
  app.footer("Everything from PROGRAM on is passed to the program unchanged.");
  CLI11_PARSE(app, argc, argv);
  std::vector<std::string> cmd = app.remaining();
  if (cmd.empty()) {
    std::fprintf(stderr, "qgrad-run: no PROGRAM given\n%s", app.help().c_str());
    return 2;
  }
  if (node_rank >= nnodes) {
    std::fprintf(stderr, "qgrad-run: --node-rank %d must be < --nnodes %d\n", node_rank, nnodes);
    return 2;
  }
  if (port < 0) port = nnodes == 1 ? free_port() : 29500;

  // Signals are taken synchronously (sigtimedwait); children get the old mask.
  sigset_t mask, old;
  sigemptyset(&mask);
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGCHLD}) sigaddset(&mask, s);
  sigprocmask(SIG_BLOCK, &mask, &old);

  const int world = nnodes * nproc;
  std::vector<pid_t> pids(static_cast<std::size_t>(nproc), -1);
  std::vector<char*> args;
  for (std::string& s : cmd) args.push_back(s.data());
  args.push_back(nullptr);
  for (int i = 0; i < nproc; ++i) {
    const pid_t pid = ::fork();
    if (pid < 0) {
      std::perror("qgrad-run: fork");
      for (pid_t p : pids)
        if (p > 0) ::kill(p, SIGKILL);
      return 1;
    }
    if (pid == 0) {
      sigprocmask(SIG_SETMASK, &old, nullptr);
      ::setenv("RANK", std::to_string(node_rank * nproc + i).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(i).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
      ::setenv("LOCAL_WORLD_SIZE", std::to_string(nproc).c_str(), 1);
      ::setenv("GROUP_RANK", std::to_string(node_rank).c_str(), 1);
      ::setenv("MASTER_ADDR", addr.c_str(), 1);
      ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      ::execvp(args[0], args.data());
      std::fprintf(stderr, "qgrad-run: cannot run '%s': %s\n", args[0], std::strerror(errno));
      std::_Exit(127);
    }
    pids[static_cast<std::size_t>(i)] = pid;
  }

  int alive = nproc, first_failure = 0;
  bool stopping = false;
  auto stop_deadline = std::chrono::steady_clock::now();
  const auto grace_ms = std::chrono::milliseconds(static_cast<long long>(grace * 1000));
  auto signal_all = [&](int sig) {
    for (pid_t p : pids)
      if (p > 0) ::kill(p, sig);
  };
  while (alive > 0) {
    timespec tick{0, 100 * 1000 * 1000};
    const int sig = sigtimedwait(&mask, nullptr, &tick);
    if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP) {
      signal_all(sig);
      if (!stopping) {
        stopping = true;
        stop_deadline = std::chrono::steady_clock::now() + grace_ms;
        if (first_failure == 0) first_failure = 128 + sig;
      }
    }
    int status = 0;
    pid_t done;
    while ((done = ::waitpid(-1, &status, WNOHANG)) > 0) {
      for (std::size_t i = 0; i < pids.size(); ++i) {
        if (pids[i] != done) continue;
        pids[i] = -1;
        --alive;
        const int code = exit_code(status);
        if (code != 0 && first_failure == 0) {
          first_failure = code;
          std::fprintf(stderr, "qgrad-run: local rank %zu (rank %d) exited with code %d; stopping the others\n", i,
                       node_rank * nproc + static_cast<int>(i), code);
          signal_all(SIGTERM);
          stopping = true;
          stop_deadline = std::chrono::steady_clock::now() + grace_ms;
        }
      }
    }
    if (stopping && alive > 0 && std::chrono::steady_clock::now() > stop_deadline) signal_all(SIGKILL);
  }
  return first_failure;
}
