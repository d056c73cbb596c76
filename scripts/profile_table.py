#!/usr/bin/env python3
"""Turns scripts/profile_step.sh's outputs into a markdown table.

profile_table.py EVENTS.jsonl NCU_NODE.csv NCU_GRAPH.csv

EVENTS.jsonl: bench_train_step --profile lines (case, kernel_nodes,
replay_ms), in the order the cases ran; NCU_NODE.csv: ncu --csv --page raw
with --graph-profiling node (one row per kernel node, the cases' graphs one
after the other); NCU_GRAPH.csv: the same with --graph-profiling graph (one
row per graph).
"""
import csv
import json
import re
import sys


def ncu_rows(path):
    lines = [l for l in open(path, encoding="utf-8", errors="replace") if l.startswith('"')]
    rows = list(csv.DictReader(lines))
    # The first data row holds the units.
    return [r for r in rows if r.get("ID", "").strip().isdigit()]


def duration_us(row):
    v = float(row["gpu__time_duration.sum"].replace(",", ""))
    return v / 1e3  # ns


def short_name(name):
    full = name.replace("<unnamed>::", "").replace("(anonymous namespace)::", "")
    n = full.split("(")[0].split("<")[0].strip()
    n = n.split("::")[-1].replace("void ", "").strip() or "?"
    if n == "Kernel2":  # CUTLASS: the template argument names the kernel
        m = re.search(r"Kernel2<(\w+)>", full)
        if m:
            n = m.group(1)
    if n == "elementwise_kernel":  # name the op by the lambda's enclosing function
        m = re.search(r"(\w+_impl)", full)
        if m:
            n += " (" + m.group(1) + ")"
    return n


def is_gemm(name):
    n = name.lower()
    return any(k in n for k in ("gemm", "xmma", "cutlass", "splitk"))


def main():
    events = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
    nodes = ncu_rows(sys.argv[2])
    graphs = ncu_rows(sys.argv[3])
    out = []
    pos = 0
    for i, ev in enumerate(events):
        k = ev["kernel_nodes"]
        mine = nodes[pos:pos + k]
        pos += k
        total = sum(duration_us(r) for r in mine)
        graph_us = duration_us(graphs[i]) if i < len(graphs) else float("nan")
        out.append(f"### {ev['case']}\n")
        out.append(f"- replay without a profiler: {ev['replay_ms'] * 1e3:.1f} us (median of {ev['replays']}); "
                   f"kernel nodes: {k}, so {ev['replay_ms'] * 1e3 / max(k, 1):.2f} us per node")
        out.append(f"- the kernels profiled one at a time (ncu, caches flushed before each): {len(mine)} kernels, "
                   f"{total:.1f} us in all, {total / max(len(mine), 1):.2f} us each on average")
        gemm = sum(duration_us(r) for r in mine if is_gemm(r["Kernel Name"]))
        out.append(f"- of which cuBLAS/CUTLASS GEMM kernels: {gemm:.1f} us ({100 * gemm / max(total, 1e-9):.0f}%)")
        out.append(f"- the whole graph as one ncu workload: {graph_us:.1f} us (profiler instrumentation "
                   f"included: an upper bound, not a timing)\n")
        groups = {}
        for r in mine:
            n = short_name(r["Kernel Name"])
            g = groups.setdefault(n, [0, 0.0])
            g[0] += 1
            g[1] += duration_us(r)
        out.append("| kernel | launches | total us | mean us | share of kernel time |")
        out.append("| --- | --- | --- | --- | --- |")
        for n, (c, t) in sorted(groups.items(), key=lambda kv: -kv[1][1]):
            out.append(f"| `{n}` | {c} | {t:.1f} | {t / c:.2f} | {100 * t / total:.0f}% |")
        out.append("")
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
