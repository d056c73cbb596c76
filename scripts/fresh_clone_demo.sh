#!/usr/bin/env bash
# README command 1 (`bash scripts/demo.sh`) from N fresh clones in a row;
# fails on the first failure. Each clone is new (its own build/ folder, as a
# new user has it); ccache, when installed, keeps the N builds short, and
# extra arguments go to the demo (a short schedule keeps the runs short).
#
#   bash scripts/fresh_clone_demo.sh N [DEMO ARGS...]
#   e.g. bash scripts/fresh_clone_demo.sh 20 --epochs 1 --qat-epochs 1 --limit-train 2000 --limit-test 1000
set -euo pipefail
[ $# -ge 1 ] || { sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
N=$1; shift
SRC=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d /tmp/qgrad-fresh.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
if command -v ccache >/dev/null; then
  export CMAKE_CXX_COMPILER_LAUNCHER=ccache CMAKE_CUDA_COMPILER_LAUNCHER=ccache CCACHE_BASEDIR=$WORK
fi
export QGRAD_SKIP_PYTHON=1  # the demo needs no Python; the venv would be made N times
for i in $(seq 1 "$N"); do
  dir=$WORK/clone$i
  git clone -q "$SRC" "$dir"
  start=$SECONDS
  if ! (cd "$dir" && bash scripts/demo.sh --out "$dir/demo-out" "$@") > "$WORK/log$i" 2>&1; then
    echo "fresh clone $i/$N: FAILED; end of its log:"; tail -n 30 "$WORK/log$i"; exit 1
  fi
  last=$(tail -n 1 "$WORK/log$i")
  echo "fresh clone $i/$N: ok ($((SECONDS - start)) s; $last)"
  rm -rf "$dir"
done
echo "fresh clones: $N of $N ran README command 1 successfully"
