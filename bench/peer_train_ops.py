#!/usr/bin/env python3
"""PyTorch peer for bench_train_ops: the training ops of the QAT step.

Same "case" keys, shapes and byte counts as bench/bench_train_ops.cpp;
median of CUDA-event timings after warm-up. JSON lines on stdout.
"""
import json
import sys

import torch
import torch.nn.functional as F

from torch_timing import median_ms as time_cuda

ROWS, COLS = 8192, 8192
N = ROWS * COLS


def emit(case, ms, **extra):
    rec = {"bench": "train_ops", "impl": "torch", "case": case, "ms": ms, "torch": torch.__version__,
           "device": torch.cuda.get_device_name()}
    rec.update(extra)
    print(json.dumps(rec), flush=True)


def gbs(bytes_, ms):
    return bytes_ / (ms * 1e-3) / 1e9


def main():
    if not torch.cuda.is_available():
        print("peer_train_ops: no CUDA device", file=sys.stderr)
        return 0
    f4 = 4.0 * N
    x = torch.randn(ROWS, COLS, device="cuda")
    dy = torch.randn(ROWS, COLS, device="cuda")
    with torch.no_grad():
        ms = time_cuda(lambda: torch.relu(x))
        emit("relu_fw", ms, gbs=gbs(2 * f4, ms))
        ms = time_cuda(lambda: torch.aminmax(x))
        emit("observer_minmax_per_tensor", ms, gbs=gbs(f4, ms))
        ms = time_cuda(lambda: torch.aminmax(x, dim=1))
        emit("observer_minmax_per_channel", ms, gbs=gbs(f4, ms))
    xl = x.detach().requires_grad_(True)
    y = torch.relu(xl)
    ms = time_cuda(lambda: torch.autograd.grad(y, xl, dy, retain_graph=True))
    emit("relu_bw", ms, gbs=gbs(f4 + N / 8 + f4, ms))
    p = torch.nn.Parameter(torch.randn(N, device="cuda"))
    p.grad = torch.randn(N, device="cuda")
    opt = torch.optim.SGD([p], lr=1e-6, momentum=0.9)
    ms = time_cuda(opt.step)
    emit("sgd_momentum_step", ms, gbs=gbs(5 * f4, ms))
    B, C = 65536, 1000
    logits = torch.randn(B, C, device="cuda", requires_grad=True)
    labels = torch.randint(0, C, (B,), device="cuda")

    def ce():
        logits.grad = None
        F.cross_entropy(logits, labels).backward()
    ms = time_cuda(ce, reps=20, warmup=3)
    emit("cross_entropy_fwbw", ms, gbs=gbs(4.0 * B * C * 4, ms))
    M, K, Nn = 4096, 1024, 1024
    a = torch.randn(M, K, device="cuda", requires_grad=True)
    w = torch.randn(Nn, K, device="cuda", requires_grad=True)
    b = torch.randn(Nn, device="cuda", requires_grad=True)
    g = torch.randn(M, Nn, device="cuda")

    def lin():
        a.grad = w.grad = b.grad = None
        F.linear(a, w, b).backward(g)
    ms = time_cuda(lin, reps=30, warmup=3)
    emit("linear_fwbw_4096x1024x1024", ms, tflops=3 * 2.0 * M * Nn * K / (ms * 1e-3) / 1e12)
    # scaled_dot_product_attention at the ViT shape and at L = 1024, with the
    # math backend (qgrad's formula: GEMM, softmax, GEMM) and with PyTorch's
    # default choice (flash / memory-efficient kernels where they apply).
    for tag, (Bs, H, L, D) in (("vit_b256_h4_l50_d32", (256, 4, 50, 32)), ("l1024_b8_h4_d32", (8, 4, 1024, 32))):
        sdpa_rows(tag, Bs, H, L, D)
    return 0


def sdpa_rows(tag, B, H, L, D):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    fw_flops = 2 * 2.0 * B * H * L * L * D
    q, k, v = (torch.randn(B, H, L, D, device="cuda", requires_grad=True) for _ in range(3))
    dy = torch.randn(B, H, L, D, device="cuda")
    # The default backend (PyTorch's strongest choice) under qgrad's case
    # names, so bench_table.py compares with it; the math backend (qgrad's own
    # formula) as PyTorch-only rows "<case>_math".
    for backend, suffix in ((SDPBackend.MATH, "_math"), (None, "")):
        def run(causal=False):
            if backend is None:
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        with torch.no_grad():
            ms = time_cuda(run, reps=30, warmup=3)
            emit("sdpa_fw_" + tag + suffix, ms, backend=suffix[1:] or "default", tflops=fw_flops / (ms * 1e-3) / 1e12)
            ms = time_cuda(lambda: run(True), reps=30, warmup=3)
            emit("sdpa_causal_fw_" + tag + suffix, ms, backend=suffix[1:] or "default",
                 tflops=fw_flops / (ms * 1e-3) / 1e12)
        y = run()
        ms = time_cuda(lambda: torch.autograd.grad(y, (q, k, v), dy, retain_graph=True), reps=30, warmup=3)
        emit("sdpa_bw_" + tag + suffix, ms, backend=suffix[1:] or "default", tflops=2 * fw_flops / (ms * 1e-3) / 1e12)


if __name__ == "__main__":
    sys.exit(main())
