#!/usr/bin/env python3
"""PyTorch peer of bench/bench_w8a8.cpp: the same "case" keys, JSON lines.

  dynquant_token_<N>x<D>: per-token symmetric int8 quantization of f32 x
      (amax, divide, round, clamp, cast), eager and torch.compile
  w8a8_<M>x<N>x<K>: eager W8A8 composition (per-token quant + torch._int_mm +
      scaling, bf16 in/out), torch._int_mm alone, bf16 matmul
"""
import json

import torch

from torch_timing import median_ms as time_ms


def emit(**kw):
    print(json.dumps({"bench": "w8a8", **kw}), flush=True)


def quant_per_token(x):
    amax = x.abs().amax(dim=-1, keepdim=True).float()
    scale = torch.where(amax == 0, torch.ones_like(amax), amax / 127.0)
    q = torch.clamp(torch.round(x.float() / scale), -128, 127).to(torch.int8)
    return q, scale


def main():
    if not torch.cuda.is_available():
        emit(skipped="no CUDA device")
        return
    dev = "cuda"
    n, d = 16384, 8192
    x = torch.randn(n, d, device=dev)
    bytes_moved = n * d * 5 + n * 8
    ms = time_ms(lambda: quant_per_token(x), 30, 3)
    emit(case=f"dynquant_token_{n}x{d}", impl="torch_eager", ms=ms, gbs=bytes_moved / ms / 1e6)
    try:
        compiled = torch.compile(quant_per_token)
        ms = time_ms(lambda: compiled(x), 30, 3)
        emit(case=f"dynquant_token_{n}x{d}", impl="torch_compile", ms=ms, gbs=bytes_moved / ms / 1e6)
    except Exception as e:  # no compiler toolchain offline
        emit(case=f"dynquant_token_{n}x{d}", impl="torch_compile", skipped=str(e)[:200])
    del x

    for m, nn, k in [(8192, 8192, 8192), (4096, 4096, 4096), (1, 4096, 4096), (16, 4096, 4096), (128, 4096, 4096), (512, 4096, 4096),
                     (1024, 4096, 4096)]:
        ops = 2.0 * m * nn * k
        reps = 20 if m * nn * k >= (1 << 36) else 50
        xb = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        w = torch.randint(-127, 128, (nn, k), device=dev, dtype=torch.int8)
        sw = torch.rand(nn, device=dev) * 0.01 + 0.001
        wt = w.t()
        case = f"w8a8_{m}x{nn}x{k}"

        def w8a8():
            q, sa = quant_per_token(xb)
            if m <= 16:  # torch._int_mm needs M > 16: an f32 matmul of the int8 values stands in
                acc = (q.float() @ wt.float()).to(torch.int32)
            else:
                acc = torch._int_mm(q, wt)
            return (acc.float() * sa * sw).to(torch.bfloat16)

        ms = time_ms(w8a8, reps)
        emit(case=case, impl="torch_eager", ms=ms, tops=ops / ms / 1e9)
        if m > 16:
            a = torch.randint(-127, 128, (m, k), device=dev, dtype=torch.int8)
            ms = time_ms(lambda: torch._int_mm(a, wt), reps)
            emit(case=case, impl="torch_int_mm", ms=ms, tops=ops / ms / 1e9, int8_peak_fraction=ops / ms / 1e9 / 1979)
        wb = torch.randn(nn, k, device=dev, dtype=torch.bfloat16)
        ms = time_ms(lambda: xb @ wb.t(), reps)
        emit(case=case, impl="torch_bf16", ms=ms, tops=ops / ms / 1e9)


if __name__ == "__main__":
    main()
