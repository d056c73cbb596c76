#!/usr/bin/env bash
# A/B of two versions of the W4A16 decode GEMVs (kernels/cuda/w4a16_gemv.cuh)
# on the GPU machine without a library build: each compiled under a renamed
# entry point (variant.cu), one harness (main.cu) that compares their outputs
# bit for bit (and B's with a host reference) and times both, alternating:
# the kernel back to back, a captured 24-layer decode chain y_i = W_i y_(i-1)
# over weights rotating past L2, and the same chain over one L2-resident
# weight. Both versions must declare the working tree's W4a16GemvArgs. Not a
# CMake target (the point is no build); BUILD_ONLY=1 compiles it here.
#   dev/cuda/w4a16_ab/run.sh A.cuh [B.cuh]    (B: the working tree's header)
# e.g. here: git show HEAD:kernels/cuda/w4a16_gemv.cuh > .data/w4_head.cuh,
# then on the device (carry .data): dev/cuda/w4a16_ab/run.sh .data/w4_head.cuh
# MS="1 16" picks the rows of x (default); N = K = 4096, s4, groups of 128,
# bf16 x, bf16 and f32 scales. Exit status 2 where the outputs differ.
# probes.py writes latency probes of the split-K GEMV (wrong outputs by design) to time as A.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=dev/cuda/ab_build.sh
source "$here/../ab_build.sh"
ab_build "$here" HEADER_FILE kernels/cuda/w4a16_gemv.cuh "$@"
status=0
for m in ${MS:-1 16}; do
  timeout 120 "$work/ab" "$m" || status=$?
done
exit $status
