// Built without NCCL (a CPU build, no nccl.h/libnccl found, or QGRAD_NCCL=OFF):
// CUDA collectives throw (ProcessGroup checks nccl_built() first).
#include "qgrad/dist/backend.h"

namespace qgrad::dist::detail {

bool nccl_built() { return false; }
std::unique_ptr<Backend> make_nccl(const BackendArgs&) {
  QGRAD_CHECK(false, "ProcessGroup", "nccl",
              "this build has no NCCL (a CUDA build finds it in the toolkit, QGRAD_NCCL_ROOT or the nvidia-nccl wheel)");
  return nullptr;
}

}  // namespace qgrad::dist::detail
