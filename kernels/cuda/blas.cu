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
  static std::vector<cublasHandle_t> handles;
  std::lock_guard<std::mutex> lock(mutex);
  if (device < 0) throw Error("cublas", "device", "negative device index " + std::to_string(device));
  const auto d = static_cast<std::size_t>(device);
  if (handles.size() <= d) handles.resize(d + 1, nullptr);
  if (handles[d] == nullptr) {
    DeviceGuard guard(device);
    cublasHandle_t h = nullptr;
    QGRAD_CUBLAS_CHECK(cublasCreate(&h));
    QGRAD_CUBLAS_CHECK(cublasSetStream(h, stream(device)));
    QGRAD_CUBLAS_CHECK(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH));
    QGRAD_CUBLAS_CHECK(cublasSetPointerMode(h, CUBLAS_POINTER_MODE_HOST));
    handles[d] = h;
  }
  return handles[d];
}

}  // namespace qgrad::cuda
