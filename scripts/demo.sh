#!/usr/bin/env bash
# Quick start, command 1: installs what is missing, builds the main demo and
# runs it (extra arguments are passed to the demo).
set -euo pipefail
DEMO=qgrad-train-mlp   # the example target this script builds and runs
source "$(dirname "$0")/common.sh"

bash "$QGRAD_ROOT/scripts/setup.sh"
configure_main
if ! ninja -C "$QGRAD_BUILD" -t targets all 2>/dev/null | grep -q "^$DEMO:"; then
  echo "demo: target $DEMO does not exist in this checkout (examples/ has: $(ls "$QGRAD_ROOT/examples"))" >&2
  exit 1
fi
ninja -C "$QGRAD_BUILD" -j"$QGRAD_JOBS" "$DEMO"
exe=$(find "$QGRAD_BUILD" -type f -name "$DEMO" -perm -u+x | head -n1)
echo "demo: running $exe $*"
exec "$exe" "$@"
