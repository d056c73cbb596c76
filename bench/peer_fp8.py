#!/usr/bin/env python3
"""PyTorch peer of bench/bench_fp8.cpp: the same "case" keys, JSON lines.

  fp8_<M>x<N>x<K>: e4m3 x e4m3 -> bf16 through torch._scaled_mm with
      per-tensor scales, bf16 x and out:
      torch_eager             dynamic activation scale in tensor ops (amax,
                              divide, clamp, cast) + torch._scaled_mm
      torch_compile           the same function under torch.compile
      torch_given_scale       a given activation scale (divide, clamp, cast + _scaled_mm)
      torch_scaled_mm_gemm    torch._scaled_mm alone (pre-quantized x)
      torch_bf16              F.linear in bf16
  "vs_torch_bf16" = F.linear's ms / this ms.
Without CUDA (or without FP8 tensor cores) it prints one "skipped" record.
"""
import json

import torch
import torch.nn.functional as F

from torch_timing import time_cuda

FP8_MAX = 448.0


def emit(**kw):
    print(json.dumps({"bench": "fp8", **kw}), flush=True)


def quantize(x, sx):
    return (x.float() / sx).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)


def fp8_linear_dynamic(x, w_t, sw):
    sx = torch.clamp(x.abs().amax().float(), min=1e-12) / FP8_MAX
    return torch._scaled_mm(quantize(x, sx), w_t, scale_a=sx, scale_b=sw, out_dtype=torch.bfloat16)


def fp8_linear_given(x, w_t, sx, sw):
    return torch._scaled_mm(quantize(x, sx), w_t, scale_a=sx, scale_b=sw, out_dtype=torch.bfloat16)


def main():
    if not torch.cuda.is_available():
        emit(skipped="no CUDA device")
        return
    if torch.cuda.get_device_capability() < (8, 9):
        emit(skipped="no FP8 tensor cores (compute capability < 8.9)")
        return
    dev = "cuda"
    compiled = None
    compile_error = None
    try:
        compiled = torch.compile(fp8_linear_dynamic)
    except Exception as e:  # no compiler toolchain offline
        compile_error = str(e)[:200]
    for m, n, k in [(8192, 8192, 8192), (4096, 4096, 4096)]:
        flops = 2.0 * m * n * k
        reps = 20 if m * n * k >= (1 << 36) else 50
        case = f"fp8_{m}x{n}x{k}"
        g = torch.Generator(device=dev).manual_seed(3)
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16, generator=g)
        w_t = (torch.randn(n, k, device=dev, generator=g) * 64).to(torch.float8_e4m3fn).t()  # column-major [K, N]
        sw = torch.tensor(0.002, device=dev)
        sx = torch.tensor(0.01, device=dev)
        wb = torch.randn(n, k, device=dev, dtype=torch.bfloat16, generator=g)

        bf16_ms, bf16_min = time_cuda(lambda: F.linear(x, wb), reps)
        emit(case=case, impl="torch_bf16", ms=bf16_ms, min_ms=bf16_min, tflops=flops / bf16_ms / 1e9)

        def record(impl, fn):
            try:
                ms, mn = time_cuda(fn, reps)
            except Exception as e:  # e.g. torch.compile without a toolchain
                emit(case=case, impl=impl, skipped=str(e)[:200])
                return
            emit(case=case, impl=impl, ms=ms, min_ms=mn, tflops=flops / ms / 1e9, vs_torch_bf16=bf16_ms / ms,
                 note=f"{bf16_ms / ms:.2f}x torch_bf16")

        record("torch_eager", lambda: fp8_linear_dynamic(x, w_t, sw))
        if compiled is not None:
            record("torch_compile", lambda: compiled(x, w_t, sw))
        else:
            emit(case=case, impl="torch_compile", skipped=compile_error)
        record("torch_given_scale", lambda: fp8_linear_given(x, w_t, sx, sw))
        q = quantize(x, sx)
        record("torch_scaled_mm_gemm",
               lambda: torch._scaled_mm(q, w_t, scale_a=sx, scale_b=sw, out_dtype=torch.bfloat16))
        del x, w_t, wb, q
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
