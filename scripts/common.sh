# Shared by demo.sh and check.sh (sourced, not run): the build directory and
# its configuration, so both scripts reuse one build.
QGRAD_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
QGRAD_BUILD=${QGRAD_BUILD:-$QGRAD_ROOT/build}
QGRAD_JOBS=${QGRAD_JOBS:-$(nproc)}

# The interpreter setup.sh prepared for the Python round-trip tests.
qgrad_python() {
  if [ -f "$QGRAD_BUILD/python-path" ]; then cat "$QGRAD_BUILD/python-path"; else command -v python3 || true; fi
}

# configure_main: CUDA when nvcc exists (AUTO), warnings as errors.
configure_main() {
  local py; py=$(qgrad_python)
  export QGRAD_PYTHON=$py
  cmake -S "$QGRAD_ROOT" -B "$QGRAD_BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DQGRAD_CUDA=AUTO -DQGRAD_WERROR=ON -DQGRAD_PYTHON="$py" "$@" >/dev/null
}
