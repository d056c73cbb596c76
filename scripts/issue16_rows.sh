#!/usr/bin/env bash
# Every measurement row of issue #16 (docs/benchmarks.md) with qgrad and its strongest PyTorch peer
# from one run, on a build that exists in build-gpu (QGRAD_GPU_BUILD overrides; no build here: the
# device's 600 s a call leaves no room for both). Run from the repository root on the GPU machine:
#   OUT=/some/dir [ISSUE16_SECTIONS="1 2"] [ISSUE16_LIMIT=530] bash scripts/issue16_rows.sh
# Split over two calls on one warm machine, extract each call's logs.tgz under one folder and run
# scripts/issue16_table.py on it.
#
# Order (most important first; every step under `timeout`, each limit also cut to what is left of
# the ${ISSUE16_LIMIT:-530} s budget minus what the later steps keep in reserve):
#   1. item 2, CUDA: bench_train_step --cuda-nets mlp,mlp_fused,mlp_tf32x3 (round 1), peer_train_step.py --net mlp
#      (CUDA cases only, through a wrapper that stops at the first CPU case), bench_train_step
#      (round 2)                                                          est.  8 + 90..150 + 8 s
#   2. item 3: bench_w8a8, peer_w8a8.py, bench_w8a8                       est. 10 + 30..45 + 10 s
#   3. item 4: bench_quant, peer_quant.py, bench_quant                    est.  8 + 15 + 8 s
#              bench_train_ops, peer_train_ops.py, bench_train_ops with QGRAD_BENCH_ONLY matching
#              no transformer row (the #16 rows are outside that filter)  est.  6 + 15 + 6 s
#   4. item 5: scripts/profile_step.sh (ncu, b256 and b4096/h1024 graphs) est. 30..60 s
#   5. item 2, CPU b256, 2 threads, both sides on the same 2 cores (taskset): qgrad, peer
#      (CPU case only: CUDA hidden; the peer's threads pinned while it times, its torch.compile
#      unpinned), qgrad, peer again (compile cached)                      est. 3 + 30..90 + 3 + 15 s
#   6. if time is left: peer_train_step.py --profile-kernels --net mlp    est. 20..40 s
# Then scripts/issue16_table.py over the logs (the #16 table, also $OUT/rows16.md) and $OUT/logs.tgz.
set -u
O=$OUT/logs; mkdir -p "$O"
T0=$SECONDS
LIMIT=${ISSUE16_LIMIT:-530}
B=${QGRAD_GPU_BUILD:-$PWD/build-gpu}
PY=$(command -v python3)
export PATH=/usr/local/cuda/bin:$PATH
for exe in bench_train_step bench_w8a8 bench_quant bench_train_ops; do
  [ -x "$B/bench/$exe" ] || { echo "no $B/bench/$exe: build first"; exit 1; }
done
for k in QGRAD_CUDNN_LIBRARY_DIR QGRAD_NCCL_LIBRARY_DIR; do
  d=$(sed -n "s/^$k:INTERNAL=//p" "$B/CMakeCache.txt"); [ -n "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$O/gpu.txt"
echo "commit $(git rev-parse --short HEAD 2>/dev/null) $(git status --porcelain 2>/dev/null | grep -c .) changed files; $(nproc) cores"
# The 2 cores of the CPU rows (not core 0, where interrupts land).
CPUS=2,3; [ "$(nproc)" -lt 4 ] && CPUS=0,1
PIN=(); command -v taskset >/dev/null && PIN=(taskset -c "$CPUS")

left() { echo $(( LIMIT - (SECONDS - T0) )); }
# ISSUE16_SECTIONS: which numbered sections below run (default all).
SECTIONS=" ${ISSUE16_SECTIONS:-1 2 3 4 5 6} "
want() { [[ "$SECTIONS" == *" $1 "* ]]; }
# The seconds each section keeps in reserve for the ones after it (its share of the budget, not its
# whole run time), so that a step reserves for the wanted sections only: after N prints the sum over
# the wanted sections after N.
declare -A SECTION_RESERVE=([2]=70 [3]=25 [4]=15 [5]=80 [6]=0)
after() {
  local sum=0 j
  for j in 2 3 4 5 6; do
    if [ "$j" -gt "$1" ] && want "$j"; then sum=$((sum + SECTION_RESERVE[$j])); fi
  done
  echo $sum
}
# step NAME CAP RESERVE OUTFILE CMD...: CMD under timeout min(CAP, left - RESERVE), stdout to
# OUTFILE, stderr to OUTFILE.err; skipped (OUTFILE.skipped) when under 5 s would be left.
step() {
  local name=$1 cap=$2 reserve=$3 out=$4; shift 4
  local t=$(( $(left) - reserve )); [ $t -gt $cap ] && t=$cap
  if [ $t -lt 5 ]; then echo "[$((SECONDS-T0))s] SKIP $name ($(left)s left)"; echo "no time" > "$out.skipped"; return 99; fi
  local t1=$SECONDS
  timeout -k 5 $t "$@" > "$out" 2> "$out.err"; local rc=$?
  echo "[$((SECONDS-T0))s] $name rc=$rc in $((SECONDS-t1))s (limit ${t}s)"
  [ $rc = 0 ] || tail -n 3 "$out.err" | cut -c1-200
  return $rc
}

# show CASE_RE IMPL_RE FILE...: one line per case, "case  impl=ms ..." (config / TOPS added).
show() { "$PY" scripts/issue16_table.py --show "$@"; }

# peer_train_step.py's main() with a device filter (its --net mlp runs the CUDA cases, then the
# CPU case, which comes last):
#   cuda ARGS...: stops at the first CPU case (its CUDA records, "_graph" strongest lines included,
#                 are all printed by then);
#   cpu CPUS ARGS...: CUDA hidden (only the CPU case); while it times (peer_train_step.timed),
#                 every thread of the process is pinned to CPUS; warm-up and torch.compile unpinned.
cat > "$O/peer_step_wrap.py" <<'EOF'
import os
import sys

mode = sys.argv[1]
if mode == "cpu":
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    cpus = {int(c) for c in sys.argv[2].split(",")}
    rest = sys.argv[3:]
else:
    rest = sys.argv[2:]
sys.path.insert(0, os.path.abspath("bench"))
import peer_train_step as p  # noqa: E402

sys.argv = ["peer_train_step.py"] + rest


class Stop(BaseException):
    pass


orig_bench, orig_timed = p.bench, p.timed


def bench(device, *a, **k):
    if mode == "cuda" and device != "cuda":
        raise Stop
    return orig_bench(device, *a, **k)


def pin_all(mask):
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), mask)
        except OSError:
            pass


def timed(device, reps, run):
    if mode != "cpu" or device != "cpu":
        return orig_timed(device, reps, run)
    full = os.sched_getaffinity(0)
    pin_all(cpus)
    try:
        return orig_timed(device, reps, run)
    finally:
        pin_all(full)


p.bench, p.timed = bench, timed
try:
    rc = p.main()
except Stop:
    rc = 0
sys.exit(rc)
EOF

STEP_ARGS=(--cuda-nets mlp,mlp_fused,mlp_tf32x3 --cpu-nets none)
if want 1; then
# ---- 1. item 2, CUDA: the MLP step, qgrad / peer / qgrad ----
echo "== item 2 (CUDA step)"
step "bench_train_step mlp r1" 60 $((140 + $(after 1))) "$O/step_cuda_1.jsonl" "$B/bench/bench_train_step" "${STEP_ARGS[@]}"
step "peer_train_step cuda" 240 $((10 + $(after 1))) "$O/peer_step_cuda.jsonl" "$PY" "$O/peer_step_wrap.py" cuda --net mlp
step "bench_train_step mlp r2" 60 "$(after 1)" "$O/step_cuda_2.jsonl" "$B/bench/bench_train_step" "${STEP_ARGS[@]}"
show 'qat_step_cuda' '.' "$O/step_cuda_1.jsonl" "$O/peer_step_cuda.jsonl" "$O/step_cuda_2.jsonl"
fi

if want 2; then
# ---- 2. item 3: W8A8 ----
echo "== item 3 (W8A8)"
W8=('^w8a8_(8192x8192x8192|4096x4096x4096|1x4096x4096|16x4096x4096|128x4096x4096)$' '^(qgrad|cublas_bf16|torch_bf16)$')
step "bench_w8a8 r1" 60 $((40 + $(after 2))) "$O/w8a8_1.jsonl" "$B/bench/bench_w8a8"
step "peer_w8a8" 120 $((10 + $(after 2))) "$O/peer_w8a8.jsonl" bash -c "cd bench && exec '$PY' peer_w8a8.py"
step "bench_w8a8 r2" 60 "$(after 2)" "$O/w8a8_2.jsonl" "$B/bench/bench_w8a8"
show "${W8[@]}" "$O/w8a8_1.jsonl" "$O/peer_w8a8.jsonl" "$O/w8a8_2.jsonl"
fi

if want 3; then
# ---- 3. item 4: the ops ----
echo "== item 4 (ops)"
step "bench_quant r1" 60 $((25 + $(after 3))) "$O/quant_1.jsonl" "$B/bench/bench_quant"
step "peer_quant" 90 $((15 + $(after 3))) "$O/peer_quant.jsonl" bash -c "cd bench && exec '$PY' peer_quant.py"
step "bench_quant r2" 60 $((15 + $(after 3))) "$O/quant_2.jsonl" "$B/bench/bench_quant"
show '^(quantize_per_tensor|dequantize_per_tensor|lerp_fw)$' '.' "$O/quant_1.jsonl" "$O/peer_quant.jsonl" "$O/quant_2.jsonl"
# QGRAD_BENCH_ONLY: a part of no transformer row's name (both sides read it; the #16 rows,
# relu / observers / linear, and the attention rows are outside the filter and always run).
export QGRAD_BENCH_ONLY=__no_transformer_rows__
step "bench_train_ops r1" 60 $((15 + $(after 3))) "$O/train_ops_1.jsonl" "$B/bench/bench_train_ops"
step "peer_train_ops" 90 $((5 + $(after 3))) "$O/peer_train_ops.jsonl" bash -c "cd bench && exec '$PY' peer_train_ops.py --no-compile"
step "bench_train_ops r2" 60 $((5 + $(after 3))) "$O/train_ops_2.jsonl" "$B/bench/bench_train_ops"
unset QGRAD_BENCH_ONLY
show '^(relu_fw|observer_minmax_per_tensor|observer_minmax_per_channel|linear_fwbw_4096x1024x1024)$' '.' \
  "$O/train_ops_1.jsonl" "$O/peer_train_ops.jsonl" "$O/train_ops_2.jsonl"
fi

if want 4; then
# ---- 4. item 5: the profile of the captured step (b256, b4096/h1024) ----
echo "== profile (ncu)"
if command -v ncu >/dev/null; then
  step "profile_step.sh mlp" 150 $((15 + $(after 4))) "$O/profile.log" bash scripts/profile_step.sh "$B" "$O/profile" mlp,mlp_tf32x3
  grep -E '^### |replay without|one at a time|GEMM kernels' "$O/profile/profile.md" 2>/dev/null | cut -c1-150
else
  echo "ncu not found: no profile"
fi
fi

if want 5; then
# ---- 5. item 2, CPU: b256, 2 threads, both sides on cores $CPUS ----
echo "== item 2 (CPU step, cores $CPUS: ${PIN[*]:-not pinned})"
CPU_ARGS=(--cpu-only --cpu-nets mlp --cpu-threads 2)
step "bench_train_step cpu r1" 30 $((80 + $(after 5))) "$O/step_cpu_1.jsonl" "${PIN[@]}" "$B/bench/bench_train_step" "${CPU_ARGS[@]}"
step "peer_train_step cpu r1" 150 $((15 + $(after 5))) "$O/peer_step_cpu_1.jsonl" "$PY" "$O/peer_step_wrap.py" cpu "$CPUS" --net mlp
step "bench_train_step cpu r2" 30 "$(after 5)" "$O/step_cpu_2.jsonl" "${PIN[@]}" "$B/bench/bench_train_step" "${CPU_ARGS[@]}"
step "peer_train_step cpu r2" 60 "$(after 5)" "$O/peer_step_cpu_2.jsonl" "$PY" "$O/peer_step_wrap.py" cpu "$CPUS" --net mlp
show 'qat_step_cpu' '.' "$O"/step_cpu_*.jsonl "$O"/peer_step_cpu_*.jsonl
fi

if want 6; then
# ---- 6. the peer's kernels per step (its side of the profile), if time is left ----
if [ "$(left)" -gt 30 ]; then
  step "peer_train_step --profile-kernels" 90 0 "$O/peer_kernels.jsonl" "$PY" bench/peer_train_step.py --profile-kernels --net mlp
  show 'mlp_b' '.' "$O/peer_kernels.jsonl" | grep -v kernel= | head -4
  grep -h '"kernel_us_per_step"' "$O/peer_kernels.jsonl" | cut -c1-220
fi
fi

echo "== done in $((SECONDS-T0))s; the #16 table:"
if [ -f scripts/issue16_table.py ]; then
  timeout 30 "$PY" scripts/issue16_table.py "$O" > "$OUT/rows16.md" 2> "$O/table.err"; cat "$OUT/rows16.md"
  cp "$OUT/rows16.md" "$O/"
fi
tar czf "$OUT/logs.tgz" -C "$OUT" logs
