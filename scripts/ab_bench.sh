#!/usr/bin/env bash
# A/B benchmark of this tree against another source tree (for example an
# older commit: `git archive COMMIT | tar -x -C .baseline`), on one machine
# in one call: builds the chosen bench programs of both trees, then runs them
# alternately for several rounds (the order flips each round, so clock and
# thermal drift falls on both sides alike) and prints scripts/bench_compare.py's
# table of the medians over the rounds. --profile also runs
# scripts/profile_step.sh (ncu per kernel of the captured QAT step) for both.
#
#   bash scripts/ab_bench.sh BASE_SRC OUT [--rounds 3] [--bench "w8a8 train_step"] [--profile] [--jobs 16]
#
# OUT/old_<r>/bench_*.jsonl, OUT/new_<r>/bench_*.jsonl, OUT/compare.md,
# OUT/profile_{old,new}/profile.md.
set -uo pipefail
usage() { sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
[ $# -ge 2 ] || usage
BASE=$(cd "$1" && pwd) || usage
OUT=$(mkdir -p "$2" && cd "$2" && pwd); shift 2
ROUNDS=3 BENCHES="w8a8 train_step" PROFILE=0 JOBS=16
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) ROUNDS=$2; shift ;;
    --bench) BENCHES=$2; shift ;;
    --profile) PROFILE=1 ;;
    --jobs) JOBS=$2; shift ;;
    *) usage ;;
  esac
  shift
done
ROOT=$(cd "$(dirname "$0")/.." && pwd)
export PATH=/usr/local/cuda/bin:$PATH
NEW_B=${QGRAD_GPU_BUILD:-$ROOT/build-gpu}
OLD_B=$BASE/build-ab
targets=(); for b in $BENCHES; do targets+=("bench_$b"); done

# Both trees in Release for sm_90 (the baseline may predate CMakePresets.json).
(cd "$ROOT" && cmake --preset gpu -B "$NEW_B") > "$OUT/configure_new.log" 2>&1 &&
  ninja -C "$NEW_B" -j"$JOBS" "${targets[@]}" > "$OUT/build_new.log" 2>&1 || { echo "new build FAILED"; tail -n 30 "$OUT/build_new.log"; exit 1; }
cmake -S "$BASE" -B "$OLD_B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DQGRAD_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  > "$OUT/configure_old.log" 2>&1 &&
  ninja -C "$OLD_B" -j"$JOBS" "${targets[@]}" > "$OUT/build_old.log" 2>&1 || { echo "old build FAILED"; tail -n 30 "$OUT/build_old.log"; exit 1; }

run_side() {  # side round
  local b=$NEW_B; [ "$1" = old ] && b=$OLD_B
  mkdir -p "$OUT/$1_$2"
  for t in "${targets[@]}"; do "$b/bench/$t" > "$OUT/$1_$2/$t.jsonl" 2> "$OUT/$1_$2/$t.err" || echo "$1 round $2: $t failed"; done
}
olds=() news=()
for r in $(seq 1 "$ROUNDS"); do
  if [ $((r % 2)) = 1 ]; then run_side old "$r"; run_side new "$r"; else run_side new "$r"; run_side old "$r"; fi
  olds+=("$OUT/old_$r") news+=("$OUT/new_$r")
  echo "round $r done"
done
join() { local IFS=,; echo "$*"; }
python3 "$ROOT/scripts/bench_compare.py" "$(join "${olds[@]}")" "$(join "${news[@]}")" | tee "$OUT/compare.md"

if [ $PROFILE = 1 ] && [[ " $BENCHES " == *" train_step "* ]]; then
  bash "$ROOT/scripts/profile_step.sh" "$NEW_B" "$OUT/profile_new" > /dev/null || echo "profile (new) failed"
  bash "$ROOT/scripts/profile_step.sh" "$OLD_B" "$OUT/profile_old" > /dev/null || echo "profile (old) failed"
fi
