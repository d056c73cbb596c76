#!/usr/bin/env bash
# Profiler evidence for the captured QAT training step (issue #6): runs
# bench_train_step --profile under Nsight Compute twice, once timing every
# kernel node of the replayed graph on its own (--graph-profiling node) and
# once timing the whole graph as one workload (--graph-profiling graph), and
# writes OUT/profile.md: per case, the replay time without a profiler, the
# graph's duration, the sum of its kernels' durations (the rest is launch
# and dependency latency between nodes) and the kernels grouped by name.
#
#   bash scripts/profile_step.sh BUILD_DIR OUT [NETS]
# NETS: bench_train_step --profile-nets (comma-separated: mlp, cnn, vit; default mlp).
set -uo pipefail
[ $# = 2 ] || [ $# = 3 ] || { sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
B=$1
OUT=$(mkdir -p "$2" && cd "$2" && pwd)
NETS=${3:-mlp}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=$(command -v python3)
export PATH=/usr/local/cuda/bin:$PATH
exe=$B/bench/bench_train_step
[ -x "$exe" ] || { echo "no $exe: build first"; exit 1; }
command -v ncu >/dev/null || { echo "ncu not found"; exit 1; }
"$exe" --profile 50 --profile-nets "$NETS" > "$OUT/profile_events.jsonl" || exit 1
for mode in node graph; do
  # --clock-control none: leave the GPU's clocks as they are (the timings
  # elsewhere ran at the same clocks).
  ncu --profile-from-start off --graph-profiling "$mode" --clock-control none \
      --metrics gpu__time_duration.sum --csv --page raw "$exe" --profile 1 --profile-nets "$NETS" \
      > "$OUT/ncu_$mode.csv" 2> "$OUT/ncu_$mode.err" || { echo "ncu ($mode) failed: see $OUT/ncu_$mode.err"; exit 1; }
done
"$PY" "$ROOT/scripts/profile_table.py" "$OUT/profile_events.jsonl" "$OUT/ncu_node.csv" "$OUT/ncu_graph.csv" \
  > "$OUT/profile.md" || exit 1
cat "$OUT/profile.md"
