#!/usr/bin/env python3
"""Merges qgrad and PyTorch benchmark JSON lines into one Markdown table.

    bench_table.py FILE.jsonl... [--device NAME] [--date YYYY-MM-DD]

Each input line is a JSON object with at least "case" and "ms"; optional
"bench", "gbs", "frac_copy", "tops", "tflops", "note" and "impl". A record
belongs to PyTorch when its "impl" says "torch"/"pytorch" or, without
"impl", when its file name starts with "peer_"; otherwise to qgrad. Records
with the same "case" are put on one row; the speed-up column is PyTorch ms /
qgrad ms (above 1: qgrad is faster). Lines that are not JSON are ignored.
Output (stdout) is a section for docs/benchmarks.md.
"""
import argparse
import datetime
import json
import os
import sys

RATES = [("gbs", "GB/s"), ("tops", "TOPS"), ("tflops", "TFLOP/s")]


def side_of(record, path):
    impl = str(record.get("impl", "")).lower()
    if impl:
        return "torch" if impl in ("torch", "pytorch", "peer") else "qgrad"
    return "torch" if os.path.basename(path).startswith("peer_") else "qgrad"


def fmt(v, digits=3):
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.{digits}g}" if abs(v) < 1000 else f"{v:.0f}"
    return str(v)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+")
    ap.add_argument("--device", default="unknown device")
    ap.add_argument("--date", default=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"))
    args = ap.parse_args()

    rows = {}   # case -> {"bench": ..., "qgrad": rec, "torch": rec}
    order = []
    for path in args.files:
        with open(path, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if not line.startswith("{"):
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue
                case = rec.get("case")
                if case is None or "ms" not in rec:
                    continue
                case = str(case)
                if case not in rows:
                    rows[case] = {"bench": rec.get("bench", "")}
                    order.append(case)
                row = rows[case]
                if rec.get("bench") and not row["bench"]:
                    row["bench"] = rec["bench"]
                row[side_of(rec, path)] = rec
    if not rows:
        print("bench_table.py: no records with \"case\" and \"ms\"", file=sys.stderr)
        return 1

    rate_keys = [(k, unit) for k, unit in RATES
                 if any(k in r.get(s, {}) for r in rows.values() for s in ("qgrad", "torch"))]
    header = ["bench", "case", "qgrad ms", "PyTorch ms", "speed-up"]
    for _, unit in rate_keys:
        header += [f"qgrad {unit}", f"PyTorch {unit}"]
    header += ["qgrad % of copy", "note"]

    out = [f"### {args.device}, {args.date}", "",
           "Median of CUDA-event timings, both measured in the same run on the same machine. "
           "speed-up = PyTorch ms / qgrad ms.", "",
           "| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for case in sorted(order, key=lambda c: (rows[c]["bench"], order.index(c))):
        r = rows[case]
        q, t = r.get("qgrad", {}), r.get("torch", {})
        qms, tms = q.get("ms"), t.get("ms")
        speed = f"{tms / qms:.2f}x" if isinstance(qms, (int, float)) and isinstance(tms, (int, float)) and qms > 0 else ""
        cells = [r["bench"], case, fmt(qms), fmt(tms), speed]
        for k, _ in rate_keys:
            cells += [fmt(q.get(k)), fmt(t.get(k))]
        frac = q.get("frac_copy")
        cells.append(f"{100 * frac:.0f}%" if isinstance(frac, (int, float)) else "")
        cells.append(" ".join(str(x) for x in (q.get("note"), t.get("note")) if x))
        out.append("| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |")
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
