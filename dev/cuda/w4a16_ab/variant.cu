// One version of the W4A16 decode GEMVs (HEADER_FILE, a copy of
// kernels/cuda/w4a16_gemv.cuh) behind a renamed entry point (VARIANT = a or
// b), for main.cu. The header's kernels have internal linkage, so the two
// versions do not merge at link time.
#include HEADER_FILE

#define QGRAD_AB_CAT2(x, y) x##y
#define QGRAD_AB_CAT(x, y) QGRAD_AB_CAT2(x, y)

namespace qgrad::kernels::cuda {
void QGRAD_AB_CAT(w4a16_decode_, VARIANT)(const W4a16GemvArgs<bfloat16>& a) { launch_w4a16_decode(a); }
}  // namespace qgrad::kernels::cuda
