# shellcheck shell=bash
# Shared by demo.sh, check.sh and fuzz.sh (sourced, not run): the build directory and
# its configuration, so both scripts reuse one build.
QGRAD_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
QGRAD_BUILD=${QGRAD_BUILD:-$QGRAD_ROOT/build}
QGRAD_JOBS=${QGRAD_JOBS:-$(nproc)}

# configure_main [-DX=Y ...]: the `default` preset of CMakePresets.json
# (Release, CUDA when nvcc exists, warnings as errors) in $QGRAD_BUILD.
configure_main() {
  (cd "$QGRAD_ROOT" && cmake --preset default -B "$QGRAD_BUILD" "$@" >/dev/null)
}
