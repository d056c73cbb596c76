#!/usr/bin/env python3
"""Compares two benchmark runs (the bench_*.jsonl files of scripts/gpu_check.sh
--bench, or of the bench executables) record by record: same bench, impl and
case (and variant, where present) on both sides; prints a Markdown table of
the median times and the ratio old/new (> 1: the new code is faster).

    scripts/bench_compare.py OLD_DIR NEW_DIR [--threshold 0.05]
    scripts/bench_compare.py OLD_1,OLD_2,OLD_3 NEW_1,NEW_2,NEW_3

With comma-separated folders per side (rounds of an alternated run, as
scripts/ab_bench.sh makes), each side's time is the median over its rounds
and the table gives every round's times as well.

Rows whose ratio falls below 1 - threshold are marked; the exit code is 0
either way (a benchmark is a measurement, not a test).
"""
import argparse
import json
import pathlib


def records(folder):
    out = {}
    for path in sorted(pathlib.Path(folder).glob("bench_*.jsonl")):
        for line in path.read_text().splitlines():
            if not line.startswith("{"):
                continue
            r = json.loads(line)
            if "ms" not in r:
                continue
            key = (r.get("bench"), r.get("impl"), r.get("case"), r.get("variant"))
            out[key] = r
    return out


def rounds(folders):
    """Records of several runs: key -> list of ms, one per run that has it."""
    out = {}
    for folder in folders.split(","):
        for key, r in records(folder).items():
            out.setdefault(key, []).append(r["ms"])
    return out


def median(v):
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--threshold", type=float, default=0.05)
    a = ap.parse_args()
    old, new = rounds(a.old), rounds(a.new)
    several = "," in a.old or "," in a.new
    if several:
        print("| bench | impl | case | old ms (median; rounds) | new ms (median; rounds) | old/new |")
    else:
        print("| bench | impl | case | old ms | new ms | old/new |")
    print("| --- | --- | --- | --- | --- | --- |")
    slower = 0
    for key in sorted(set(old) & set(new), key=lambda k: tuple(str(x) for x in k)):
        o, n = median(old[key]), median(new[key])
        ratio = o / n if n > 0 else float("inf")
        mark = " (slower)" if ratio < 1 - a.threshold else ""
        slower += bool(mark)
        case = key[2] + (f" [{key[3]}]" if key[3] is not None else "")
        if several:
            os_ = " ".join(f"{v:.4f}" for v in old[key])
            ns_ = " ".join(f"{v:.4f}" for v in new[key])
            print(f"| {key[0]} | {key[1]} | {case} | {o:.4f} ({os_}) | {n:.4f} ({ns_}) | {ratio:.3f}{mark} |")
        else:
            print(f"| {key[0]} | {key[1]} | {case} | {o:.4f} | {n:.4f} | {ratio:.3f}{mark} |")
    only = sorted(str(k) for k in set(old) ^ set(new))
    print(f"\n{len(set(old) & set(new))} records compared, {slower} slower by more than "
          f"{a.threshold:.0%}; {len(only)} only on one side")
    for k in only:
        print(f"  only one side: {k}")


if __name__ == "__main__":
    main()
