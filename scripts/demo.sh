#!/usr/bin/env bash
# Quick start, command 1: installs what is missing, builds the main demo and
# runs it (extra arguments are passed to the demo).
set -euo pipefail
DEMO=qgrad-qat-mlp     # the example target this script builds and runs
source "$(dirname "$0")/common.sh"

bash "$QGRAD_ROOT/scripts/setup.sh"
configure_main
if ! ninja -C "$QGRAD_BUILD" -t targets all 2>/dev/null | grep -q "^$DEMO:"; then
  echo "demo: target $DEMO does not exist in this checkout (examples/ has: $(ls "$QGRAD_ROOT/examples"))" >&2
  exit 1
fi
ninja -C "$QGRAD_BUILD" -j"$QGRAD_JOBS" "$DEMO"
exe=$(find "$QGRAD_BUILD" -type f -name "$DEMO" -perm -u+x | head -n1)
# The demo writes its report, metrics, plots and graph under --out
# (default: qat-mlp-out in the current directory) unless told otherwise.
out=qat-mlp-out
prev=""
for a in "$@"; do
  case "$a" in
    --out=*) out="${a#--out=}" ;;
  esac
  if [ "$prev" = "--out" ]; then out="$a"; fi
  prev="$a"
done
echo "demo: running $exe $*"
"$exe" "$@"
echo "demo: report, metrics and plots are in $(cd "$out" && pwd)/ (report.json, metrics.csv, *.png or *.svg, qat_step.dot)"
