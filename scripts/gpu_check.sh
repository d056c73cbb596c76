#!/usr/bin/env bash
# The whole GPU check, for the GPU machine (CUDA 13, g++ 13, CMake 4, ninja,
# Eigen/doctest in /usr/include, Python with torch; no network needed).
#
#   bash scripts/gpu_check.sh OUTDIR [--memcheck] [--bench] [--profile] [--no-build] [--arch 90] [--jobs 16]
#                                    [--data DIR]
#
# Builds with CUDA on (Ninja, sm_90 by default), runs every ctest test (GPU
# tests run here), logs to OUTDIR/ctest.log; --memcheck runs each test
# executable under compute-sanitizer memcheck (OUTDIR/memcheck_*.log);
# --bench runs bench/bench_* (OUTDIR/bench_*.jsonl), the PyTorch peers
# bench/peer_*.py (OUTDIR/peer_*.jsonl) and merges them into
# OUTDIR/benchmarks.md with scripts/bench_table.py; --profile runs
# scripts/profile_step.sh (ncu over the captured QAT step) into
# OUTDIR/profile/profile.md. --data DIR: a copy of Fashion-MNIST's four IDX
# files, linked at /usr/share/datasets/fashion-mnist (the Debian package
# dataset-fashion-mnist's folder, where the examples' smoke tests read it)
# when that folder has none: the GPU machine lacks the package and its
# network, so without a copy carried over those tests skip. Prints a short
# summary; exits non-zero when any part failed.
set -uo pipefail
usage() { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
[ $# -ge 1 ] || usage
OUT=$(mkdir -p "$1" && cd "$1" && pwd); shift
MEMCHECK=0 BENCH=0 PROFILE=0 BUILD=1 ARCH=90 JOBS=16 DATA=
while [ $# -gt 0 ]; do
  case "$1" in
    --memcheck) MEMCHECK=1 ;;
    --bench) BENCH=1 ;;
    --profile) PROFILE=1 ;;
    --no-build) BUILD=0 ;;
    --arch) ARCH=$2; shift ;;
    --jobs) JOBS=$2; shift ;;
    --data) DATA=$2; shift ;;
    *) usage ;;
  esac
  shift
done
ROOT=$(cd "$(dirname "$0")/.." && pwd)
B=${QGRAD_GPU_BUILD:-$ROOT/build-gpu}
PY=$(command -v python3 || true)  # the PyTorch peers' interpreter (the tests' is the CMake cache's QGRAD_PYTHON)
export PATH=/usr/local/cuda/bin:/usr/local/cuda/compute-sanitizer:$PATH
status=0
summary=()
note() { summary+=("$*"); }
t0=$SECONDS

if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$OUT/gpu.txt" 2>&1 || true
else
  echo "no GPU (nvidia-smi not found)" > "$OUT/gpu.txt"
fi
echo "gpu: $(head -n1 "$OUT/gpu.txt")"

# cuDNN (conv2d): the toolkit's when it has one, else the wheel nvidia-cudnn-cu13 of
# the PyTorch environment (CMake also searches both; passing the root makes the
# choice explicit). Its folder goes on LD_LIBRARY_PATH below: cuDNN dlopens its
# sub-libraries (libcudnn_cnn.so.9, libcudnn_engines_*.so.9) from the search path.
CUDNN_ARGS=()
if [ ! -f /usr/local/cuda/include/cudnn.h ] && [ -n "$PY" ]; then
  cudnn_root=$("$PY" -c 'import nvidia.cudnn as m; print(list(m.__path__)[0])' 2>/dev/null || true)
  [ -n "$cudnn_root" ] && [ -f "$cudnn_root/include/cudnn.h" ] && CUDNN_ARGS=(-DQGRAD_CUDNN_ROOT="$cudnn_root")
fi

# NCCL (dist/, CUDA collectives): likewise the toolkit's, else the wheel
# nvidia-nccl-cu13 of the PyTorch environment; its folder goes on
# LD_LIBRARY_PATH below as cuDNN's does.
if [ ! -f /usr/local/cuda/include/nccl.h ] && [ -n "$PY" ]; then
  nccl_root=$("$PY" -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null || true)
  [ -n "$nccl_root" ] && [ -f "$nccl_root/include/nccl.h" ] && CUDNN_ARGS+=(-DQGRAD_NCCL_ROOT="$nccl_root")
fi

if [ $BUILD = 1 ]; then
  if (cd "$ROOT" && cmake --preset gpu -B "$B" -DCMAKE_CUDA_ARCHITECTURES="$ARCH" ${CUDNN_ARGS[@]+"${CUDNN_ARGS[@]}"}) > "$OUT/configure.log" 2>&1 \
     && ninja -C "$B" -j"$JOBS" > "$OUT/build.log" 2>&1; then
    note "build: ok ($((SECONDS - t0))s)"
  else
    echo "build FAILED; last lines of $OUT/build.log:"; tail -n 40 "$OUT/configure.log" "$OUT/build.log" 2>/dev/null
    exit 1
  fi
fi

cudnn_lib=$(sed -n 's/^QGRAD_CUDNN_LIBRARY_DIR:INTERNAL=//p' "$B/CMakeCache.txt" 2>/dev/null)
if [ -n "$cudnn_lib" ]; then
  export LD_LIBRARY_PATH="$cudnn_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  note "cudnn: $(sed -n 's/^QGRAD_CUDNN_LIBRARY_PATH:INTERNAL=//p' "$B/CMakeCache.txt")"
fi
nccl_lib=$(sed -n 's/^QGRAD_NCCL_LIBRARY_DIR:INTERNAL=//p' "$B/CMakeCache.txt" 2>/dev/null)
if [ -n "$nccl_lib" ]; then
  export LD_LIBRARY_PATH="$nccl_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  note "nccl: $(sed -n 's/^QGRAD_NCCL_LIBRARY_PATH:INTERNAL=//p' "$B/CMakeCache.txt")"
fi

fmnist=/usr/share/datasets/fashion-mnist
if [ -n "$DATA" ] && [ ! -f "$fmnist/train-images-idx3-ubyte.gz" ]; then
  if [ -f "$DATA/train-images-idx3-ubyte.gz" ] && mkdir -p "$(dirname "$fmnist")" \
     && ln -sfn "$(cd "$DATA" && pwd)" "$fmnist"; then
    note "fashion-mnist: $DATA linked at $fmnist"
  else
    note "fashion-mnist: could not link $DATA at $fmnist (the examples' smoke tests skip)"
  fi
fi

# ---- tests ----
t1=$SECONDS
(cd "$B" && ctest -j"$JOBS" --output-on-failure --timeout 900) > "$OUT/ctest.log" 2>&1
rc=$?
skipped=$(grep -cE '^\s+[0-9]+ - .*\(Skipped\)$' "$OUT/ctest.log" || true)
note "ctest: $(grep -E '^[0-9]+% tests passed' "$OUT/ctest.log" | tail -n1) ($((SECONDS - t1))s; $skipped skipped)"
if [ "$skipped" != 0 ]; then
  while IFS= read -r l; do note "  $l"; done < <(grep -m 20 -E '^\s+[0-9]+ - .*\(Skipped\)$' "$OUT/ctest.log")
fi
if [ $rc != 0 ]; then
  status=1
  note "failed tests:"
  while IFS= read -r l; do note "  $l"; done < <(awk '/The following tests FAILED/ { f = 1 } f && /^[ \t]+[0-9]+ -/ && n++ < 30' "$OUT/ctest.log")
fi

# ---- compute-sanitizer memcheck ----
if [ $MEMCHECK = 1 ]; then
  t2=$SECONDS
  if ! command -v compute-sanitizer >/dev/null; then
    note "memcheck: compute-sanitizer not found, skipped"
  else
    bad=()
    for exe in "$B"/tests/test_*; do
      [ -x "$exe" ] && [ -f "$exe" ] || continue
      name=$(basename "$exe")
      # The caching allocator hides out-of-bounds accesses that stay inside
      # a cached block; memcheck still sees races with the host, invalid
      # addresses, misaligned accesses and leaked launches errors.
      timeout "${QGRAD_MEMCHECK_TIMEOUT:-900}" compute-sanitizer --tool memcheck --error-exitcode 99 --print-limit 20 "$exe" > "$OUT/memcheck_$name.log" 2>&1
      r=$?
      [ $r = 0 ] || bad+=("$name(rc $r)")
    done
    if [ ${#bad[@]} = 0 ]; then note "memcheck: clean ($((SECONDS - t2))s)"
    else status=1; note "memcheck: problems in ${bad[*]} (see $OUT/memcheck_*.log)"; fi
  fi
fi

# ---- benchmarks ----
if [ $BENCH = 1 ]; then
  t3=$SECONDS
  bad=()
  for exe in "$B"/bench/bench_*; do
    [ -x "$exe" ] && [ -f "$exe" ] || continue
    name=$(basename "$exe")
    "$exe" > "$OUT/$name.jsonl" 2> "$OUT/$name.err" || bad+=("$name")
  done
  for py in "$ROOT"/bench/peer_*.py; do
    [ -f "$py" ] || continue
    name=$(basename "$py" .py)
    "$PY" "$py" > "$OUT/$name.jsonl" 2> "$OUT/$name.err" || bad+=("$name")
  done
  [ ${#bad[@]} = 0 ] || { status=1; note "bench: failed: ${bad[*]} (see $OUT/*.err)"; }
  if ls "$OUT"/*.jsonl >/dev/null 2>&1; then
    "$PY" "$ROOT/scripts/bench_table.py" "$OUT"/*.jsonl --device "$(head -n1 "$OUT/gpu.txt" | cut -d, -f1)" \
      > "$OUT/benchmarks.md" 2> "$OUT/bench_table.err" || { status=1; note "bench: bench_table.py failed"; }
    note "bench: $(cat "$OUT"/bench_*.jsonl 2>/dev/null | grep -c '^{') qgrad records, $(cat "$OUT"/peer_*.jsonl 2>/dev/null | grep -c '^{') peer records; table in $OUT/benchmarks.md ($((SECONDS - t3))s)"
  else
    note "bench: no benchmark output"
  fi
fi

# ---- profile of the captured training step ----
if [ $PROFILE = 1 ]; then
  t4=$SECONDS
  if bash "$ROOT/scripts/profile_step.sh" "$B" "$OUT/profile" > "$OUT/profile.log" 2>&1; then
    note "profile: $OUT/profile/profile.md ($((SECONDS - t4))s)"
  else
    status=1; note "profile: failed (see $OUT/profile.log)"
  fi
fi

echo "---- gpu_check summary ($((SECONDS - t0))s, logs in $OUT) ----"
printf '%s\n' "${summary[@]}"
exit $status
