// Built without Gloo (libgloo-dev absent, or QGRAD_GLOO=OFF): CPU collectives
// throw (ProcessGroup checks gloo_built() before it asks for the backend).
#include "qgrad/dist/backend.h"

namespace qgrad::dist::detail {

bool gloo_built() { return false; }
std::unique_ptr<Backend> make_gloo(const BackendArgs&) {
  QGRAD_CHECK(false, "ProcessGroup", "gloo", "this build has no Gloo (install libgloo-dev and reconfigure)");
  return nullptr;
}

}  // namespace qgrad::dist::detail
