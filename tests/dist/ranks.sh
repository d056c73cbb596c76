#!/usr/bin/env bash
# Starts WORLD ranks of a command by hand (no launcher: a rank that dies does
# not take the others down), each with RANK/LOCAL_RANK/WORLD_SIZE/MASTER_ADDR/
# MASTER_PORT set, waits for all, prints each rank's exit code and exits with
# rank 0's. EXPECT_RANK1=<code> also requires rank 1 to end with that code.
#   ranks.sh WORLD COMMAND ARGS...
set -u
world=$1; shift
port=$(( 20000 + (RANDOM * 32768 + RANDOM) % 40000 ))
pids=()
for ((r = 0; r < world; r++)); do
  RANK=$r LOCAL_RANK=$r WORLD_SIZE=$world MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$@" &
  pids+=($!)
done
codes=()
for ((r = 0; r < world; r++)); do
  wait "${pids[$r]}"; codes+=($?)
  echo "ranks.sh: rank $r exited with ${codes[$r]}"
done
if [ -n "${EXPECT_RANK1:-}" ] && [ "${codes[1]}" != "$EXPECT_RANK1" ]; then
  echo "ranks.sh: rank 1 should have exited with $EXPECT_RANK1"; exit 1
fi
exit "${codes[0]}"
