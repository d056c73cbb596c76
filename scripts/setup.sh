#!/usr/bin/env bash
# Installs what qgrad needs on Debian 12 and is missing; a second run costs
# nothing. Run as root (or with sudo available). Sourcing it is not needed:
# the Python venv it makes (build/venv) is where CMake looks first.
#
#   bash scripts/setup.sh            # everything the build, tests and demo need
#   QGRAD_SKIP_PYTHON=1 bash ...     # leave out the Python venv (safetensors)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

say() { printf 'setup: %s\n' "$*"; }

# ---- Debian packages ---------------------------------------------------------
REQUIRED=(build-essential cmake ninja-build pkg-config libeigen3-dev doctest-dev zlib1g-dev
          nlohmann-json3-dev libcli11-dev python3 python3-venv dataset-fashion-mnist
          libonnx-dev libprotobuf-dev  # ONNX export (export/; optional in the build)
          libgloo-dev  # CPU collectives of dist/ (Gloo; optional in the build)
          clang libclang-rt-14-dev)  # the sanitizer build of check.sh and scripts/fuzz.sh (libFuzzer, ASan, UBSan)
OPTIONAL=(graphviz gnuplot-nox iproute2)  # iproute2: the dist test in two network namespaces

installed() { [ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" = "install ok installed" ]; }

missing=()
for p in "${REQUIRED[@]}" "${OPTIONAL[@]}"; do installed "$p" || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  if ! command -v apt-get >/dev/null; then
    say "missing packages ${missing[*]} and no apt-get: install them by hand"; exit 1
  fi
  SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
  say "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  # Required packages must install; optional ones are tried one by one.
  req=(); for p in "${REQUIRED[@]}"; do installed "$p" || req+=("$p"); done
  if [ ${#req[@]} -gt 0 ]; then
    $SUDO apt-get install -y -qq --no-install-recommends "${req[@]}" >/dev/null
  fi
  for p in "${OPTIONAL[@]}"; do
    installed "$p" || $SUDO apt-get install -y -qq --no-install-recommends "$p" >/dev/null \
      || say "optional package $p not installed (its tests will skip)"
  done
else
  say "Debian packages present"
fi

# ---- CUDA --------------------------------------------------------------------
if command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; then
  say "nvcc found: $(command -v nvcc || echo /usr/local/cuda/bin/nvcc) (CUDA code will be compiled)"
else
  say "no nvcc: CPU-only build"
fi

# ---- Python (safetensors round trip) -----------------------------------------
# A venv under build/ keeps the system Python untouched. CMake takes it as the
# default of its cache variable QGRAD_PYTHON, the one way the tests find it.
if [ "${QGRAD_SKIP_PYTHON:-0}" != 1 ]; then
  VENV=$ROOT/build/venv
  PY=$VENV/bin/python
  if [ -x "$PY" ] && "$PY" -c 'import safetensors, numpy' 2>/dev/null; then
    say "Python venv present ($PY)"
  else
    mkdir -p "$ROOT/build"
    # Prefer Debian's interpreter (python3-venv is installed above).
    BASE=python3
    if [ -x /usr/bin/python3 ]; then BASE=/usr/bin/python3; fi
    "$BASE" -m venv "$VENV"
    "$PY" -m pip install -q --disable-pip-version-check safetensors numpy onnx onnxruntime
    say "Python venv ready ($PY)"
  fi
fi
