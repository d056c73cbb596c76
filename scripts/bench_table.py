#!/usr/bin/env python3
"""Merges qgrad and PyTorch benchmark JSON lines into one Markdown table.

    bench_table.py FILE.jsonl... [--device NAME] [--date YYYY-MM-DD]

Each input line is a JSON object with at least "case" and "ms"; optional
"bench", "gbs", "tops", "tflops", "peak_bytes", "note" and "impl", and the
fraction of the limit the measurement reached: of the device-to-device copy
bandwidth measured in the same run for memory-bound work ("frac_copy",
"fraction_of_copy" or "copy_fraction") or of the int8 / f32 peak for GEMMs
("int8_peak_fraction", "fp8_peak_fraction", "f32_peak_fraction"). A record belongs to PyTorch
when its "impl" says "torch"/"pytorch" or, without "impl", when its file
name starts with "peer_"; otherwise to qgrad. Records with the same "case"
are put on one row; the speed-up column is PyTorch ms / qgrad ms (above 1:
qgrad is faster). A qgrad case "X_graph" (a step captured in a CUDA graph)
with no PyTorch record of its own is compared with PyTorch's "X" (eager).
Lines that are not JSON are ignored. Output (stdout) is a section for
docs/benchmarks.md.
"""
import argparse
import datetime
import json
import os
import sys

RATES = [("gbs", "GB/s"), ("tops", "TOPS"), ("tflops", "TFLOP/s")]
LIMITS = [("frac_copy", "copy"), ("fraction_of_copy", "copy"), ("copy_fraction", "copy"),
          ("int8_peak_fraction", "int8 peak"), ("fp8_peak_fraction", "fp8 peak"), ("f32_peak_fraction", "f32 peak")]


def limit_of(record):
    for key, what in LIMITS:
        v = record.get(key)
        if isinstance(v, (int, float)):
            return f"{100 * v:.0f}% of {what}"
    return ""


def mib(v):
    return f"{v / 2**20:.1f}" if isinstance(v, (int, float)) and v > 0 else ""


MAIN_IMPLS = {"qgrad": "qgrad", "torch": "torch", "pytorch": "torch", "peer": "torch", "torch_eager": "torch"}


def side_and_key(record, path, case):
    """The side (qgrad or torch) and the row of a record. The main
    implementations ("qgrad", and PyTorch's eager "torch"/"torch_eager")
    share the case's row; any other variant ("qgrad_v1", "qgrad_int8_gemm",
    "cublas_bf16", "torch_compile", "torch_int_mm", ...) gets a row of its
    own, "case (impl)", on the side its name starts with."""
    impl = str(record.get("impl", "")).lower()
    if not impl:
        return ("torch" if os.path.basename(path).startswith("peer_") else "qgrad"), case
    if impl in MAIN_IMPLS:
        return MAIN_IMPLS[impl], case
    return ("torch" if impl.startswith("torch") else "qgrad"), f"{case} ({impl})"


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
                side, case = side_and_key(rec, path, str(case))
                if case not in rows:
                    rows[case] = {"bench": rec.get("bench", "")}
                    order.append(case)
                row = rows[case]
                if rec.get("bench") and not row["bench"]:
                    row["bench"] = rec["bench"]
                row[side] = rec
    if not rows:
        print("bench_table.py: no records with \"case\" and \"ms\"", file=sys.stderr)
        return 1

    rate_keys = [(k, unit) for k, unit in RATES
                 if any(k in r.get(s, {}) for r in rows.values() for s in ("qgrad", "torch"))]
    header = ["bench", "case", "qgrad ms", "PyTorch ms", "speed-up"]
    for _, unit in rate_keys:
        header += [f"qgrad {unit}", f"PyTorch {unit}"]
    with_peak = any("peak_bytes" in r.get(s, {}) for r in rows.values() for s in ("qgrad", "torch"))
    header += ["qgrad: fraction of limit"]
    if with_peak:
        header += ["qgrad peak MiB", "PyTorch peak MiB"]
    header += ["note"]

    out = [f"### {args.device}, {args.date}", "",
           "Median of CUDA-event timings (CPU cases: wall clock), both measured in the same run on the "
           "same machine. speed-up = PyTorch ms / qgrad ms. Fraction of limit: of the device-to-device "
           "copy bandwidth measured in the same run (memory-bound kernels) or of the int8 / f32 peak "
           "(GEMMs). Peak MiB: the allocator's peak of bytes held by tensors over the step "
           "(PyTorch: torch.cuda.max_memory_allocated).", "",
           "| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for case in sorted(order, key=lambda c: (rows[c]["bench"], order.index(c))):
        r = rows[case]
        q, t = r.get("qgrad", {}), r.get("torch", {})
        note = ""
        if not t and case.endswith("_graph") and case[: -len("_graph")] in rows:
            t = rows[case[: -len("_graph")]].get("torch", {})
            note = "vs PyTorch eager" if t else ""
        qms, tms = q.get("ms"), t.get("ms")
        speed = f"{tms / qms:.2f}x" if isinstance(qms, (int, float)) and isinstance(tms, (int, float)) and qms > 0 else ""
        cells = [r["bench"], case, fmt(qms), fmt(tms), speed]
        for k, _ in rate_keys:
            cells += [fmt(q.get(k)), fmt(t.get(k))]
        cells.append(limit_of(q))
        if with_peak:
            cells += [mib(q.get("peak_bytes")), mib(t.get("peak_bytes")) if not note else ""]
        cells.append(" ".join(str(x) for x in (note, q.get("note"), t.get("note")) if x))
        out.append("| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |")
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
