#!/usr/bin/env bash
# The GPU part of issue #17, for the lead on a machine with 2 or 4 GPUs:
#   scripts/dist_check.sh OUTDIR [BUILD_DIR]
# 1. the NCCL tests (ctest -L nccl: collectives of every op and dtype on 2 and
#    4 GPUs, each skipped when the machine has fewer);
# 2. weak scaling of the QAT MLP step at b4096/h4096 per GPU on 1, 2 and 4
#    GPUs (as many as present): qgrad (bench_ddp_step under qgrad-run, NCCL)
#    and PyTorch DDP on NCCL (bench/peer_ddp.py under torchrun, compiled,
#    gradient_as_bucket_view, static_graph), in the same run.
# Writes OUTDIR/nccl_ctest.log and OUTDIR/ddp_scaling.jsonl (one JSON line per
# implementation and GPU count) and prints a table with the efficiencies.
# BUILD_DIR defaults to build-gpu (configure and build it first, e.g. with
# scripts/gpu_check.sh, which puts NCCL's and cuDNN's folders on LD_LIBRARY_PATH
# the same way as below).
set -u
OUT=${1:?usage: dist_check.sh OUTDIR [BUILD_DIR]}
B=${2:-build-gpu}
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
for v in QGRAD_NCCL_LIBRARY_DIR QGRAD_CUDNN_LIBRARY_DIR; do
  d=$(sed -n "s/^$v:INTERNAL=//p" "$B/CMakeCache.txt" 2>/dev/null)
  [ -n "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
echo "GPUs: $gpus"
(cd "$B" && ctest -L nccl --output-on-failure --timeout 300) 2>&1 | tee "$OUT/nccl_ctest.log"
: > "$OUT/ddp_scaling.jsonl"
PY=${PYTHON:-python3}
for n in 1 2 4; do
  [ "$n" -le "$gpus" ] || continue
  if [ "$n" = 1 ]; then
    "$B/bench/bench_ddp_step" | tee -a "$OUT/ddp_scaling.jsonl"
    "$PY" bench/peer_ddp.py | tee -a "$OUT/ddp_scaling.jsonl"
  else
    "$B/qgrad-run" --nproc-per-node "$n" "$B/bench/bench_ddp_step" | tee -a "$OUT/ddp_scaling.jsonl"
    "$PY" -m torch.distributed.run --standalone --nproc-per-node "$n" bench/peer_ddp.py \
      | grep '^{' | tee -a "$OUT/ddp_scaling.jsonl"
  fi
done
"$PY" - "$OUT/ddp_scaling.jsonl" <<'PYEOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
base = {r["impl"]: r["samples_per_s"] for r in rows if r["world"] == 1}
print("| impl | GPUs | step ms (median) | samples/s | weak-scaling speedup | efficiency |")
print("|---|---|---|---|---|---|")
for r in rows:
    b = base.get(r["impl"])
    s = r["samples_per_s"] / b if b else float("nan")
    print(f"| {r['impl']} | {r['world']} | {r['ms_median']:.2f} | {r['samples_per_s']:.0f} | {s:.2f}x | {s / r['world']:.1%} |")
PYEOF
