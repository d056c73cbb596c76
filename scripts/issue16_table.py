#!/usr/bin/env python3
"""Issue #16's rows from the logs of scripts/issue16_rows.sh: one markdown table, a row per target.

    issue16_table.py LOGDIR [--pick conservative|median]
    issue16_table.py --show CASE_RE IMPL_RE FILE...   (the run's progress lines)

Reads every *.jsonl under LOGDIR (recursively) and keeps the JSON lines of
  bench_train_step ("bench":"train_step", "impl":"qgrad", "case", "ms", "peak_bytes", ...),
  peer_train_step.py ("bench":"train_step", "impl":"torch..." per configuration; its summary lines
      "<case>_graph" (CUDA) / "<case>_strongest" (CPU) with "config"; "error" lines of a configuration
      that could not run),
  bench_w8a8 / peer_w8a8.py ("bench":"w8a8", "case":"w8a8_MxNxK", "impl" qgrad | qgrad_act_quant |
      qgrad_int8_gemm | cublas_bf16 | torch_eager | torch_int_mm | torch_bf16, "ms", "tops"),
  bench_quant / peer_quant.py ("bench":"quant", "impl" qgrad | torch),
  bench_train_ops / peer_train_ops.py ("bench":"train_ops", "impl" qgrad | torch),
  bench_train_step --profile ("bench":"train_step_profile": "kernel_nodes", "replay_ms"),
  peer_train_step.py --profile-kernels ("bench":"train_step_peer_kernels": "kernel_us_per_step",
      "gemm_us_per_step", "launches_per_step"),
and profile/profile.md (scripts/profile_table.py) for the kernels' sum under ncu.

A measurement repeated over rounds (the same bench, impl and case in several files) is kept per
round. --pick conservative (default): qgrad's slowest round against the peer's fastest
configuration in its fastest round; --pick median: the median of the rounds on both sides (the
peer's strongest configuration is then the one with the lowest median). ratio = peer ms / qgrad ms
(above 1: qgrad faster); the 8192^3 W8A8 target is qgrad's own TOPS (2 M N K / time).
"""
import argparse
import glob
import json
import os
import re
import statistics
import sys

STEP_CONFIG_NAMES = {
    "torch": "torch.ao QAT, eager",
    "torch_tensorop": "tensor-op fake quant, eager",
    "torch_tensorop_compiled": "tensor-op, torch.compile",
    "torch_tensorop_graph": "tensor-op, eager, whole step in a CUDA graph",
    "torch_tensorop_compiled_graph": "tensor-op, compiled, whole step in a CUDA graph",
}
W8A8_PEER_NAMES = {
    "cublas_bf16": "bf16 cuBLAS (cublasGemmEx, bench_w8a8)",
    "torch_bf16": "PyTorch bf16 matmul",
}


def records(path):
    """The JSON objects of a benchmark log, one a line; other lines skipped."""
    try:
        f = open(path, encoding="utf-8", errors="replace")
    except OSError:
        return
    with f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if isinstance(r, dict):
                yield r


def show(case_re, impl_re, paths):
    """One line per case, "case: impl=ms ..." (config / TOPS added): the run's progress lines."""
    case_re, impl_re = re.compile(case_re), re.compile(impl_re)
    rows = {}
    for path in paths:
        for r in records(path):
            c, i = str(r.get("case", "")), str(r.get("impl", ""))
            if not case_re.search(c) or not impl_re.search(i):
                continue
            if "ms" in r:
                v = f"{r['ms']:.4f}" + (f"[{r['config']}]" if "config" in r else "") + \
                    (f"({r['tops']:.0f}T)" if isinstance(r.get("tops"), (int, float)) else "")
            elif "error" in r:
                v = "ERROR:" + str(r["error"])[:60]
            else:
                continue
            rows.setdefault(c, []).append(f"{i}={v}")
    for c, vs in rows.items():
        print(f"  {c}: " + " ".join(vs))


def load(logdir):
    """(bench, impl, case) -> list of (record, file), in file order; errors; files read."""
    recs, errors, files = {}, [], []
    for path in sorted(glob.glob(os.path.join(logdir, "**", "*.jsonl"), recursive=True)):
        files.append(os.path.relpath(path, logdir))
        for r in records(path):
                key = (str(r.get("bench", "")), str(r.get("impl", "")), str(r.get("case", "")))
                if "error" in r:
                    errors.append((os.path.relpath(path, logdir), r))
                recs.setdefault(key, []).append((r, os.path.relpath(path, logdir)))
    return recs, errors, files


def ms_list(recs, bench, impl, case):
    return [r["ms"] for r, _ in recs.get((bench, impl, case), []) if isinstance(r.get("ms"), (int, float))]


def fmt_ms(v):
    if v is None:
        return "-"
    return f"{v:.4f}" if v < 10 else f"{v:.2f}"


def rounds_str(vals):
    return " / ".join(fmt_ms(v) for v in vals)


class Picker:
    def __init__(self, how):
        self.how = how

    def qgrad(self, vals):
        if not vals:
            return None
        return max(vals) if self.how == "conservative" else statistics.median(vals)

    def peer(self, vals):
        if not vals:
            return None
        return min(vals) if self.how == "conservative" else statistics.median(vals)


def strongest(picker, candidates):
    """candidates: {config: [ms per round]} -> (config, ms) of the fastest, or (None, None)."""
    best = None
    for config, vals in candidates.items():
        v = picker.peer(vals)
        if v is not None and (best is None or v < best[1]):
            best = (config, v)
    return best or (None, None)


def profile_md(logdir):
    """case -> dict from profile/profile.md (scripts/profile_table.py's lines)."""
    out = {}
    for path in glob.glob(os.path.join(logdir, "**", "profile.md"), recursive=True):
        case = None
        for line in open(path, encoding="utf-8", errors="replace"):
            m = re.match(r"### (\S+)", line)
            if m:
                case = m.group(1)
                out.setdefault(case, {})
                continue
            if case is None:
                continue
            m = re.search(r"one at a time.*?: (\d+) kernels, ([\d.]+) us in all", line)
            if m:
                out[case]["ncu_kernels"], out[case]["ncu_sum_us"] = int(m.group(1)), float(m.group(2))
            m = re.search(r"GEMM kernels: ([\d.]+) us \((\d+)%\)", line)
            if m:
                out[case]["gemm_us"], out[case]["gemm_pct"] = float(m.group(1)), int(m.group(2))
    return out


def step_row(recs, picker, prof, prof_md, peer_kernels, q_case, p_case, device):
    q_vals = ms_list(recs, "train_step", "qgrad", q_case)
    # The peer's configurations: every "torch*" record of the case itself (the per-configuration lines).
    cands = {}
    for (bench, impl, case), lst in recs.items():
        if bench == "train_step" and case == p_case and impl.startswith("torch"):
            vals = [r["ms"] for r, _ in lst if isinstance(r.get("ms"), (int, float))]
            if vals:
                cands[impl] = vals
    config, p = strongest(picker, cands)
    if config is None:  # only the summary line (the peer's own choice) is there
        summary = p_case + ("_graph" if device == "cuda" else "_strongest")
        lst = [r for r, _ in recs.get(("train_step", "torch", summary), []) if isinstance(r.get("ms"), (int, float))]
        if lst:
            config = lst[0].get("config", "?")
            p = picker.peer([r["ms"] for r in lst])
    notes = []
    if len(q_vals) > 1:
        notes.append(f"qgrad rounds {rounds_str(q_vals)}")
    if device == "cuda":
        eager = ms_list(recs, "train_step", "qgrad", q_case[: -len("_graph")])
        in_order = ms_list(recs, "train_step", "qgrad", q_case + "_in_order")
        if eager:
            notes.append(f"qgrad eager {rounds_str(eager)}")
        if in_order:
            notes.append(f"without PDL {rounds_str(in_order)}")
        peaks = [r.get("peak_bytes") for r, _ in recs.get(("train_step", "qgrad", q_case), [])]
        ppeaks = [r.get("peak_bytes") for r, _ in recs.get(("train_step", config or "", p_case), [])]
        if peaks and isinstance(peaks[0], (int, float)) and ppeaks and isinstance(ppeaks[0], (int, float)):
            notes.append(f"peak {peaks[0] / 2**20:.1f} vs {ppeaks[0] / 2**20:.1f} MiB")
    others = [f"{c} {fmt_ms(picker.peer(v))}" for c, v in sorted(cands.items(), key=lambda kv: min(kv[1]))
              if c != config]
    if others:
        notes.append("other configs: " + ", ".join(others))
    if config and len(cands.get(config, [])) > 1:
        notes.append(f"peer rounds {rounds_str(cands[config])}")
    errs = [f"{impl}: error" for (bench, impl, case), lst in recs.items()
            if bench == "train_step" and case == p_case and any("error" in r for r, _ in lst)]
    if errs:
        notes.append("; ".join(errs))
    ev = prof.get(q_case)
    if ev:
        s = f"graph {ev['kernel_nodes']} kernel nodes, replay {ev['replay_ms'] * 1e3:.1f} us " \
            f"({ev['replay_ms'] * 1e3 / max(ev['kernel_nodes'], 1):.2f} us/node)"
        md = prof_md.get(q_case, {})
        if "ncu_sum_us" in md:
            s += f", ncu sum {md['ncu_sum_us']:.1f} us"
            if "gemm_pct" in md:
                s += f" ({md['gemm_pct']}% GEMM)"
        notes.append(s)
    pk = peer_kernels.get(p_case)
    if pk:
        notes.append(f"peer graph: {pk.get('launches_per_step')} launches, {pk.get('kernel_us_per_step')} us of "
                     f"kernels ({pk.get('gemm_us_per_step')} GEMM)")
    name = STEP_CONFIG_NAMES.get(config, config) if config else None
    return picker.qgrad(q_vals), (f"{name} (`{config}`)" if config else None), p, notes


def w8a8_row(recs, picker, shape, with_torch_bf16):
    q_vals = ms_list(recs, "w8a8", "qgrad", "w8a8_" + shape)
    case = "w8a8_" + shape
    cands = {"cublas_bf16": ms_list(recs, "w8a8", "cublas_bf16", case)}
    tb = ms_list(recs, "w8a8", "torch_bf16", case)
    if with_torch_bf16:
        cands["torch_bf16"] = tb
    cands = {k: v for k, v in cands.items() if v}
    config, p = strongest(picker, cands)
    notes = []
    if len(q_vals) > 1:
        notes.append(f"qgrad rounds {rounds_str(q_vals)}")
    if config and len(cands[config]) > 1:
        notes.append(f"bf16 rounds {rounds_str(cands[config])}")
    if with_torch_bf16:
        other = [f"{c} {fmt_ms(picker.peer(v))}" for c, v in cands.items() if c != config]
        if other:
            notes.append("other: " + ", ".join(other))
    elif tb:
        notes.append(f"torch_bf16 {fmt_ms(picker.peer(tb))} (one weight, L2-resident: not the peer)")
    te = ms_list(recs, "w8a8", "torch_eager", case)
    if te:
        notes.append(f"PyTorch W8A8 eager {fmt_ms(min(te))}")
    gemm = ms_list(recs, "w8a8", "qgrad_int8_gemm", case)
    if gemm:
        notes.append(f"int8 GEMM alone {fmt_ms(min(gemm))}")
    name = W8A8_PEER_NAMES.get(config, config) if config else None
    return picker.qgrad(q_vals), (f"{name} (`{config}`)" if config else None), p, notes


def op_row(recs, picker, bench, case):
    q_vals = ms_list(recs, bench, "qgrad", case)
    p_vals = ms_list(recs, bench, "torch", case)
    notes = []
    if len(q_vals) > 1:
        notes.append(f"qgrad rounds {rounds_str(q_vals)}")
    for r, _ in recs.get((bench, "qgrad", case), [])[:1]:
        for k in ("frac_copy", "fraction_of_copy"):
            if isinstance(r.get(k), (int, float)):
                notes.append(f"qgrad {100 * r[k]:.0f}% of copy")
        if isinstance(r.get("f32_peak_fraction"), (int, float)):
            notes.append(f"qgrad {100 * r['f32_peak_fraction']:.0f}% of f32 peak")
    for r, _ in recs.get((bench, "torch", case), [])[:1]:
        if r.get("note"):
            notes.append("peer: " + str(r["note"]))
    return picker.qgrad(q_vals), ("PyTorch eager (`torch`)" if p_vals else None), picker.peer(p_vals), notes


ROWS = [
    # item, row, kind, arguments, (target kind, value)
    ("2", "MLP QAT step b256 h256, CUDA, captured", "step",
     dict(q_case="qat_step_cuda_b256_h256_graph", p_case="qat_step_cuda_b256_h256", device="cuda"), ("x", 3.0)),
    ("2", "MLP QAT step b256 h256, CUDA, captured, forward + loss + backward as one fused kernel", "step",
     dict(q_case="qat_step_cuda_b256_h256_fused_graph", p_case="qat_step_cuda_b256_h256", device="cuda"),
     ("x", 3.0)),
    ("2", "MLP QAT step b4096 h1024, CUDA, captured", "step",
     dict(q_case="qat_step_cuda_b4096_h1024_graph", p_case="qat_step_cuda_b4096_h1024", device="cuda"), ("x", 1.5)),
    ("2", "MLP QAT step b4096 h1024, CUDA, captured, f32 products as tf32x3", "step",
     dict(q_case="qat_step_cuda_b4096_h1024_tf32x3_graph", p_case="qat_step_cuda_b4096_h1024", device="cuda"),
     ("x", 1.5)),
    ("2", "MLP QAT step b256 h256, CPU, 2 threads", "step",
     dict(q_case="qat_step_cpu_b256_h256", p_case="qat_step_cpu_b256_h256", device="cpu"), ("x", 1.5)),
    ("3", "W8A8 end to end 8192³", "w8a8", dict(shape="8192x8192x8192", with_torch_bf16=True), ("tops", 1400.0)),
    ("3", "W8A8 end to end 4096³", "w8a8", dict(shape="4096x4096x4096", with_torch_bf16=True), ("x", 1.3)),
    ("3", "W8A8 M = 1, N = K = 4096", "w8a8", dict(shape="1x4096x4096", with_torch_bf16=False), ("x", 1.0)),
    ("3", "W8A8 M = 16, N = K = 4096", "w8a8", dict(shape="16x4096x4096", with_torch_bf16=False), ("x", 1.0)),
    ("3", "W8A8 M = 128, N = K = 4096", "w8a8", dict(shape="128x4096x4096", with_torch_bf16=False), ("x", 1.0)),
    ("4", "`quantize_per_tensor` f32 → s8, 256M", "op", dict(bench="quant", case="quantize_per_tensor"), ("x", 1.0)),
    ("4", "`dequantize_per_tensor` s8 → f32, 256M", "op", dict(bench="quant", case="dequantize_per_tensor"),
     ("x", 1.0)),
    ("4", "relu forward, 64M", "op", dict(bench="train_ops", case="relu_fw"), ("x", 1.0)),
    ("4", "observer min/max per tensor, 64M", "op", dict(bench="train_ops", case="observer_minmax_per_tensor"),
     ("x", 1.0)),
    ("4", "observer min/max per channel, 8192 × 8192", "op",
     dict(bench="train_ops", case="observer_minmax_per_channel"), ("x", 1.0)),
    ("4", "lerp forward, 256M", "op", dict(bench="quant", case="lerp_fw"), ("x", 1.0)),
    ("4", "f32 linear fw + bw 4096 × 1024 × 1024", "op", dict(bench="train_ops", case="linear_fwbw_4096x1024x1024"),
     ("x", 1.0)),
]


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--show":  # --show CASE_RE IMPL_RE FILE...
        show(sys.argv[2], sys.argv[3], sys.argv[4:])
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("logdir")
    ap.add_argument("--pick", choices=("conservative", "median"), default="conservative")
    a = ap.parse_args()
    recs, errors, files = load(a.logdir)
    if not recs:
        print(f"no JSON records under {a.logdir}", file=sys.stderr)
        return 1
    picker = Picker(a.pick)
    prof = {}
    for (bench, _, case), lst in recs.items():
        if bench == "train_step_profile":
            prof[case] = lst[-1][0]
    peer_kernels = {}
    for (bench, _, case), lst in recs.items():
        if bench == "train_step_peer_kernels":
            for r, _ in lst:
                if "kernel_us_per_step" in r:
                    m = re.match(r"mlp_b(\d+)_(\d+)$", case)
                    if m:
                        peer_kernels[f"qat_step_cuda_b{m.group(1)}_h{m.group(2)}"] = r
    prof_md = profile_md(a.logdir)

    devices = sorted({str(r.get("device")) for lst in recs.values() for r, _ in lst
                      if r.get("device") and not str(r.get("device")).startswith("cpu")})
    torches = sorted({str(r.get("torch")) for lst in recs.values() for r, _ in lst if r.get("torch")})
    print(f"Issue #16, every row (device: {', '.join(devices) or '?'}; PyTorch {', '.join(torches) or '?'}; "
          f"ms, medians of each run; pick: {a.pick}"
          + (": qgrad's slowest round, the peer's fastest" if a.pick == "conservative" else ": medians of the rounds")
          + "; ratio = peer / qgrad)\n")
    print("| item | row | qgrad | strongest peer (configuration) | ratio | target | status | notes |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    counts = {"met": 0, "missed": 0, "not measured": 0}
    for item, label, kind, kw, (tkind, tval) in ROWS:
        if kind == "step":
            q, cfg, p, notes = step_row(recs, picker, prof, prof_md, peer_kernels, **kw)
        elif kind == "w8a8":
            q, cfg, p, notes = w8a8_row(recs, picker, **kw)
        else:
            q, cfg, p, notes = op_row(recs, picker, **kw)
        ratio = p / q if (q and p) else None
        if tkind == "tops":
            m, n, k = (int(v) for v in kw["shape"].split("x"))
            tops = 2.0 * m * n * k / (q * 1e-3) / 1e12 if q else None
            target = f"≥ {tval:.0f} TOPS"
            ok = None if tops is None else tops >= tval
            qcell = f"{fmt_ms(q)} ({tops:.0f} TOPS)" if tops else "-"
            gap = f"needs ≤ {2.0 * m * n * k / (tval * 1e12) * 1e3:.4f} ms" if ok is False else ""
        else:
            target = f"≥ {tval:g}x"
            ok = None if ratio is None else ratio >= tval
            qcell = fmt_ms(q)
            gap = f"needs ≤ {p / tval:.4f} ms" if ok is False else ""
        if gap:
            notes = [gap] + notes
        status = "not measured" if ok is None else ("**met**" if ok else "missed")
        counts[status.strip("*")] += 1
        pcell = f"{fmt_ms(p)}: {cfg}" if p is not None else "-"
        rcell = f"{ratio:.3f}x" if ratio is not None else "-"
        cells = [item, label, qcell, pcell, rcell, target, status, "; ".join(notes)]
        print("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    print(f"\n{counts['met']} met, {counts['missed']} missed, {counts['not measured']} not measured "
          f"(of {len(ROWS)}).")
    if errors:
        print("\nConfigurations that reported an error:")
        for path, r in errors[:12]:
            print(f"- {path}: {r.get('impl')} {r.get('case')}: {str(r.get('error'))[:160]}")
    skipped = sorted(os.path.relpath(p, a.logdir) for p in glob.glob(os.path.join(a.logdir, "*.skipped")))
    if skipped:
        print("\nSteps skipped for lack of time: " + ", ".join(s[: -len(".skipped")] for s in skipped))
    return 0


if __name__ == "__main__":
    sys.exit(main())
