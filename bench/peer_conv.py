#!/usr/bin/env python3
"""PyTorch peer of bench/bench_conv.cpp: the same "case" keys, JSON lines.

  conv2d_fwd_<shape>_<dtype>: F.conv2d(x, w, b) on cuDNN (impl torch: f32
      with TF32 off, as qgrad's FMA math; impl torch_tf32: PyTorch's default
      TF32 convolutions, f32 rows only)
  conv2d_dx_<shape>_<dtype>, conv2d_dw_<shape>_<dtype>: the input and the
      weight gradient alone, aten.convolution_backward with one output mask
      (cuDNN backward data / filter)
  qconv2d_<shape>: PyTorch has no CUDA int8 convolution in eager mode that
      takes these layouts (torch.ao's quantized conv runs on the CPU), so the
      row's peers are F.conv2d in f32 (impl torch_cudnn_f32) and bf16
      (impl torch_cudnn_bf16) at the same shape
<shape> = <N>x<C>x<H>x<W>_o<O>_k3[_g<groups>]: 3x3, stride 1, padding 1 (the
grouped shape has float rows only). cudnn.benchmark
stays off (PyTorch's default; qgrad takes cuDNN's heuristic too).
"""
import json

import torch
import torch.nn.functional as F

from torch_timing import time_cuda

SHAPES = [(64, 64, 56, 56, 64, 1), (256, 1, 28, 28, 32, 1), (256, 32, 14, 14, 64, 1), (64, 96, 56, 56, 96, 96)]


def emit(**kw):
    print(json.dumps({"bench": "conv", **kw}), flush=True)


def row(case, impl, timing, flops, int8=False):
    ms, min_ms = timing
    emit(case=case, impl=impl, ms=ms, min_ms=min_ms, **{("tops" if int8 else "tflops"): flops / (ms * 1e-3) / 1e12})


def main():
    if not torch.cuda.is_available():
        emit(skipped="no CUDA device")
        return
    dev = "cuda"
    torch.backends.cudnn.benchmark = False
    for n, c, h, w, o, groups in SHAPES:
        tag = f"{n}x{c}x{h}x{w}_o{o}_k3" + (f"_g{groups}" if groups > 1 else "")
        flops = 2.0 * n * o * h * w * (c // groups) * 9
        reps = 20 if flops > 1e11 else 50
        fwd = {}
        for dt, name in ((torch.float32, "f32"), (torch.bfloat16, "bf16")):
            x = torch.randn(n, c, h, w, device=dev, dtype=dt)
            wt = torch.randn(o, c // groups, 3, 3, device=dev, dtype=dt) * 0.1
            b = torch.randn(o, device=dev, dtype=dt)
            dy = torch.randn(n, o, h, w, device=dev, dtype=dt)
            torch.backends.cudnn.allow_tf32 = False
            with torch.no_grad():
                t = time_cuda(lambda: F.conv2d(x, wt, b, 1, 1, 1, groups), reps)
            fwd[name] = t
            row(f"conv2d_fwd_{tag}_{name}", "torch", t, flops)

            def bwd(mask):
                return torch.ops.aten.convolution_backward(dy, x, wt, [o], [1, 1], [1, 1], [1, 1], False, [0, 0], groups,
                                                         mask)

            row(f"conv2d_dx_{tag}_{name}", "torch", time_cuda(lambda: bwd([True, False, False]), reps), flops)
            row(f"conv2d_dw_{tag}_{name}", "torch", time_cuda(lambda: bwd([False, True, False]), reps), flops)
            if dt == torch.float32:
                torch.backends.cudnn.allow_tf32 = True
                with torch.no_grad():
                    row(f"conv2d_fwd_{tag}_{name}", "torch_tf32", time_cuda(lambda: F.conv2d(x, wt, b, 1, 1, 1, groups), reps), flops)
                row(f"conv2d_dx_{tag}_{name}", "torch_tf32", time_cuda(lambda: bwd([True, False, False]), reps), flops)
                row(f"conv2d_dw_{tag}_{name}", "torch_tf32", time_cuda(lambda: bwd([False, True, False]), reps), flops)
                torch.backends.cudnn.allow_tf32 = False
            del x, wt, b, dy
        if groups > 1:
            continue
        row(f"qconv2d_{tag}", "torch_cudnn_f32", fwd["f32"], flops)
        row(f"qconv2d_{tag}", "torch_cudnn_bf16", fwd["bf16"], flops)


if __name__ == "__main__":
    main()
