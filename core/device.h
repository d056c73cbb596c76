// Devices: the host CPU, or CUDA device n.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace qgrad {

enum class DeviceType : unsigned char { CPU, CUDA };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;

  static Device cpu() { return {DeviceType::CPU, 0}; }
  static Device cuda(int n = 0) { return {DeviceType::CUDA, n}; }
  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  bool operator==(const Device&) const = default;
  std::string str() const { return is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(index); }
  // Parses "cpu", "cuda" or "cuda:N"; throws qgrad::Error.
  static Device parse(const std::string& s);
};

// CUDA runtime queries; all safe to call in a build without CUDA.
bool cuda_available();
int cuda_device_count();
std::string cuda_device_name(int index = 0);
// 10 * major + minor (e.g. 90 for an H100); cached per device. FP8 tensor
// cores need 89 or more.
int cuda_compute_capability(int index = 0);
// The device's streaming multiprocessors; cached per device.
int cuda_multiprocessor_count(int index = 0);
// Waits for all work queued on the device's stream (a host sync: never
// called inside qgrad's ops, only by users, tests and benchmarks).
void cuda_synchronize(int index = 0);
// Programmatic dependent launch (compute capability 9.0 or more): each qgrad
// kernel may be dispatched while the one before it on the stream finishes,
// and waits for it before touching memory; results are the same bits either
// way. On by default; the environment variable QGRAD_PROGRAMMATIC_LAUNCH=0
// turns it off at start-up. Applies to launches made (or captured) after the
// call; a no-op in a build without CUDA.
void cuda_set_programmatic_launch(bool enabled);
bool cuda_programmatic_launch();

// The side stream: a second stream per device for work off a backward's
// critical path (a linear's weight and bias gradients, and what runs on
// them up to their leaves: docs/design.md "Memory and streams"). While a
// SideStreamScope lives, the calling thread's launches on its device go to
// the side stream, which first waits for everything queued on the main
// stream so far (the fork). cuda_join_side_streams makes each main stream
// wait for everything queued on its side stream so far (the join); the
// backward engine joins before any other work reads such a gradient and at
// its end, so user code never sees an open fork. Between a fork and its join
// every block freed on the device is held out of the allocator's pools (a
// side kernel may still read it). Results are the same bits either way
// (the same kernels on the same data). On by default; QGRAD_SIDE_STREAM=0
// turns it off at start-up. conv2d forks its weight and bias gradients
// (ops/conv.cpp); a linear forks only where its dx GEMM leaves SMs idle
// (ops/linalg.cpp); QGRAD_SIDE_STREAM=all forks at every linear
// (cuda_side_stream_every_linear: for measuring the rule). A scope on the
// CPU, with the switch off, not wanted, or on a thread already in one does
// nothing.
// fork = false: fork only where no fork of the device is open (the backward
// engine's continuation of a side gradient, already ordered on the side).
class SideStreamScope {
 public:
  explicit SideStreamScope(Device device, bool wanted = true, bool fork = true);
  ~SideStreamScope();
  SideStreamScope(const SideStreamScope&) = delete;
  SideStreamScope& operator=(const SideStreamScope&) = delete;
  // Whether this scope moved the thread's launches to the side stream (false
  // where it did nothing, e.g. inside another scope: the thread stays there).
  bool switched() const { return device_ >= 0; }

 private:
  int device_ = -1;  // the device switched to, or -1
};
// The calling thread's launches back on the main streams for the scope
// (inside a SideStreamScope: the engine's flush of queued passes); where the
// scope it interrupted has been joined meanwhile, it forks again on exit.
class MainStreamScope {
 public:
  MainStreamScope();
  ~MainStreamScope();
  MainStreamScope(const MainStreamScope&) = delete;
  MainStreamScope& operator=(const MainStreamScope&) = delete;

 private:
  [[maybe_unused]] int side_device_ = -1;  // unused without CUDA
};
void cuda_join_side_streams();
// The side stream of `device` waits for everything queued on its main stream
// so far (a fork while one may already be open): what a side-stream kernel
// needs before it reads a gradient made on the main stream (the backward
// engine's sums of a side and a main gradient, run on the side). Nothing on
// the CPU or with the switch off.
void cuda_side_stream_wait_main(Device device);
void cuda_set_side_stream(bool enabled);
bool cuda_side_stream();
bool cuda_side_stream_every_linear();
// Forks since the process started (every thread): what tests read to see a rule forked.
std::uint64_t cuda_side_stream_fork_count();

struct AllocatorStats {
  long long bytes_in_use = 0;     // handed out to live tensors
  long long peak_bytes_in_use = 0;
  long long bytes_reserved = 0;   // obtained from cudaMalloc (in use + cached)
  long long num_device_mallocs = 0;
  long long num_allocations = 0;  // requests served, cached or not
  long long num_cache_hits = 0;
};
AllocatorStats cuda_allocator_stats(int index = 0);
void cuda_reset_peak_stats(int index = 0);
// Returns every cached, unused block to the driver.
void cuda_empty_cache(int index = 0);

// A whole step captured once into a CUDA graph and replayed: one launch
// instead of one per kernel. Shapes and addresses are fixed at capture:
// copy new inputs into the tensors the step read during capture. Memory
// the step allocates comes from a pool private to the graph, so replays
// never overwrite tensors of eager code. A step that synchronises with the
// host (to_vector, item, a device-to-host copy) cannot be captured and
// makes capture() throw.
class CudaGraph {
 public:
  explicit CudaGraph(int device = 0);
  ~CudaGraph();
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;
  // Records `step`'s device work; the work is not executed by capture().
  void capture(const std::function<void()>& step);
  void replay();  // queues the recorded work on the device's stream
  bool captured() const;
  // Nodes of the captured graph: all of them, and the kernel launches among
  // them (0 before capture). For profiling: each kernel node costs a launch.
  std::size_t node_count() const;
  std::size_t kernel_node_count() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};
bool cuda_is_capturing(int index = 0);

}  // namespace qgrad
