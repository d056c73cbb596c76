#!/usr/bin/env bash
# A/B of two versions of kernels/cuda/qat_mlp.cu on the GPU machine without
# a library build (~15 s instead of ~6 min): each compiled under renamed
# entry points (variant.cu), one harness (main.cu) builds the MLP problem by
# hand and compares every output bit for bit, then times both. Both versions
# must match the working tree's kernels/qat_mlp.h. Not a CMake target (the
# point is no build); BUILD_ONLY=1 compiles it here.
#   dev/cuda/qat_mlp_ab/run.sh A.cu [B.cu]    (B: the working tree's kernel)
# e.g. here: git show HEAD:kernels/cuda/qat_mlp.cu > .data/qat_mlp_head.cu,
# then on the device (carry .data): dev/cuda/qat_mlp_ab/run.sh .data/qat_mlp_head.cu
# SHAPES="B H;B H" picks the problems (default "256 256;1024 256;100 64").
# Exit status 2 where an output differs (expected when B changes the order of a sum).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=dev/cuda/ab_build.sh
source "$here/../ab_build.sh"
ab_build "$here" KERNEL_FILE kernels/cuda/qat_mlp.cu "$@"
status=0
IFS=';' read -ra shapes <<< "${SHAPES:-256 256;1024 256;100 64}"
for shape in "${shapes[@]}"; do
  # shellcheck disable=SC2086
  timeout 120 "$work/ab" $shape || status=$?
done
exit $status
