#!/usr/bin/env bash
# Quick start, command 1: installs what is missing, builds the main demo and
# runs it (extra arguments are passed to the demo).
set -euo pipefail
DEMO=qgrad-qat-mlp     # the example target this script builds and runs
source "$(dirname "$0")/common.sh"

bash "$QGRAD_ROOT/scripts/setup.sh"
configure_main
# The target list first, then the search: `ninja -t targets | grep -q` under
# pipefail fails whenever grep exits before ninja has written everything
# (ninja dies of SIGPIPE), so a fresh checkout could be told its demo is missing.
targets=$(ninja -C "$QGRAD_BUILD" -t targets all 2>/dev/null || true)
if ! grep -q "^$DEMO:" <<<"$targets"; then
  echo "demo: target $DEMO does not exist in this checkout (examples/ has: $(ls "$QGRAD_ROOT/examples"))" >&2
  exit 1
fi
ninja -C "$QGRAD_BUILD" -j"$QGRAD_JOBS" "$DEMO"
exe=$QGRAD_BUILD/examples/qat_mlp/$DEMO
# The demo prints where its report, metrics, plots and graph went (its last
# line, "output  <absolute folder>/"), so its arguments are not parsed here.
echo "demo: running $exe $*"
exec "$exe" "$@"
