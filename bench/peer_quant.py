#!/usr/bin/env python3
"""PyTorch 2.11 peer of bench/bench_quant.cpp: the same cases (same "case"
keys), CUDA-event timing, median of repetitions, random inputs, JSON lines.

    python3 bench/peer_quant.py

Where PyTorch has no autograd for an op (dequantize), the equivalent
elementwise work is timed and said so in "note".
"""
import json

import torch

from torch_timing import time_cuda

ROWS, COLS = 4096, 65536
N = ROWS * COLS


def main():
    dev = torch.device("cuda")
    name = torch.cuda.get_device_name(0)
    a0 = torch.randn(N, device=dev)
    b0 = torch.empty_like(a0)
    copy_ms, _ = time_cuda(lambda: b0.copy_(a0), 30, 3)
    copy_gbs = 2 * 4 * N / (copy_ms * 1e-3) / 1e9
    del a0, b0

    def report(case, timing, nbytes, note=""):
        ms, mn = timing
        gbs = nbytes / (ms * 1e-3) / 1e9
        rec = {"bench": "quant", "impl": "torch", "case": case, "n": N, "ms": round(ms, 4), "min_ms": round(mn, 4),
               "gbs": round(gbs, 1), "copy_gbs": round(copy_gbs, 1), "frac_copy": round(gbs / copy_gbs, 3),
               "device": name, "torch": torch.__version__}
        if note:
            rec["note"] = note
        print(json.dumps(rec), flush=True)

    f4, n, mask_b = 4.0 * N, float(N), float(N)  # PyTorch's cachemask saves one byte per element
    x = torch.randn(ROWS, COLS, device=dev) * 2.0
    dy = torch.randn(ROWS, COLS, device=dev)
    scale_c = torch.rand(ROWS, device=dev) * 0.04 + 0.01
    zp_c = torch.randint(-10, 10, (ROWS,), device=dev, dtype=torch.int32)
    with torch.no_grad():
        report("fq_per_tensor_fw", time_cuda(lambda: torch.fake_quantize_per_tensor_affine(x, 0.02, 3, -128, 127)), 2 * f4)
        st = torch.tensor([0.02], device=dev)
        zt = torch.tensor([3], device=dev, dtype=torch.int32)
        report("fq_per_tensor_fw_device_qparams",
               time_cuda(lambda: torch.fake_quantize_per_tensor_affine(x, st, zt, -128, 127)), 2 * f4)
        report("fq_per_channel_fw",
               time_cuda(lambda: torch.fake_quantize_per_channel_affine(x, scale_c, zp_c, 0, -128, 127)), 2 * f4)
        report("quantize_per_tensor", time_cuda(lambda: torch.quantize_per_tensor(x, 0.02, 3, torch.qint8)), f4 + n)
        q = torch.quantize_per_tensor(x, 0.02, 3, torch.qint8)
        report("dequantize_per_tensor", time_cuda(lambda: torch.dequantize(q)), n + f4)
        del q

    xl = x.detach().requires_grad_()

    def fq_t():
        y = torch.fake_quantize_per_tensor_affine(xl, 0.02, 3, -128, 127)
        torch.autograd.grad(y, [xl], dy)

    report("fq_per_tensor_fwbw", time_cuda(fq_t, 20, 3), 2 * f4 + mask_b + 2 * f4 + mask_b)

    def fq_c():
        y = torch.fake_quantize_per_channel_affine(xl, scale_c, zp_c, 0, -128, 127)
        torch.autograd.grad(y, [xl], dy)

    report("fq_per_channel_fwbw", time_cuda(fq_c, 20, 3), 2 * f4 + mask_b + 2 * f4 + mask_b)

    s = torch.full((ROWS,), 0.02, device=dev, requires_grad=True)
    z = torch.full((ROWS,), 1.0, device=dev, requires_grad=True)
    y = torch._fake_quantize_learnable_per_channel_affine(xl, s, z, 0, -128, 127, 1.0)
    report("lsq_per_channel_bw", time_cuda(lambda: torch.autograd.grad(y, [xl, s, z], dy, retain_graph=True), 20, 3),
           3 * f4)
    del y
    s1 = torch.full((1,), 0.02, device=dev, requires_grad=True)
    z1 = torch.full((1,), 1.0, device=dev, requires_grad=True)
    y1 = torch._fake_quantize_learnable_per_tensor_affine(xl, s1, z1, -128, 127, 1.0)
    report("lsq_per_tensor_bw", time_cuda(lambda: torch.autograd.grad(y1, [xl, s1, z1], dy, retain_graph=True), 20, 3),
           3 * f4)
    del y1

    sc = scale_c.view(-1, 1)
    report("dequantize_per_channel_bw", time_cuda(lambda: dy * sc), 2 * f4,
           note="PyTorch has no autograd for dequantize: times dy * scale[c]")

    a = torch.randn(ROWS, COLS, device=dev)
    b = torch.randn(ROWS, COLS, device=dev)
    with torch.no_grad():
        report("lerp_fw", time_cuda(lambda: torch.lerp(a, b, 0.3)), 3 * f4)
        w = torch.rand(ROWS, COLS, device=dev)
        report("lerp_fw_tensor_weight", time_cuda(lambda: torch.lerp(a, b, w)), 4 * f4)
        del w
    a.requires_grad_()
    b.requires_grad_()
    y = torch.lerp(a, b, 0.3)
    report("lerp_bw", time_cuda(lambda: torch.autograd.grad(y, [a, b], dy, retain_graph=True)), 3 * f4)


if __name__ == "__main__":
    main()
