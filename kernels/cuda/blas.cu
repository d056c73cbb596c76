#include "qgrad/kernels/cuda/blas.cuh"

#include <mutex>
#include <string>
#include <vector>

namespace qgrad::cuda {

void throw_cublas_error(cublasStatus_t status, const char* what, const char* file, int line) {
  throw Error("cublas", "", std::string(cublasGetStatusName(status)) + " (" + cublasGetStatusString(status) +
                                ") in " + what + " at " + file + ":" + std::to_string(line));
}

cublasHandle_t blas_handle(int device) {
  static std::mutex mutex;
  static std::vector<cublasHandle_t> handles;  // [device][main, side]: one workspace per stream
  std::lock_guard<std::mutex> lock(mutex);
  if (device < 0) throw Error("cublas", "device", "negative device index " + std::to_string(device));
  const std::size_t slot = stream_slot(device);
  if (handles.size() <= slot) handles.resize(slot + 1, nullptr);
  if (handles[slot] == nullptr) {
    DeviceGuard guard(device);
    cublasHandle_t h = nullptr;
    QGRAD_CUBLAS_CHECK(cublasCreate(&h));
    QGRAD_CUBLAS_CHECK(cublasSetStream(h, stream(device)));
    QGRAD_CUBLAS_CHECK(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH));
    QGRAD_CUBLAS_CHECK(cublasSetPointerMode(h, CUBLAS_POINTER_MODE_HOST));
    handles[slot] = h;
  }
  return handles[slot];
}

}  // namespace qgrad::cuda
