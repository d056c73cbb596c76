// CUDA runtime glue: per-device streams, the caching allocator, copies.
//
// The allocator keeps freed blocks in per-device pools keyed by size and
// hands them out again, so a training step in steady state makes no
// cudaMalloc call. Every tensor of a device runs on that device's single
// stream, so a block freed on the host can be reused by the next kernel in
// stream order without synchronisation.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/cuda/common.cuh"
#include "core/device.h"
#include "core/memory.h"

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

struct DeviceState {
  cudaStream_t stream = nullptr;
  std::multimap<std::size_t, void*> free_blocks;           // size -> block
  std::unordered_map<void*, std::size_t> live_blocks;      // block -> size
  AllocatorStats stats;
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
      QGRAD_CUDA_CHECK(cudaStreamCreateWithFlags(&v[static_cast<std::size_t>(d)].stream, cudaStreamNonBlocking));
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

void release_cache_locked(int device, DeviceState& st) {
  if (st.free_blocks.empty()) return;
  DeviceGuard guard(device);
  cudaStreamSynchronize(st.stream);
  for (auto& [size, ptr] : st.free_blocks) {
    cudaFree(ptr);
    st.stats.bytes_reserved -= static_cast<long long>(size);
  }
  st.free_blocks.clear();
}

}  // namespace

cudaStream_t stream(int device) {
  DeviceState& st = state(device);
  QGRAD_CHECK(st.stream != nullptr, "cuda", "device", "no CUDA device ", device);
  int current = -1;
  QGRAD_CUDA_CHECK(cudaGetDevice(&current));
  if (current != device) QGRAD_CUDA_CHECK(cudaSetDevice(device));
  return st.stream;
}

DeviceGuard::DeviceGuard(int device) {
  QGRAD_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != device) QGRAD_CUDA_CHECK(cudaSetDevice(device));
}
DeviceGuard::~DeviceGuard() { cudaSetDevice(previous_); }

unsigned fill_blocks(int device, unsigned threads) {
  static std::vector<int> sms(16, 0);
  if (device < 16 && sms[static_cast<std::size_t>(device)] == 0) {
    int n = 0;
    QGRAD_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device));
    sms[static_cast<std::size_t>(device)] = n;
  }
  const int per_sm = static_cast<int>(2048 / threads);
  return static_cast<unsigned>(std::max(1, sms[static_cast<std::size_t>(std::min(device, 15))] * per_sm));
}

}  // namespace cuda

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

namespace memory {

namespace {
void* cuda_allocate(std::size_t bytes, int device) {
  const std::size_t size = cuda::round_size(bytes);
  std::lock_guard<std::mutex> lock(cuda::g_mutex);
  auto& st = cuda::state(device);
  st.stats.num_allocations++;
  void* ptr = nullptr;
  // Best fit among cached blocks, but never more than twice the request.
  auto it = st.free_blocks.lower_bound(size);
  if (it != st.free_blocks.end() && it->first <= 2 * size) {
    ptr = it->second;
    const std::size_t got = it->first;
    st.free_blocks.erase(it);
    st.live_blocks.emplace(ptr, got);
    st.stats.num_cache_hits++;
    st.stats.bytes_in_use += static_cast<long long>(got);
  } else {
    cuda::DeviceGuard guard(device);
    cudaError_t err = cudaMalloc(&ptr, size);
    if (err == cudaErrorMemoryAllocation) {
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
    st.live_blocks.emplace(ptr, size);
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
  st.stats.bytes_in_use -= static_cast<long long>(it->second);
  st.free_blocks.emplace(it->second, ptr);
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
      QGRAD_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cuda::stream(dst_device.index)));
    } else {
      // Order after the source's queued work, then copy peer to peer.
      QGRAD_CUDA_CHECK(cudaStreamSynchronize(cuda::stream(src_device.index)));
      QGRAD_CUDA_CHECK(cudaMemcpyPeerAsync(dst, dst_device.index, src, src_device.index, bytes,
                                           cuda::stream(dst_device.index)));
    }
    return;
  }
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
