// The CUDA runtime entry points of a build without CUDA: queries answer
// "no device", anything that needs one throws a clear error.
#include "qgrad/core/device.h"
#include "qgrad/core/error.h"
#include "qgrad/core/memory.h"

#if !QGRAD_WITH_CUDA
#include <cstdlib>
#include <cstring>

namespace qgrad {

namespace {
[[noreturn]] void no_cuda(const char* op) {
  throw Error(op, "device", "qgrad was built without CUDA (configure with -DQGRAD_CUDA=ON)");
}
}  // namespace

bool cuda_available() { return false; }
int cuda_device_count() { return 0; }
std::string cuda_device_name(int) { no_cuda("cuda_device_name"); }
int cuda_compute_capability(int) { no_cuda("cuda_compute_capability"); }
int cuda_multiprocessor_count(int) { no_cuda("cuda_multiprocessor_count"); }
void cuda_synchronize(int) { no_cuda("cuda_synchronize"); }
void cuda_set_programmatic_launch(bool) {}
bool cuda_programmatic_launch() { return false; }
SideStreamScope::SideStreamScope(Device, bool, bool) {}
SideStreamScope::~SideStreamScope() = default;
MainStreamScope::MainStreamScope() = default;
MainStreamScope::~MainStreamScope() = default;
void cuda_join_side_streams() {}
void cuda_side_stream_wait_main(Device) {}
void cuda_set_side_stream(bool) {}
bool cuda_side_stream() { return false; }
bool cuda_side_stream_every_linear() { return false; }
std::uint64_t cuda_side_stream_fork_count() { return 0; }
AllocatorStats cuda_allocator_stats(int) { no_cuda("cuda_allocator_stats"); }
void cuda_reset_peak_stats(int) { no_cuda("cuda_reset_peak_stats"); }
void cuda_empty_cache(int) { no_cuda("cuda_empty_cache"); }

struct CudaGraph::Impl {};
CudaGraph::CudaGraph(int) { no_cuda("CudaGraph"); }
CudaGraph::~CudaGraph() = default;
void CudaGraph::capture(const std::function<void()>&) { no_cuda("CudaGraph::capture"); }
void CudaGraph::replay() { no_cuda("CudaGraph::replay"); }
bool CudaGraph::captured() const { return false; }
std::size_t CudaGraph::node_count() const { return 0; }
std::size_t CudaGraph::kernel_node_count() const { return 0; }
bool cuda_is_capturing(int) { return false; }

namespace memory {
void* allocate(std::size_t bytes, Device device) {
  if (!device.is_cpu()) no_cuda("allocate");
  const std::size_t size = (std::max<std::size_t>(bytes, 1) + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, size);
  if (!p) throw OutOfMemory("allocate", "bytes", detail::concat("host out of memory allocating ", bytes, " bytes"));
  return p;
}
void release(void* ptr, Device) noexcept { std::free(ptr); }
void copy(void* dst, Device dst_device, const void* src, Device src_device, std::size_t bytes) {
  if (!dst_device.is_cpu() || !src_device.is_cpu()) no_cuda("copy");
  if (bytes) std::memcpy(dst, src, bytes);
}
}  // namespace memory

}  // namespace qgrad
#endif
