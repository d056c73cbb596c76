#!/usr/bin/env python3
"""PyTorch peer for bench_train_ops: the training ops of the QAT step.

Same "case" keys, shapes and byte counts as bench/bench_train_ops.cpp;
median of CUDA-event timings after warm-up. JSON lines on stdout.
"""
import json
import os
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
    transformer_rows("--no-compile" not in sys.argv)
    return 0


DY_GEN = None


def graphed(fn):
    """fn captured in a CUDA graph (after warm-up on a side stream): its replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    # relaxed: a CUDA call of another thread (the autograd engine's, the
    # allocator's) during the capture does not invalidate it.
    with torch.cuda.graph(g, capture_error_mode="relaxed"):
        fn()
    return g.replay


def fw_bw_rows(name, inputs, op, fw_bytes, bw_bytes, compile_too, fw_flops=0.0, bw_flops=0.0):
    """bench_train_ops' fw_bw_rows: the forward without grad and the backward
    alone (autograd.grad of a recorded output), eager, eager captured in a CUDA
    graph (no launch or autograd-engine overhead: the kernels alone) and, where
    compile_too, under torch.compile; the fastest under the case's own name
    (config says which), each under <case>_<config> (eager, graph, compiled: the suffixes of bench_train_ops' rows)."""
    only = os.environ.get("QGRAD_BENCH_ONLY")  # comma-separated parts of row names, as bench_train_ops
    if only and not any(part and part in name for part in only.split(",")):
        return
    def rate(ms, bytes_, flops):
        return {"tflops": flops / (ms * 1e-3) / 1e12} if flops else {"gbs": gbs(bytes_, ms)}

    configs = [("eager", op, False), ("graph", op, True)]
    if compile_too:
        configs.append(("compiled", torch.compile(op, dynamic=False), False))
    best = {}
    for config, fn, graph in configs:
        try:
            with torch.no_grad():
                fw_call = (lambda: fn(*inputs))
                if graph:
                    fw_call = graphed(fw_call)
                fw = time_cuda(fw_call, reps=30, warmup=3)
            grads = [t.detach().requires_grad_(True) if t.is_floating_point() else t for t in inputs]
            y = fn(*grads)
            # A generator of its own: a failed capture leaves the default one unusable.
            dy = torch.randn(y.shape, device=y.device, dtype=y.dtype, generator=DY_GEN)
            wrt = [t for t in grads if t.requires_grad]
            bw_call = (lambda: torch.autograd.grad(y, wrt, dy, retain_graph=True))
            if graph:
                bw_call = graphed(bw_call)
            bw = time_cuda(bw_call, reps=30, warmup=3)
        except Exception as e:  # a configuration that cannot run is named, not fatal
            print(f"peer_train_ops: {name} {config}: {type(e).__name__}: {e}", file=sys.stderr)
            continue
        for kind, ms, bytes_, flops in (("fw", fw, fw_bytes, fw_flops), ("bw", bw, bw_bytes, bw_flops)):
            case = f"{name}_{kind}"
            emit(f"{case}_{config}", ms, config=config, **rate(ms, bytes_, flops))
            if case not in best or ms < best[case][0]:
                best[case] = (ms, config, bytes_, flops)
    for case, (ms, config, bytes_, flops) in best.items():
        emit(case, ms, config=config, note="fastest of eager, eager captured, compiled", **rate(ms, bytes_, flops))


def transformer_rows(compile_too):
    """bench_train_ops.cpp's transformer_rows: the same cases, shapes and byte counts.
    PyTorch's permute and cat backward return views of dy (no kernel: their
    captured graphs are empty)."""
    global DY_GEN
    DY_GEN = torch.Generator(device="cuda")
    DY_GEN.manual_seed(0x9C)
    try:  # a first capture of a plain op, in case the process's first capture is the one that fails
        graphed(lambda: torch.ones(4, device="cuda") * 2)()
    except Exception as e:
        print(f"peer_train_ops: warm-up capture: {type(e).__name__}: {e}", file=sys.stderr)
    R, D = 8192, 1024
    f = 4.0 * R * D
    stats = 8.0 * R
    x = torch.randn(R, D, device="cuda")
    w = torch.randn(D, device="cuda")
    b = torch.randn(D, device="cuda")
    fw_bw_rows("layer_norm_8192x1024", [x, w, b], lambda x, w, b: F.layer_norm(x, (D,), w, b),
               2 * f + stats, 3 * f + stats, compile_too)
    fw_bw_rows("rms_norm_8192x1024", [x, w], lambda x, w: F.rms_norm(x, (D,), w),
               2 * f + stats / 2, 3 * f + stats / 2, compile_too)
    fw_bw_rows("gelu_8192x1024", [x], lambda x: F.gelu(x), 2 * f, 3 * f, compile_too)
    fw_bw_rows("gelu_tanh_8192x1024", [x], lambda x: F.gelu(x, approximate="tanh"), 2 * f, 3 * f, compile_too)
    fw_bw_rows("silu_8192x1024", [x], lambda x: F.silu(x), 2 * f, 3 * f, compile_too)
    fw_bw_rows("softmax_8192x1024", [x], lambda x: torch.softmax(x, -1), 2 * f, 3 * f, compile_too)
    fw_bw_rows("dropout_p0.1_8192x1024", [x], lambda x: F.dropout(x, 0.1, training=True),
               2 * f + f / 32, 2 * f + f / 32, compile_too)
    V, E, N = 32768, 256, 65536
    table = torch.randn(V, E, device="cuda")
    idx = torch.randint(0, V, (N,), device="cuda")
    rows = 4.0 * N * E
    fw_bw_rows("embedding_32768x256_n65536", [table, idx], lambda t, i: F.embedding(i, t),
               2 * rows + 8.0 * N, rows + 4.0 * V * E + 8.0 * N, compile_too)
    Bm, M, K, Nn = 512, 128, 64, 128
    fl = 2.0 * Bm * M * K * Nn
    fw_bw_rows("matmul_b512_128x64x128", [torch.randn(Bm, M, K, device="cuda"), torch.randn(Bm, K, Nn, device="cuda")],
               torch.matmul, 0, 0, compile_too, fl, 2 * fl)
    # PyTorch's permute and slice are views: the rows time them made contiguous
    # (the copy qgrad's ops write), which is what a consumer of a view pays.
    t = torch.randn(64, 256, 16, 64, device="cuda")
    pb = 2.0 * 4.0 * t.numel()
    fw_bw_rows("permute_0213_64x256x16x64", [t], lambda t: t.permute(0, 2, 1, 3).contiguous(), pb, pb, compile_too)
    fw_bw_rows("cat_2x8192x1024_dim1", [x, torch.randn(R, D, device="cuda")], lambda a, c: torch.cat((a, c), 1),
               4 * f, 4 * f, compile_too)
    fw_bw_rows("slice_8192x1024_cols256_768", [x], lambda x: x[:, 256:768].contiguous(), f, f + f / 2, compile_too)


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
