# shellcheck shell=bash
# Sourced by the A/B harnesses (dev/cuda/*_ab/run.sh): compiles their
# variant.cu twice, with FILE_MACRO naming version A's and version B's
# source file and VARIANT = a / b renaming the entry points, and main.cu,
# into "$work/ab" ("qgrad/..." includes from this checkout). B defaults to
# TREE_FILE (relative to the checkout: the working tree's version); with
# BUILD_ONLY set the script exits after the build.
#   ab_build HARNESS_DIR FILE_MACRO TREE_FILE A [B]     (sets $work, removed at exit)
ab_build() {
  local here=$1 macro=$2 a b root nvcc
  root=$(cd "$here/../../.." && pwd)
  a=$(realpath "${4:?usage: run.sh A [B]  (B defaults to the working tree: $3)}")
  b=$(realpath "${5:-$root/$3}")
  nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  mkdir -p "$work/include" && ln -s "$root" "$work/include/qgrad"
  local flags=(-O3 -arch=sm_90 -std=c++20 --expt-relaxed-constexpr --extended-lambda --fmad=false
               -I"$work/include" -DQGRAD_WITH_CUDA=1)
  "$nvcc" "${flags[@]}" -DVARIANT=a -D"$macro"="\"$a\"" -c "$here/variant.cu" -o "$work/a.o" &
  "$nvcc" "${flags[@]}" -DVARIANT=b -D"$macro"="\"$b\"" -c "$here/variant.cu" -o "$work/b.o" &
  "$nvcc" "${flags[@]}" -c "$here/main.cu" -o "$work/main.o" &
  wait %1 && wait %2 && wait %3
  "$nvcc" -arch=sm_90 "$work/a.o" "$work/b.o" "$work/main.o" -o "$work/ab"
  if [ -n "${BUILD_ONLY:-}" ]; then exit 0; fi
}
