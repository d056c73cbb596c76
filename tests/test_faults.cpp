// Faults while saving checkpoints (CPU): a child process saving a 32 MB
// checkpoint in a loop is killed with SIGKILL at random (seeded) moments,
// hundreds of times; after every kill the checkpoint on disk must be
// byte-identical to one of the two versions being written (and loadable),
// and at most one temporary file (the killed writer's, removed by the next
// save) may be left. Unwritable targets and a full disk (RLIMIT_FSIZE)
// must give a qgrad::Error and leave the previous checkpoint intact.
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <utility>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "helpers.h"
#include "qgrad/nn/nn.h"

using namespace qgrad;
namespace fs = std::filesystem;

namespace {

// A scratch directory, on tmpfs when there is one (the test is about
// process kills, not the disk; tmpfs keeps 200+ 32 MB saves fast).
struct ScratchDir {
  fs::path path;
  ScratchDir() {
    std::string t = (fs::is_directory("/dev/shm") && ::access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
    t += "/qgrad_faults_XXXXXX";
    path = ::mkdtemp(t.data());
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Size and hash of a file's bytes (keeps the parent small: it forks 200+ times).
std::pair<std::size_t, std::size_t> digest(const fs::path& p) {
  const std::string b = read_bytes(p);
  return {b.size(), std::hash<std::string>{}(b)};
}

int count_temps(const fs::path& dir, const std::string& target_name) {
  int n = 0;
  const std::string prefix = "." + target_name + ".tmp.";
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind(prefix, 0) == 0) ++n;
  return n;
}

// Two versions of a 32 MB state (f32 [8M] plus a small tensor).
nn::NamedTensors version(int v) {
  Generator g(100 + static_cast<std::uint64_t>(v));
  return {{"big", rand({8 << 20}, g)}, {"small", full({3}, v)}};
}

}  // namespace

TEST_CASE("faults: SIGKILL during checkpoint saves never leaves a torn or missing checkpoint") {
  ScratchDir dir;
  const fs::path target = dir.path / "ckpt.safetensors";
  const nn::NamedTensors va = version(1), vb = version(2);
  // The exact bytes of each version, for comparison.
  nn::save_safetensors((dir.path / "a").string(), va, {{"v", "a"}});
  nn::save_safetensors((dir.path / "b").string(), vb, {{"v", "b"}});
  const auto bytes_a = digest(dir.path / "a"), bytes_b = digest(dir.path / "b");
  fs::remove(dir.path / "a");
  fs::remove(dir.path / "b");
  REQUIRE(bytes_a.first > (32u << 20));
  REQUIRE(bytes_a != bytes_b);
  nn::save_safetensors(target.string(), va, {{"v", "a"}});

  // How long one save takes: kill moments are drawn from [0, 1.5 x that].
  const auto t0 = std::chrono::steady_clock::now();
  nn::save_safetensors(target.string(), va, {{"v", "a"}});
  const double save_us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  std::mt19937_64 rng(20240607);
  std::uniform_real_distribution<double> delay(0.0, 1.5 * save_us);

  const int kKills = 200;
  int kills = 0, saw_a = 0, saw_b = 0, max_temps = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kKills; ++i) {
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      // Child: alternate the two versions until killed; never returns
      // into doctest (an error exits with status 1, which fails the check below).
      try {
        for (int k = 0;; ++k) {
          const bool a = (k + i) % 2 == 0;
          nn::save_safetensors(target.string(), a ? va : vb, {{"v", a ? "a" : "b"}});
        }
      } catch (...) {
      }
      ::_exit(1);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(static_cast<long>(delay(rng))));
    REQUIRE(::kill(pid, SIGKILL) == 0);
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    REQUIRE(WIFSIGNALED(status));
    REQUIRE(WTERMSIG(status) == SIGKILL);
    ++kills;
    const auto now = digest(target);
    const bool is_a = now == bytes_a, is_b = now == bytes_b;
    INFO("kill ", i, ": file of ", now.first, " bytes");
    REQUIRE((is_a || is_b));
    saw_a += is_a;
    saw_b += is_b;
    if (i % 20 == 0) {
      const nn::SafetensorsFile f = nn::load_safetensors(target.string());
      CHECK(f.metadata.at("v") == (is_a ? "a" : "b"));
    }
    const int temps = count_temps(dir.path, target.filename().string());
    max_temps = std::max(max_temps, temps);
    REQUIRE(temps <= 1);
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  MESSAGE("killed the checkpoint writer ", kills, " times in ", secs, " s (one save: ", save_us / 1000,
          " ms); checkpoint was version a ", saw_a, " times, b ", saw_b, " times; at most ", max_temps,
          " stale temporary file(s)");
  CHECK(kills >= 200);
  CHECK(saw_b > 0);  // some saves completed between kills
  // The next save removes the killed writer's temporary file.
  nn::save_safetensors(target.string(), va, {{"v", "a"}});
  CHECK(count_temps(dir.path, target.filename().string()) == 0);
  CHECK(digest(target) == bytes_a);
}

TEST_CASE("faults: unwritable targets give a clear error and keep the previous checkpoint") {
  ScratchDir dir;
  const fs::path target = dir.path / "ckpt.safetensors";
  const nn::NamedTensors small = {{"w", full({4}, 1.5)}};
  nn::save_safetensors(target.string(), small);
  const std::string before = read_bytes(target);
  // A target inside a directory that does not exist, and one whose parent is a regular file.
  for (const fs::path& bad : {dir.path / "missing" / "x.safetensors", target / "x.safetensors"}) {
    INFO("target ", bad.string());
    try {
      nn::save_safetensors(bad.string(), small);
      FAIL("no error");
    } catch (const Error& e) {
      CHECK(e.op() == "save_safetensors");
      CHECK(std::string(e.what()).find(bad.string()) != std::string::npos);
      CHECK(std::string(e.what()).find("cannot create a temporary file") != std::string::npos);
    }
  }
  // A target that is a directory: the rename fails, the temporary file is removed.
  fs::create_directory(dir.path / "adir");
  fs::create_directory(dir.path / "adir" / "sub");
  CHECK_THROWS_AS(nn::save_safetensors((dir.path / "adir").string(), small), Error);
  CHECK(read_bytes(target) == before);
  CHECK(count_temps(dir.path, "adir") == 0);
}

TEST_CASE("faults: a full disk (file size limit) gives a clear error and keeps the previous checkpoint") {
  ScratchDir dir;
  const fs::path target = dir.path / "ckpt.safetensors";
  nn::save_safetensors(target.string(), {{"w", full({16}, 2.0)}});
  const std::string before = read_bytes(target);
  // In a child, so the limit does not outlive the case: writes past 1 MB
  // fail with EFBIG (SIGXFSZ ignored), as writes to a full disk fail with ENOSPC.
  // The tensor is made before the fork: the child runs no parallel kernel
  // (OpenMP's thread pool does not survive fork).
  const nn::NamedTensors big = {{"w", full({1 << 20}, 3.0)}};
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::signal(SIGXFSZ, SIG_IGN);
    struct rlimit lim {1 << 20, 1 << 20};
    if (::setrlimit(RLIMIT_FSIZE, &lim) != 0) ::_exit(10);
    try {
      nn::save_safetensors(target.string(), big);
      ::_exit(11);  // no error
    } catch (const Error& e) {
      const std::string msg = e.what();
      if (e.op() != "save_safetensors" || msg.find("write failed") == std::string::npos ||
          msg.find(target.string()) == std::string::npos)
        ::_exit(12);
    } catch (...) {
      ::_exit(13);
    }
    ::_exit(0);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(read_bytes(target) == before);
  CHECK(count_temps(dir.path, target.filename().string()) == 0);
  CHECK(nn::load_safetensors(target.string()).tensors.size() == 1);
}
