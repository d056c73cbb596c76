// CUDA runtime glue: per-device streams, the caching allocator, copies.
//
// The allocator keeps freed blocks in per-device pools keyed by size and
// hands them out again, so a training step in steady state makes no
// cudaMalloc call. Every tensor of a device runs on that device's main
// stream, so a block freed on the host can be reused by the next kernel in
// stream order without synchronisation. The one exception, the side stream
// (a backward's parameter gradients, SideStreamScope), holds every block
// freed between its fork and its join until the join.
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "qgrad/core/cuda/common.cuh"
#include "qgrad/core/device.h"
#include "qgrad/core/memory.h"

namespace qgrad {
namespace cuda {

void throw_cuda_error(cudaError_t err, const char* what, const char* file, int line) {
  std::string msg = detail::concat(cudaGetErrorString(err), " (", what, " at ", file, ":", line, ")");
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // clear the sticky-free error so the program can go on
    throw OutOfMemory("cuda", "", msg);
  }
  throw Error("cuda", "", msg);
}

namespace {

// Blocks made or reused while a CUDA graph is being captured belong to that
// graph's private pool: a replay writes to them again, so they must never
// be handed to eager code while the graph lives.
struct Pool {
  std::multimap<std::size_t, void*> free_blocks;  // size -> block
  bool alive = true;
};

struct LiveBlock {
  std::size_t size = 0;
  std::shared_ptr<Pool> pool;  // null: the general pool
};

struct HeldBlock {
  void* ptr = nullptr;
  LiveBlock block;
};

struct DeviceState {
  cudaStream_t stream = nullptr;
  // The side stream and its fork / join events; side_open from a fork to
  // the join, while `held` keeps every block freed meanwhile out of the pools.
  cudaStream_t side_stream = nullptr;
  cudaEvent_t fork_event = nullptr, join_event = nullptr;
  bool side_open = false;
  std::vector<HeldBlock> held;
  std::uint32_t* side_block_counters = nullptr;
  Pool general;
  std::shared_ptr<Pool> capture_pool;  // set while a graph is being captured
  std::unordered_map<void*, LiveBlock> live_blocks;
  AllocatorStats stats;
  std::uint32_t* block_counters = nullptr;  // kBlockCounters zeros, for the life of the process
};

std::mutex g_mutex;
// Streams are created up front, once, so looking one up needs no lock.
std::vector<DeviceState>& states() {
  static std::vector<DeviceState> s = [] {
    std::vector<DeviceState> v(static_cast<std::size_t>(std::max(cuda_device_count(), 1)));
    int previous = 0;
    cudaGetDevice(&previous);
    for (int d = 0; d < cuda_device_count(); ++d) {
      QGRAD_CUDA_CHECK(cudaSetDevice(d));
      DeviceState& st = v[static_cast<std::size_t>(d)];
      QGRAD_CUDA_CHECK(cudaStreamCreateWithFlags(&st.stream, cudaStreamNonBlocking));
      QGRAD_CUDA_CHECK(cudaStreamCreateWithFlags(&st.side_stream, cudaStreamNonBlocking));
      QGRAD_CUDA_CHECK(cudaEventCreateWithFlags(&st.fork_event, cudaEventDisableTiming));
      QGRAD_CUDA_CHECK(cudaEventCreateWithFlags(&st.join_event, cudaEventDisableTiming));
      QGRAD_CUDA_CHECK(cudaMalloc(&st.block_counters, kBlockCounters * sizeof(std::uint32_t)));
      QGRAD_CUDA_CHECK(cudaMemset(st.block_counters, 0, kBlockCounters * sizeof(std::uint32_t)));
      QGRAD_CUDA_CHECK(cudaMalloc(&st.side_block_counters, kBlockCounters * sizeof(std::uint32_t)));
      QGRAD_CUDA_CHECK(cudaMemset(st.side_block_counters, 0, kBlockCounters * sizeof(std::uint32_t)));
      QGRAD_CUDA_CHECK(cudaDeviceSynchronize());
    }
    cudaSetDevice(previous);
    return v;
  }();
  return s;
}

DeviceState& state(int device) {
  auto& s = states();
  QGRAD_CHECK(device >= 0 && device < static_cast<int>(s.size()), "cuda", "device",
              "device index ", device, " out of range (", s.size(), " devices)");
  return s[static_cast<std::size_t>(device)];
}

// Small blocks round to 512 bytes; large ones to 2 MiB, which keeps the
// number of distinct sizes (and so fragmentation) low.
std::size_t round_size(std::size_t bytes) {
  if (bytes == 0) bytes = 1;
  const std::size_t unit = bytes < (1u << 20) ? 512 : (2u << 20);
  return (bytes + unit - 1) / unit * unit;
}

// A block no tensor holds back into its pool (the graph's while it lives).
void pool_block(DeviceState& st, void* ptr, const LiveBlock& b) {
  st.stats.bytes_in_use -= static_cast<long long>(b.size);
  Pool& pool = b.pool && b.pool->alive ? *b.pool : st.general;
  pool.free_blocks.emplace(b.size, ptr);
}

void release_cache_locked(int device, DeviceState& st) {
  if (st.general.free_blocks.empty() || st.capture_pool) return;
  DeviceGuard guard(device);
  cudaStreamSynchronize(st.stream);
  for (auto& [size, ptr] : st.general.free_blocks) {
    cudaFree(ptr);
    st.stats.bytes_reserved -= static_cast<long long>(size);
  }
  st.general.free_blocks.clear();
}

}  // namespace

namespace {
// The device whose launches go to its side stream on this thread (-1: none).
thread_local int t_side_device = -1;
}  // namespace

std::size_t stream_slot(int device) { return 2 * static_cast<std::size_t>(device) + (device == t_side_device ? 1 : 0); }

cudaStream_t stream(int device) {
  DeviceState& st = state(device);
  QGRAD_CHECK(st.stream != nullptr, "cuda", "device", "no CUDA device ", device);
  int current = -1;
  QGRAD_CUDA_CHECK(cudaGetDevice(&current));
  if (current != device) QGRAD_CUDA_CHECK(cudaSetDevice(device));
  return device == t_side_device ? st.side_stream : st.stream;
}

DeviceGuard::DeviceGuard(int device) {
  QGRAD_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != device) QGRAD_CUDA_CHECK(cudaSetDevice(device));
}
DeviceGuard::~DeviceGuard() { cudaSetDevice(previous_); }

std::uint32_t* block_counters(int device) {
  DeviceState& st = state(device);
  return device == t_side_device ? st.side_block_counters : st.block_counters;
}

namespace {
template <cudaDeviceAttr kAttribute>
int cached_attribute(int device) {
  static std::array<std::atomic<int>, 64> cached{};
  const bool cacheable = device >= 0 && device < 64;
  int n = cacheable ? cached[static_cast<std::size_t>(device)].load(std::memory_order_relaxed) : 0;
  if (n == 0) {
    QGRAD_CUDA_CHECK(cudaDeviceGetAttribute(&n, kAttribute, device));
    if (cacheable) cached[static_cast<std::size_t>(device)].store(n, std::memory_order_relaxed);
  }
  return n;
}
}  // namespace

int multiprocessor_count(int device) { return cached_attribute<cudaDevAttrMultiProcessorCount>(device); }
int l2_cache_bytes(int device) { return cached_attribute<cudaDevAttrL2CacheSize>(device); }
bool cooperative_launch(int device) { return cached_attribute<cudaDevAttrCooperativeLaunch>(device) != 0; }

unsigned fill_blocks(int device, unsigned threads) {
  const int per_sm = static_cast<int>(2048 / threads);
  return static_cast<unsigned>(std::max(1, multiprocessor_count(device) * per_sm));
}

namespace {
// A process-wide switch's start-up value: on unless the environment variable `name` is "0".
bool on_unless_env_zero(const char* name) {
  const char* env = std::getenv(name);
  return !(env && std::strcmp(env, "0") == 0);
}
std::atomic<bool>& programmatic_launch_enabled() {
  static std::atomic<bool> enabled{on_unless_env_zero("QGRAD_PROGRAMMATIC_LAUNCH")};
  return enabled;
}
}  // namespace

bool programmatic_launch(int device) {
  // Looked up on every launch: no lock after the first call.
  static const std::vector<bool> hopper = [] {
    std::vector<bool> v;
    for (int d = 0; d < cuda_device_count(); ++d) v.push_back(cuda_compute_capability(d) >= 90);
    return v;
  }();
  return programmatic_launch_enabled().load(std::memory_order_relaxed) && device >= 0 &&
         device < static_cast<int>(hopper.size()) && hopper[static_cast<std::size_t>(device)];
}

}  // namespace cuda

void cuda_set_programmatic_launch(bool enabled) { cuda::programmatic_launch_enabled().store(enabled); }
bool cuda_programmatic_launch() { return cuda::programmatic_launch_enabled().load(); }

namespace {
std::atomic<bool>& side_stream_enabled() {
  static std::atomic<bool> enabled{cuda::on_unless_env_zero("QGRAD_SIDE_STREAM")};
  return enabled;
}
std::atomic<std::uint64_t> g_side_forks{0};
std::atomic<int> g_open_sides{0};  // devices with a fork not yet joined
}  // namespace

void cuda_set_side_stream(bool enabled) { side_stream_enabled().store(enabled); }
bool cuda_side_stream() { return side_stream_enabled().load(std::memory_order_relaxed); }
bool cuda_side_stream_every_linear() {
  static const bool every = [] {
    const char* env = std::getenv("QGRAD_SIDE_STREAM");
    return env && std::strcmp(env, "all") == 0;
  }();
  return every;
}
std::uint64_t cuda_side_stream_fork_count() { return g_side_forks.load(std::memory_order_relaxed); }

namespace {
// The side stream of `device` waits for everything queued on its main stream so far.
void fork_side(int device) {
  auto& st = cuda::state(device);
  cuda::DeviceGuard guard(device);
  QGRAD_CUDA_CHECK(cudaEventRecord(st.fork_event, st.stream));
  QGRAD_CUDA_CHECK(cudaStreamWaitEvent(st.side_stream, st.fork_event, 0));
  std::lock_guard<std::mutex> lock(cuda::g_mutex);
  if (!st.side_open) g_open_sides.fetch_add(1);
  st.side_open = true;
  g_side_forks.fetch_add(1, std::memory_order_relaxed);
}
bool side_open(int device) {
  std::lock_guard<std::mutex> lock(cuda::g_mutex);
  return cuda::state(device).side_open;
}
}  // namespace

SideStreamScope::SideStreamScope(Device device, bool wanted, bool fork) {
  // Already on a side stream (a node whose gradient came from one): stay there.
  if (!wanted || !device.is_cuda() || !cuda_side_stream() || cuda::t_side_device >= 0) return;
  if (fork || !side_open(device.index)) fork_side(device.index);
  device_ = device.index;
  cuda::t_side_device = device_;
}

SideStreamScope::~SideStreamScope() {
  if (device_ >= 0) cuda::t_side_device = -1;
}

MainStreamScope::MainStreamScope() : side_device_(cuda::t_side_device) { cuda::t_side_device = -1; }

MainStreamScope::~MainStreamScope() {
  if (side_device_ < 0) return;
  // While launches go to a side stream its fork must be open: the allocator holds frees until the join.
  try {
    if (!side_open(side_device_)) fork_side(side_device_);
  } catch (...) {  // a CUDA error: it resurfaces at the next call
  }
  cuda::t_side_device = side_device_;
}

void cuda_side_stream_wait_main(Device device) {
  if (device.is_cuda() && cuda_side_stream()) fork_side(device.index);
}

void cuda_join_side_streams() {
  if (g_open_sides.load() == 0) return;
  for (int d = 0; d < cuda_device_count(); ++d) {
    auto& st = cuda::state(d);
    {
      std::lock_guard<std::mutex> lock(cuda::g_mutex);
      if (!st.side_open) continue;
    }
    cuda::DeviceGuard guard(d);
    // The join: the main stream's next work waits for everything queued on the side stream.
    QGRAD_CUDA_CHECK(cudaEventRecord(st.join_event, st.side_stream));
    QGRAD_CUDA_CHECK(cudaStreamWaitEvent(st.stream, st.join_event, 0));
    std::lock_guard<std::mutex> lock(cuda::g_mutex);
    st.side_open = false;
    g_open_sides.fetch_sub(1);
    for (const cuda::HeldBlock& h : st.held) cuda::pool_block(st, h.ptr, h.block);
    st.held.clear();
  }
}

bool cuda_available() { return cuda_device_count() > 0; }

int cuda_device_count() {
  static const int count = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return n;
  }();
  return count;
}

std::string cuda_device_name(int index) {
  cudaDeviceProp prop{};
  QGRAD_CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
  return prop.name;
}

int cuda_multiprocessor_count(int index) {
  QGRAD_CHECK(index >= 0 && index < cuda_device_count(), "cuda_multiprocessor_count", "index", "no CUDA device ",
              index);
  return cuda::multiprocessor_count(index);
}

int cuda_compute_capability(int index) {
  static std::mutex m;
  static std::vector<int> cached;
  std::lock_guard<std::mutex> lock(m);
  if (cached.empty()) cached.assign(static_cast<std::size_t>(std::max(cuda_device_count(), 0)), -1);
  QGRAD_CHECK(index >= 0 && index < static_cast<int>(cached.size()), "cuda_compute_capability", "index",
              "no CUDA device ", index);
  int& cc = cached[static_cast<std::size_t>(index)];
  if (cc < 0) {
    int major = 0, minor = 0;
    QGRAD_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, index));
    QGRAD_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, index));
    cc = major * 10 + minor;
  }
  return cc;
}

void cuda_synchronize(int index) { QGRAD_CUDA_CHECK(cudaStreamSynchronize(cuda::stream(index))); }

AllocatorStats cuda_allocator_stats(int index) {
  std::lock_guard<std::mutex> lock(cuda::g_mutex);
  return cuda::state(index).stats;
}

void cuda_reset_peak_stats(int index) {
  std::lock_guard<std::mutex> lock(cuda::g_mutex);
  auto& st = cuda::state(index).stats;
  st.peak_bytes_in_use = st.bytes_in_use;
}

void cuda_empty_cache(int index) {
  std::lock_guard<std::mutex> lock(cuda::g_mutex);
  cuda::release_cache_locked(index, cuda::state(index));
}

// ---- CUDA graphs ----

struct CudaGraph::Impl {
  int device = 0;
  cudaGraphExec_t exec = nullptr;
  std::size_t nodes = 0, kernel_nodes = 0;
  std::shared_ptr<cuda::Pool> pool = std::make_shared<cuda::Pool>();
};

CudaGraph::CudaGraph(int device) : impl_(std::make_unique<Impl>()) {
  QGRAD_CHECK(device >= 0 && device < cuda_device_count(), "CudaGraph", "device", "no CUDA device ", device);
  impl_->device = device;
}

CudaGraph::~CudaGraph() {
  if (!impl_) return;
  if (impl_->exec) cudaGraphExecDestroy(impl_->exec);
  std::lock_guard<std::mutex> lock(cuda::g_mutex);
  auto& st = cuda::state(impl_->device);
  // The graph can no longer replay: its cached blocks join the general pool,
  // and blocks still held by tensors go there when freed.
  impl_->pool->alive = false;
  for (auto& [size, ptr] : impl_->pool->free_blocks) st.general.free_blocks.emplace(size, ptr);
  impl_->pool->free_blocks.clear();
}

void CudaGraph::capture(const std::function<void()>& step) {
  QGRAD_CHECK(impl_->exec == nullptr, "CudaGraph::capture", "graph", "already captured; make a new CudaGraph");
  cudaStream_t s = cuda::stream(impl_->device);
  {
    std::lock_guard<std::mutex> lock(cuda::g_mutex);
    auto& st = cuda::state(impl_->device);
    QGRAD_CHECK(!st.capture_pool, "CudaGraph::capture", "graph", "another capture is in progress on this device");
    st.capture_pool = impl_->pool;
  }
  auto stop_pool = [&] {
    std::lock_guard<std::mutex> lock(cuda::g_mutex);
    cuda::state(impl_->device).capture_pool = nullptr;
  };
  QGRAD_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
  try {
    step();
  } catch (...) {
    cudaGraph_t broken = nullptr;
    cudaStreamEndCapture(s, &broken);
    if (broken) cudaGraphDestroy(broken);
    cudaGetLastError();
    stop_pool();
    throw;
  }
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(s, &graph);
  stop_pool();
  if (end == cudaErrorStreamCaptureInvalidated || end == cudaErrorStreamCaptureUnsupported) {
    cudaGetLastError();
    throw Error("CudaGraph::capture", "step",
                "the captured step synchronised with the host or used another stream; a captured step must "
                "queue device work only");
  }
  QGRAD_CUDA_CHECK(end);
  std::size_t count = 0;
  cudaError_t e = cudaGraphGetNodes(graph, nullptr, &count);
  std::vector<cudaGraphNode_t> nodes(count);
  if (e == cudaSuccess && count > 0) e = cudaGraphGetNodes(graph, nodes.data(), &count);
  impl_->nodes = count;
  impl_->kernel_nodes = 0;
  for (std::size_t i = 0; e == cudaSuccess && i < count; ++i) {
    cudaGraphNodeType type{};
    e = cudaGraphNodeGetType(nodes[i], &type);
    if (e == cudaSuccess && type == cudaGraphNodeTypeKernel) ++impl_->kernel_nodes;
  }
  if (e != cudaSuccess) cudaGraphDestroy(graph);
  QGRAD_CUDA_CHECK(e);
  const cudaError_t inst = cudaGraphInstantiate(&impl_->exec, graph, 0);
  cudaGraphDestroy(graph);
  QGRAD_CUDA_CHECK(inst);
}

void CudaGraph::replay() {
  QGRAD_CHECK(impl_->exec != nullptr, "CudaGraph::replay", "graph", "nothing captured yet");
  QGRAD_CUDA_CHECK(cudaGraphLaunch(impl_->exec, cuda::stream(impl_->device)));
}

bool CudaGraph::captured() const { return impl_->exec != nullptr; }
std::size_t CudaGraph::node_count() const { return impl_->nodes; }
std::size_t CudaGraph::kernel_node_count() const { return impl_->kernel_nodes; }

bool cuda_is_capturing(int index) {
  std::lock_guard<std::mutex> lock(cuda::g_mutex);
  return cuda::state(index).capture_pool != nullptr;
}

namespace memory {

namespace {

// Same-device copies run as a kernel rather than cudaMemcpyAsync, so that in
// a captured graph they are kernel nodes, which compute-sanitizer's initcheck
// follows like any other kernel (it does not track what earlier kernels of
// a graph wrote when a memcpy node reads it).
template <class T>
__global__ void copy_kernel(T* __restrict__ dst, const T* __restrict__ src, std::size_t n) {
  cuda::wait_for_prior_kernels();
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    dst[i] = src[i];
}

void copy_on_device(void* dst, const void* src, std::size_t bytes, int device) {
  constexpr unsigned threads = 256;
  const bool wide = bytes % 16 == 0 && reinterpret_cast<std::uintptr_t>(dst) % 16 == 0 &&
                    reinterpret_cast<std::uintptr_t>(src) % 16 == 0;
  const std::size_t n = wide ? bytes / 16 : bytes;
  const unsigned blocks = static_cast<unsigned>(std::min<std::size_t>((n + threads - 1) / threads, 132 * 16));
  if (wide)
    cuda::launch_kernel(device, copy_kernel<uint4>, blocks, threads, 0, static_cast<uint4*>(dst),
                        static_cast<const uint4*>(src), n);
  else
    cuda::launch_kernel(device, copy_kernel<unsigned char>, blocks, threads, 0, static_cast<unsigned char*>(dst),
                        static_cast<const unsigned char*>(src), n);
}

void* cuda_allocate(std::size_t bytes, int device) {
  const std::size_t size = cuda::round_size(bytes);
  std::lock_guard<std::mutex> lock(cuda::g_mutex);
  auto& st = cuda::state(device);
  st.stats.num_allocations++;
  void* ptr = nullptr;
  // Best fit among cached blocks, but never more than twice the request.
  // During a capture only the graph's own pool is searched.
  auto& free_blocks = st.capture_pool ? st.capture_pool->free_blocks : st.general.free_blocks;
  auto it = free_blocks.lower_bound(size);
  if (it != free_blocks.end() && it->first <= 2 * size) {
    ptr = it->second;
    const std::size_t got = it->first;
    free_blocks.erase(it);
    st.live_blocks.emplace(ptr, cuda::LiveBlock{got, st.capture_pool});
    st.stats.num_cache_hits++;
    st.stats.bytes_in_use += static_cast<long long>(got);
  } else {
    cuda::DeviceGuard guard(device);
    cudaError_t err = cudaMalloc(&ptr, size);
    if (err == cudaErrorMemoryAllocation && !st.capture_pool) {
      cudaGetLastError();
      cuda::release_cache_locked(device, st);
      err = cudaMalloc(&ptr, size);
    }
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      throw OutOfMemory("allocate", "bytes",
                        detail::concat("CUDA out of memory allocating ", bytes, " bytes on cuda:", device,
                                       " (", st.stats.bytes_in_use, " bytes in use by tensors)"));
    }
    QGRAD_CUDA_CHECK(err);
    st.stats.num_device_mallocs++;
    st.stats.bytes_reserved += static_cast<long long>(size);
    st.live_blocks.emplace(ptr, cuda::LiveBlock{size, st.capture_pool});
    st.stats.bytes_in_use += static_cast<long long>(size);
  }
  st.stats.peak_bytes_in_use = std::max(st.stats.peak_bytes_in_use, st.stats.bytes_in_use);
  return ptr;
}

void cuda_release(void* ptr, int device) noexcept {
  std::lock_guard<std::mutex> lock(cuda::g_mutex);
  auto& st = cuda::state(device);
  auto it = st.live_blocks.find(ptr);
  if (it == st.live_blocks.end()) return;
  if (st.side_open) {  // a side-stream kernel may still read it: back to a pool at the join
    st.held.push_back({ptr, it->second});
    st.live_blocks.erase(it);
    return;
  }
  cuda::pool_block(st, ptr, it->second);
  st.live_blocks.erase(it);
}
}  // namespace

void* allocate(std::size_t bytes, Device device) {
  if (device.is_cpu()) {
    const std::size_t size = (std::max<std::size_t>(bytes, 1) + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, size);
    if (!p) throw OutOfMemory("allocate", "bytes", detail::concat("host out of memory allocating ", bytes, " bytes"));
    return p;
  }
  return cuda_allocate(bytes, device.index);
}

void release(void* ptr, Device device) noexcept {
  if (!ptr) return;
  if (device.is_cpu()) {
    std::free(ptr);
    return;
  }
  cuda_release(ptr, device.index);
}

void copy(void* dst, Device dst_device, const void* src, Device src_device, std::size_t bytes) {
  if (bytes == 0) return;
  if (dst_device.is_cpu() && src_device.is_cpu()) {
    std::memcpy(dst, src, bytes);
    return;
  }
  if (dst_device.is_cuda() && src_device.is_cuda()) {
    if (dst_device.index == src_device.index) {
      copy_on_device(dst, src, bytes, dst_device.index);
    } else {
      // Order after the source's queued work, then copy peer to peer.
      QGRAD_CUDA_CHECK(cudaStreamSynchronize(cuda::stream(src_device.index)));
      QGRAD_CUDA_CHECK(cudaMemcpyPeerAsync(dst, dst_device.index, src, src_device.index, bytes,
                                           cuda::stream(dst_device.index)));
    }
    return;
  }
  // Host memory cannot take part in a captured graph (the pageable buffer
  // is gone by replay time, and a device-to-host copy is a host sync).
  const int cuda_index = dst_device.is_cuda() ? dst_device.index : src_device.index;
  QGRAD_CHECK(!cuda_is_capturing(cuda_index), "copy", "device",
              "host <-> device copy inside a captured CUDA graph step; a captured step must stay on the device");
  if (dst_device.is_cuda()) {
    cudaStream_t s = cuda::stream(dst_device.index);
    // From pageable memory the call returns once the bytes are staged, so
    // the host buffer may be freed right after; no stream sync is needed.
    QGRAD_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s));
    return;
  }
  cudaStream_t s = cuda::stream(src_device.index);
  QGRAD_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s));
  QGRAD_CUDA_CHECK(cudaStreamSynchronize(s));
}

}  // namespace memory
}  // namespace qgrad
