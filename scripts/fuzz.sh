#!/usr/bin/env bash
# Builds the libFuzzer harnesses (fuzz/, clang, ASan + UBSan, CPU only) and
# runs them side by side, each for SECONDS (default 60) from its seed corpus
# in fuzz/corpus/.
# Fails on any crash, sanitizer report, leak, timeout or out-of-memory.
# New corpus entries go to a scratch copy; fuzz/corpus/ is not modified.
#
#   bash scripts/fuzz.sh [SECONDS] [HARNESS...]     # HARNESS: idx safetensors ops
#   QGRAD_FUZZ_BUILD=dir  (default build-fuzz; a build configured with QGRAD_FUZZ=ON is kept as it is)   QGRAD_FUZZ_OUT=dir (artifacts, logs)
set -euo pipefail
source "$(dirname "$0")/common.sh"
SECONDS_EACH=${1:-60}
shift || true
HARNESSES=("$@")
[ ${#HARNESSES[@]} -gt 0 ] || HARNESSES=(idx safetensors ops)
BUILD=${QGRAD_FUZZ_BUILD:-$QGRAD_ROOT/build-fuzz}
OUT=${QGRAD_FUZZ_OUT:-$BUILD/runs}
say() { printf 'fuzz: %s\n' "$*"; }

if ! command -v clang++ >/dev/null; then say "clang++ not found (scripts/setup.sh installs clang)"; exit 1; fi
say "building harnesses in $BUILD"
# A build configured with QGRAD_FUZZ=ON already (check.sh's sanitizer build,
# clang with the tests too) is used as it is; anything else gets the preset.
grep -q '^QGRAD_FUZZ:BOOL=ON$' "$BUILD/CMakeCache.txt" 2>/dev/null \
  || (cd "$QGRAD_ROOT" && cmake --preset fuzz -B "$BUILD" >/dev/null)
ninja -C "$BUILD" -j"$QGRAD_JOBS" "${HARNESSES[@]/#/fuzz_}"

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# The harnesses run side by side (libFuzzer is one process each; on two
# cores the three take SECONDS of wall time, not three times that).
run_one() {
  local h=$1 dir=$OUT/$1
  if "$BUILD/fuzz/fuzz_$h" -max_total_time="$SECONDS_EACH" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
       -artifact_prefix="$dir/artifacts/" "$dir/corpus" >"$dir/log" 2>&1; then
    echo ok > "$dir/status"
  else
    echo failed > "$dir/status"
  fi
}
pids=()
for h in "${HARNESSES[@]}"; do
  dir=$OUT/$h
  rm -rf "$dir"; mkdir -p "$dir/corpus" "$dir/artifacts"
  cp "$QGRAD_ROOT/fuzz/corpus/$h/"* "$dir/corpus/" 2>/dev/null || true
  say "running fuzz_$h for ${SECONDS_EACH}s (log $dir/log)"
  run_one "$h" &
  pids+=($!)
done
wait "${pids[@]}"
rc=0
for h in "${HARNESSES[@]}"; do
  dir=$OUT/$h
  if [ "$(cat "$dir/status" 2>/dev/null)" = ok ]; then
    say "fuzz_$h: $(grep -E '^stat::number_of_executed_units' "$dir/log" | awk '{print $2}') executions, no crash"
  else
    say "fuzz_$h FAILED: artifacts in $dir/artifacts; end of the log:"
    tail -n 40 "$dir/log"
    rc=1
  fi
done
exit "$rc"
