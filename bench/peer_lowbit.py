#!/usr/bin/env python3
"""PyTorch peer of bench/bench_lowbit.cpp: the same "case" keys, JSON lines.

  w4a16_<M>x<N>x<K>: PyTorch's int4 weight-only paths that this environment
      has, each detected and recorded (impl "torch_int4pack_g128":
      torch._weight_int4pack_mm on torch._convert_weight_to_int4pack's
      tinygemm layout, groups of 128; impl "torchao_int4wo_g128": torchao's
      Int4WeightOnlyConfig when torchao imports), and bf16
      torch.nn.functional.linear (impl "torch_bf16"). Weights rotate over
      sets larger than L2, as in bench_lowbit.cpp.
  w4a8_<M>x<N>x<K>: the W8A8 composition of peer_w8a8.py (per-token int8 +
      torch._int_mm + scaling; impl "torch_eager"), torchao's
      Int8DynamicActivationInt4WeightConfig when torchao imports (impl
      "torchao_8da4w_g128"), and bf16 linear (impl "torch_bf16").
A record {"available": {...}} says which int4 paths were present.
"""
import json

import torch

from torch_timing import time_cuda


def emit(**kw):
    print(json.dumps({"bench": "lowbit", **kw}), flush=True)


def timed(case, impl, fn, reps, ops, **extra):
    ms, min_ms = time_cuda(fn, reps, 10)
    emit(case=case, impl=impl, ms=ms, min_ms=min_ms, tops=ops / ms / 1e9, **extra)
    return ms


def int4pack_weights(n, k, group, copies, dev):
    """tinygemm operands: uint8 [N, K/2] (even element in the high nibble), the
    packed layout, and scales-and-zeros [K/G, N, 2] bf16."""
    out = []
    for _ in range(copies):
        q = torch.randint(0, 16, (n, k), device=dev, dtype=torch.int32)
        packed_u8 = ((q[:, ::2] << 4) | q[:, 1::2]).to(torch.uint8)
        packed = torch._convert_weight_to_int4pack(packed_u8, 8)
        sz = torch.empty(k // group, n, 2, device=dev, dtype=torch.bfloat16)
        sz[..., 0].uniform_(0.01, 0.02)
        sz[..., 1].zero_()
        out.append((packed, sz))
    return out


def torchao_module(config_name, n, k, group, dev):
    import torchao  # noqa: F401
    from torchao import quantization as tq
    lin = torch.nn.Linear(k, n, bias=False, device=dev, dtype=torch.bfloat16)
    cfg = getattr(tq, config_name)(group_size=group)
    tq.quantize_(lin, cfg)
    return lin


def main():
    available = {"torch": torch.__version__, "cuda": torch.cuda.is_available(),
                 "_weight_int4pack_mm": hasattr(torch, "_weight_int4pack_mm"),
                 "_convert_weight_to_int4pack": hasattr(torch, "_convert_weight_to_int4pack")}
    try:
        import torchao
        available["torchao"] = torchao.__version__
    except Exception as e:  # not installed, or not importable here
        available["torchao"] = None
        available["torchao_error"] = str(e)[:200]
    if not torch.cuda.is_available():
        emit(skipped="no CUDA device", available=available)
        return
    dev = "cuda"
    n = k = 4096
    group = 128
    int4pack_ok = available["_weight_int4pack_mm"] and available["_convert_weight_to_int4pack"]
    for m in (1, 16, 32, 64, 128):
        case = f"w4a16_{m}x{n}x{k}"
        ops = 2.0 * m * n * k
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        wb = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) for _ in range(4)]
        it = {"i": 0}

        def rotate(lst):
            it["i"] = (it["i"] + 1) % len(lst)
            return lst[it["i"]]

        bf16_ms = timed(case, "torch_bf16", lambda: torch.nn.functional.linear(x, rotate(wb)), 100, ops)
        del wb
        if int4pack_ok:
            try:
                ws = int4pack_weights(n, k, group, 12, dev)

                def int4mm():
                    packed, sz = rotate(ws)
                    return torch._weight_int4pack_mm(x, packed, group, sz)

                ms, min_ms = time_cuda(int4mm, 100, 10)
                emit(case=case, impl="torch_int4pack_g128", ms=ms, min_ms=min_ms, tops=ops / ms / 1e9,
                     speedup_vs_torch_bf16=bf16_ms / ms)
                del ws
            except Exception as e:
                available["_weight_int4pack_mm_error"] = str(e)[:200]
                emit(case=case, impl="torch_int4pack_g128", skipped=str(e)[:200])
        if available.get("torchao"):
            try:
                mods = [torchao_module("Int4WeightOnlyConfig", n, k, group, dev) for _ in range(12)]
                timed(case, "torchao_int4wo_g128", lambda: rotate(mods)(x), 100, ops)
                del mods
            except Exception as e:
                emit(case=case, impl="torchao_int4wo_g128", skipped=str(e)[:200])

    for m, nn, kk in ((4096, 4096, 4096), (8192, 8192, 8192), (16, 4096, 4096)):
        case = f"w4a8_{m}x{nn}x{kk}"
        ops = 2.0 * m * nn * kk
        reps = 20 if m * nn * kk >= (1 << 36) else 50
        xb = torch.randn(m, kk, device=dev, dtype=torch.bfloat16)
        w = torch.randint(-8, 8, (nn, kk), device=dev, dtype=torch.int8)
        sw = torch.rand(nn, device=dev) * 0.01 + 0.001
        wt = w.t()

        def w8a8():
            amax = xb.abs().amax(dim=-1, keepdim=True).float()
            sa = torch.where(amax == 0, torch.ones_like(amax), amax / 127.0)
            q = torch.clamp(torch.round(xb.float() / sa), -128, 127).to(torch.int8)
            if m <= 16:  # torch._int_mm needs M > 16
                acc = (q.float() @ wt.float()).to(torch.int32)
            else:
                acc = torch._int_mm(q, wt)
            return (acc.float() * sa * sw).to(torch.bfloat16)

        timed(case, "torch_eager", w8a8, reps, ops)
        if available.get("torchao"):
            try:
                mod = torchao_module("Int8DynamicActivationInt4WeightConfig", nn, kk, group, dev)
                timed(case, "torchao_8da4w_g128", lambda: mod(xb), reps, ops)
                del mod
            except Exception as e:
                emit(case=case, impl="torchao_8da4w_g128", skipped=str(e)[:200])
        wbf = torch.randn(nn, kk, device=dev, dtype=torch.bfloat16)
        timed(case, "torch_bf16", lambda: torch.nn.functional.linear(xb, wbf), reps, ops)
        del xb, w, wbf
    emit(available=available)


if __name__ == "__main__":
    main()
