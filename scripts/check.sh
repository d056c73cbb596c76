#!/usr/bin/env bash
# Quick start, command 2: installs what is missing, builds everything (CUDA
# code too when nvcc exists) with warnings as errors, runs the CPU test suite
# under AddressSanitizer + UndefinedBehaviorSanitizer, then the full suite.
# Tests that need a GPU print SKIPPED and count as skipped. The last lines
# printed are ctest's summary of the full suite (its result line is repeated
# last, after the list of skipped tests).
#
#   QGRAD_SKIP_SANITIZE=1 bash scripts/check.sh   # leave out the sanitizer pass
set -euo pipefail
source "$(dirname "$0")/common.sh"
ASAN_BUILD=${QGRAD_ASAN_BUILD:-$QGRAD_ROOT/build-asan}
start=$SECONDS
stamp() { printf 'check: %s (%ds)\n' "$*" $((SECONDS - start)); }

bash "$QGRAD_ROOT/scripts/setup.sh"

# Without a GPU nothing here runs device code: the CUDA sources are compiled
# to PTX (the whole front end: every kernel instantiated, every warning an
# error), not assembled to sm_90 machine code, which ptxas spends about
# 60% of the CUDA compile time on; scripts/gpu_check.sh builds that on the
# GPU machine. QGRAD_CUDA_ARCHS overrides.
if [ -n "${QGRAD_CUDA_ARCHS:-}" ]; then
  cuda_archs=$QGRAD_CUDA_ARCHS
elif nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  cuda_archs=90
else
  cuda_archs=90-virtual
fi
stamp "configure + build ($QGRAD_BUILD, $QGRAD_JOBS jobs, CUDA architectures $cuda_archs)"
configure_main -DCMAKE_CUDA_ARCHITECTURES="$cuda_archs"
ninja -C "$QGRAD_BUILD" -j"$QGRAD_JOBS"

FUZZ_BUILD=${QGRAD_FUZZ_BUILD:-}
if [ "${QGRAD_SKIP_SANITIZE:-0}" != 1 ]; then
  # One clang build for the sanitizer tests and the fuzz harnesses (preset
  # "sanitizer"): the library is compiled once for both.
  stamp "sanitizer build ($ASAN_BUILD: ASan + UBSan, clang, CPU only: tests and fuzz harnesses)"
  (cd "$QGRAD_ROOT" && cmake --preset sanitizer -B "$ASAN_BUILD" >/dev/null)
  ninja -C "$ASAN_BUILD" -j"$QGRAD_JOBS"
  stamp "sanitizer test run"
  # The install/consumer test builds an outside project: not a sanitizer matter.
  # The SIGKILL fault test forks and kills a saver hundreds of times, which
  # ASan's shadow memory makes minutes long; the checkpoint code it drives
  # runs under ASan in test_checkpoint, and the fault test in the full suite.
  (cd "$ASAN_BUILD" && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
     ctest -j"$QGRAD_JOBS" --output-on-failure --timeout 900 --no-label-summary -LE install \
       -E "SIGKILL during checkpoint saves") \
    || { stamp "sanitizer suite FAILED"; exit 1; }
  FUZZ_BUILD=${FUZZ_BUILD:-$ASAN_BUILD}
fi

stamp "fuzzing (scripts/fuzz.sh: the harnesses side by side, 60 s)"
QGRAD_FUZZ_BUILD=${FUZZ_BUILD:-$QGRAD_ROOT/build-fuzz} bash "$QGRAD_ROOT/scripts/fuzz.sh" 60
stamp "full test suite"
log=$QGRAD_BUILD/ctest.log
set +e
(cd "$QGRAD_BUILD" && ctest -j"$QGRAD_JOBS" --output-on-failure --timeout 900 --no-label-summary) 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
set -e
# ctest lists skipped tests after its summary: repeat the summary so that it
# is the last line printed.
summary=$(grep -E '^[0-9]+% tests passed' "$log" | tail -n1 || true)
stamp "done"
echo "${summary:-ctest printed no summary (exit code $rc)}"
exit "$rc"
