#!/usr/bin/env bash
# compute-sanitizer over the CUDA test cases, on the GPU machine:
#
#   bash scripts/gpu_sanitize.sh BUILD_DIR OUTDIR [TOOLS...]
#
# Runs every test executable of BUILD_DIR/tests, restricted to its CUDA test
# cases (doctest filter *cuda*, case-insensitive; left out: the out-of-memory
# test, which fills the device on purpose, and the steady-state test, whose
# host-memory bound cannot hold under an instrumenting tool), under each tool (default:
# memcheck racecheck initcheck synccheck). One log per tool and executable in
# OUTDIR; prints a summary line per tool and exits non-zero when any run
# reported an error.
set -uo pipefail
[ $# -ge 2 ] || { sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
B=$1
OUT=$(mkdir -p "$2" && cd "$2" && pwd)
shift 2
TOOLS=${*:-memcheck racecheck initcheck synccheck}
export PATH=/usr/local/cuda/bin:$PATH
# cuDNN's folder (conv2d; from the build's cache), where it loads its sub-libraries from.
cudnn_lib=$(sed -n 's/^QGRAD_CUDNN_LIBRARY_DIR:INTERNAL=//p' "$B/CMakeCache.txt" 2>/dev/null)
[ -z "$cudnn_lib" ] || export LD_LIBRARY_PATH="$cudnn_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
command -v compute-sanitizer >/dev/null || { echo "compute-sanitizer not found"; exit 1; }
status=0
run_tool() {
  local tool=$1 ran=0 bad=()
  for exe in "$B"/tests/test_*; do
    [ -f "$exe" ] && [ -x "$exe" ] || continue
    name=$(basename "$exe")
    log="$OUT/${tool}_$name.log"
    timeout 300 compute-sanitizer --tool "$tool" --error-exitcode 99 --print-limit 20 \
      "$exe" -tc='*cuda*' -tce='*out of memory*,*steady state*' > "$log" 2>&1
    rc=$?
    # An executable with no CUDA case makes no CUDA call: nothing to check.
    if grep -q "terminated before first instrumented API call" "$log"; then continue; fi
    ran=$((ran + 1))
    [ $rc = 0 ] || bad+=("$name(rc $rc)")
  done
  if [ ${#bad[@]} = 0 ]; then
    echo "$tool: clean over $ran test executables with CUDA cases" > "$OUT/$tool.summary"
  else
    echo "$tool: errors in ${bad[*]} (of $ran; logs in $OUT)" > "$OUT/$tool.summary"
  fi
}
# The tools run side by side (each is CPU-bound in its instrumentation).
for tool in $TOOLS; do run_tool "$tool" & done
wait
for tool in $TOOLS; do
  cat "$OUT/$tool.summary"
  grep -q "errors in" "$OUT/$tool.summary" && status=1
done
exit $status
