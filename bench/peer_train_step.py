#!/usr/bin/env python3
"""PyTorch peer for bench_train_step: the QAT training step of an MLP, a CNN and a ViT.

784-H-H-10 MLP (Linear, ReLU, Linear, ReLU, Linear), and the CNN of
bench/qat_cnn.h (Conv-BN-ReLU-MaxPool twice, 32 and 64 channels, a linear
head; torch.ao fuses each Conv-BN-ReLU into a QAT ConvBnReLU2d, the tensor-op
model writes that module's _forward_approximate out), cross-entropy, SGD with
momentum 0.9, gradients set to none before each step; the whole step
(forward, backward, optimizer) timed with CUDA events, median of many
repetitions after warm-up. Configurations, each a JSON line:

  impl "torch"                   torch.ao.quantization's QAT (prepare_qat with
                                 the 'x86' qconfig: per-channel symmetric qint8
                                 weight fake quant, per-tensor quint8 activation
                                 fake quant with moving-average observers), eager;
  impl "torch_tensorop"          the fake quant in plain tensor ops, as torchao's
                                 QAT writes it (below), eager;
  impl "torch_tensorop_compiled" the same model under torch.compile;
  impl "torch_tensorop_graph"    eager tensor-op model, the whole step captured
                                 in one torch.cuda.graph and replayed;
  impl "torch_tensorop_compiled_graph"  compiled, the whole step captured.

The tensor-op model fake-quantizes where qgrad's prepared model does: the
input, and each Linear's weight (per-channel symmetric int8, scale =
amax|w| / 127.5) and output (per-tensor affine uint8 whose min/max move as
an exponential average with constant 0.01 of torch.aminmax, kept in buffers
updated in place under no_grad); rounding is straight-through
(z + (round(z) - z).detach()) and the clamp masks the gradient outside the
range. torch.ao's modules cannot be captured in a CUDA graph (the capture is
invalidated), hence the tensor-op model for the captured configurations.

The ViT (bench/qat_vit.h, the qgrad-qat-vit model: 4x4 patches of the
28x28 image through a Linear to width 128 plus a learned position
embedding, 6 pre-norm blocks (LayerNorm, attention with 4 heads through
F.scaled_dot_product_attention, LayerNorm, Linear-GELU-Linear with ratio 2),
a final LayerNorm, the mean over tokens, a linear head) runs the 8da8w
recipe in tensor ops, as torchao's QAT writes it: every Linear's input
fake-quantized per token, asymmetric int8 (scale = (max(hi, 0) - min(lo, 0))
/ 255 floored at f32 eps, zp = clamp(-128 - round(min(lo, 0) / scale)), from
the row's own min/max), its weight per channel symmetric int8 (scale =
amax|w| / 127.5), both straight-through; AdamW (lr 1e-3, weight decay 0.05,
capturable when captured) after clip_grad_norm_ to 1. torch.ao has no such
recipe, so the ViT has no impl "torch" configuration of its own.

The ViT also runs in two other precisions, each on both sides (cases
"..._tf32" and "..._bf16"): tf32, the f32 model with
torch.backends.cuda.matmul.allow_tf32 (qgrad: set_matmul_allow_tf32), and
bf16, the forward and the loss under torch.autocast(bfloat16) (qgrad:
Module::set_compute_dtype(bf16), f32 master weights and AdamW state).

Besides one record per configuration, each CUDA shape gets a record with
impl "torch" and case "<case>_graph": the fastest configuration of that
shape ("config" names it), the peer of qgrad's captured step.
--quick: the torch.ao and CPU cases only (no torch.compile).
--net mlp|cnn|vit: that model's cases only.
--precision f32|tf32|bf16: that precision's cases only.
--device cuda|cpu: that device's cases only.
--profile-kernels: instead of timing, run the CUDA cases' compiled + graph
configuration under torch.profiler for 10 replays and print, per case, the
GPU time per step by kernel (JSON lines "train_step_peer_kernels"), the
cuBLAS/CUTLASS GEMMs summed apart: the peer's side of qgrad's
scripts/profile_step.sh.
--cpu-linears: instead, the CPU MLP step's linear layers alone (the peer of
bench_train_step --cpu-nets mlp_linears; run it under taskset for the cores).
"""
import json
import sys
import time

import torch
import torch.nn as nn
import torch.ao.quantization as tq


def make_ao_model(hidden):
    model = nn.Sequential(
        tq.QuantStub(),
        nn.Linear(784, hidden), nn.ReLU(),
        nn.Linear(hidden, hidden), nn.ReLU(),
        nn.Linear(hidden, 10),
        tq.DeQuantStub(),
    )
    model.train()
    model.qconfig = tq.get_default_qat_qconfig("x86")
    tq.prepare_qat(model, inplace=True)
    return model


def round_ste(z):
    return z + (torch.round(z) - z).detach()


class ActFakeQuant(nn.Module):
    """Per-tensor affine uint8 fake quant with a moving-average min/max."""

    def __init__(self, averaging=0.01):
        super().__init__()
        self.averaging = averaging
        self.register_buffer("lo", torch.zeros(()))
        self.register_buffer("hi", torch.zeros(()))
        self.register_buffer("seen", torch.zeros((), dtype=torch.bool))

    def forward(self, x):
        if self.training:
            with torch.no_grad():
                lo, hi = torch.aminmax(x.detach())
                c = self.averaging
                self.lo.copy_(torch.where(self.seen, self.lo + c * (lo - self.lo), lo))
                self.hi.copy_(torch.where(self.seen, self.hi + c * (hi - self.hi), hi))
                self.seen.fill_(True)
        lo = torch.clamp(self.lo, max=0.0)
        hi = torch.clamp(self.hi, min=0.0)
        scale = torch.clamp((hi - lo) / 255.0, min=torch.finfo(torch.float32).eps)
        zp = torch.clamp(torch.round(-lo / scale), 0, 255)
        q = torch.clamp(round_ste(x / scale) + zp, 0, 255)
        return (q - zp) * scale


class QatLinear(nn.Linear):
    def __init__(self, fan_in, fan_out):
        super().__init__(fan_in, fan_out)
        self.out_fq = ActFakeQuant()

    def forward(self, x):
        w = self.weight
        scale = torch.clamp(w.detach().abs().amax(dim=1, keepdim=True) / 127.5, min=torch.finfo(torch.float32).eps)
        w_fq = torch.clamp(round_ste(w / scale), -128, 127) * scale
        return self.out_fq(nn.functional.linear(x, w_fq, self.bias))


def make_tensorop_model(hidden):
    return nn.Sequential(
        ActFakeQuant(),
        QatLinear(784, hidden), nn.ReLU(),
        QatLinear(hidden, hidden), nn.ReLU(),
        QatLinear(hidden, 10),
    ).train()


def make_ao_cnn(width):
    """The CNN of bench/qat_cnn.h, fused (Conv-BN-ReLU -> ConvBnReLU2d) and prepared by torch.ao."""
    model = nn.Sequential(
        tq.QuantStub(),
        nn.Conv2d(1, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(width, 2 * width, 3, padding=1), nn.BatchNorm2d(2 * width), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(2 * width * 7 * 7, 10),
        tq.DeQuantStub(),
    )
    model.train()
    model.qconfig = tq.get_default_qat_qconfig("x86")
    tq.fuse_modules_qat(model, [["1", "2", "3"], ["5", "6", "7"]], inplace=True)
    tq.prepare_qat(model, inplace=True)
    return model


class QatConvBnReLU(nn.Module):
    """torch.ao.nn.intrinsic.qat.ConvBnReLU2d's _forward_approximate in tensor ops:
    the batch norm folded into the per-channel weight fake quant with the
    running std, the conv output unscaled, batch norm with batch statistics
    (running ones updated in place), ReLU, the output activation fake quant."""

    def __init__(self, cin, cout):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1)
        self.bn = nn.BatchNorm2d(cout)
        self.out_fq = ActFakeQuant()

    def forward(self, x):
        bn = self.bn
        scale_factor = bn.weight / torch.sqrt(bn.running_var + bn.eps)
        w = self.conv.weight * scale_factor.reshape(-1, 1, 1, 1)
        scale = torch.clamp(w.detach().abs().amax(dim=(1, 2, 3), keepdim=True) / 127.5,
                            min=torch.finfo(torch.float32).eps)
        w_fq = torch.clamp(round_ste(w / scale), -128, 127) * scale
        y = nn.functional.conv2d(x, w_fq, None, padding=1) / scale_factor.reshape(1, -1, 1, 1)
        y = y + self.conv.bias.reshape(1, -1, 1, 1)
        y = nn.functional.batch_norm(y, bn.running_mean, bn.running_var, bn.weight, bn.bias, True, bn.momentum,
                                     bn.eps)
        return self.out_fq(torch.relu(y))


def make_tensorop_cnn(width):
    return nn.Sequential(
        ActFakeQuant(),
        QatConvBnReLU(1, width), nn.MaxPool2d(2),
        QatConvBnReLU(width, 2 * width), nn.MaxPool2d(2),
        nn.Flatten(), QatLinear(2 * width * 7 * 7, 10),
    ).train()


EPS = torch.finfo(torch.float32).eps


def fq_token_int8(x):
    """8da8w activations: per token (last axis) asymmetric int8, qparams from the row's own range."""
    lo, hi = torch.aminmax(x.detach(), dim=-1, keepdim=True)
    lo, hi = torch.clamp(lo, max=0.0), torch.clamp(hi, min=0.0)
    scale = torch.clamp((hi - lo) / 255.0, min=EPS)
    zp = torch.clamp(-128 - torch.round(lo / scale), -128, 127)
    q = torch.clamp(round_ste(x / scale) + zp, -128, 127)
    return (q - zp) * scale


def fq_channel_int8(w):
    """8da8w weights: per output channel symmetric int8, scale = amax / 127.5."""
    scale = torch.clamp(w.detach().abs().amax(dim=1, keepdim=True) / 127.5, min=EPS)
    return torch.clamp(round_ste(w / scale), -128, 127) * scale


class Linear8da8w(nn.Linear):
    def forward(self, x):
        return nn.functional.linear(fq_token_int8(x), fq_channel_int8(self.weight), self.bias)


class VitBlock(nn.Module):
    def __init__(self, dim, heads, ratio):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.in_proj, self.out_proj = Linear8da8w(dim, 3 * dim), Linear8da8w(dim, dim)
        self.fc1, self.fc2 = Linear8da8w(dim, ratio * dim), Linear8da8w(ratio * dim, dim)

    def forward(self, x):
        b, t, d = x.shape
        qkv = self.in_proj(self.ln1(x)).reshape(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        o = nn.functional.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2])
        x = x + self.out_proj(o.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(nn.functional.gelu(self.fc1(self.ln2(x))))


class Vit(nn.Module):
    def __init__(self, dim=128, depth=6, heads=4, ratio=2, patch=4):
        super().__init__()
        self.patch, self.grid = patch, 28 // patch
        self.proj = Linear8da8w(patch * patch, dim)
        self.pos = nn.Parameter(torch.randn(1, self.grid * self.grid, dim) * 0.02)
        self.blocks = nn.Sequential(*[VitBlock(dim, heads, ratio) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = Linear8da8w(dim, 10)

    def forward(self, x):
        b, g, p = x.shape[0], self.grid, self.patch
        x = x.reshape(b, g, p, g, p).permute(0, 1, 3, 2, 4).reshape(b, g * g, p * p)
        x = self.blocks(self.proj(x) + self.pos)
        return self.head(self.norm(x).mean(dim=1))


def make_tensorop_vit(dim):
    return Vit(dim=dim).train()


# net -> (make torch.ao model or None, make tensor-op model, one example's shape)
NETS = {
    "mlp": (make_ao_model, make_tensorop_model, (784,)),
    "cnn": (make_ao_cnn, make_tensorop_cnn, (1, 28, 28)),
    "vit": (None, make_tensorop_vit, (784,)),
}


def timed(device, reps, run):
    if device != "cuda":
        times = []
        for i in range(reps):
            t0 = time.perf_counter()
            run(i)
            times.append((time.perf_counter() - t0) * 1e3)
        times.sort()
        return times[len(times) // 2], 0
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for i in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        run(i)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2], torch.cuda.max_memory_allocated()


def kernel_times(run, steps):
    """GPU time per step by kernel name (us) over `steps` calls of run(i)."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(steps):
            run(i)
        torch.cuda.synchronize()
    out = {}
    for e in prof.key_averages():
        t = getattr(e, "self_device_time_total", None)
        if t is None:
            t = getattr(e, "self_cuda_time_total", 0.0)
        if t > 0:
            out[e.key] = (e.count / steps, t / steps)
    return out


def is_gemm(name):
    n = name.lower()
    return any(k in n for k in ("gemm", "xmma", "cutlass", "sm80_", "sm90_", "splitk"))


def bench(device, net, batch, size, reps, warmup, kind, compiled=False, graph=False, profile_kernels=False,
          precision="f32"):
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16")
    make_ao, make_tensorop, example = NETS[net]
    model = (make_ao(size) if kind == "ao" else make_tensorop(size)).to(device)
    clip = net == "vit"  # the ViT: AdamW after clip_grad_norm_ (bench/qat_vit.h)
    if clip:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05, foreach=True, capturable=graph)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    fwd = torch.compile(model) if compiled else model
    # Several batches, so inputs are not the same cached tensor every step.
    xs = [torch.randn(batch, *example, device=device) for _ in range(4)]
    ys = [torch.randint(0, 10, (batch,), device=device) for _ in range(4)]

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        with autocast:
            loss = loss_fn(fwd(x), y)
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        opt.step()

    if not graph:
        for i in range(warmup):
            step(xs[i % 4], ys[i % 4])
        return timed(device, reps, lambda i: step(xs[i % 4], ys[i % 4]))

    # Whole-network capture as in PyTorch's CUDA-graph documentation: warm up
    # on a side stream, capture forward, backward and the optimizer step once
    # (gradients set to none before, so the capture allocates them from the
    # graph's pool), replay with the inputs copied into static tensors.
    sx, sy = xs[0].clone(), ys[0].clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(warmup):
            sx.copy_(xs[i % 4])
            sy.copy_(ys[i % 4])
            step(sx, sy)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(g):
        with autocast:
            loss = loss_fn(fwd(sx), sy)
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        opt.step()

    def replay(i):
        sx.copy_(xs[i % 4])
        sy.copy_(ys[i % 4])
        g.replay()

    for i in range(5):
        replay(i)
    if profile_kernels:
        return kernel_times(replay, 10)
    return timed(device, reps, replay)


CONFIGS = [  # impl, kind, compiled, graph
    ("torch", "ao", False, False),
    ("torch_tensorop", "tensorop", False, False),
    ("torch_tensorop_compiled", "tensorop", True, False),
    ("torch_tensorop_graph", "tensorop", False, True),
    ("torch_tensorop_compiled_graph", "tensorop", True, True),
]


def cpu_linears_main(reps=50):
    """bench_train_step --cpu-nets mlp_linears's peer: the CPU MLP step's linear
    layers alone (784-256-256-10 at b256, f32, bias; forward and backward, no
    gradient for the input), F.linear eagerly on 2 threads (what the compiled
    step calls for its GEMMs: Inductor leaves them to the BLAS)."""
    torch.set_num_threads(2)
    gen = torch.Generator().manual_seed(0x11)
    widths = [784, 256, 256, 10]
    x = torch.randn(256, 784, generator=gen)
    ws = [torch.randn(widths[i + 1], widths[i], generator=gen, requires_grad=True) for i in range(3)]
    bs = [torch.randn(widths[i + 1], generator=gen, requires_grad=True) for i in range(3)]
    dys = [torch.randn(256, widths[i + 1], generator=gen) for i in range(3)]

    def step():
        inp = x
        for i in range(3):
            ws[i].grad = bs[i].grad = None
            out = torch.nn.functional.linear(inp, ws[i], bs[i])
            out.backward(dys[i])
            inp = out.detach().requires_grad_(i + 1 < 3)
    for _ in range(10):
        step()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        step()
        times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    print(json.dumps({"bench": "train_step", "impl": "torch", "case": "qat_step_cpu_b256_h256_linears",
                      "ms": times[len(times) // 2], "min_ms": times[0], "torch": torch.__version__,
                      "blas": torch.backends.mkl.is_available() and "mkl" or "other",
                      "device": "cpu (2 threads)"}), flush=True)
    return 0


def main():
    args = sys.argv[1:]
    quick = "--quick" in args
    if "--cpu-linears" in args:
        return cpu_linears_main()
    if "--profile-kernels" in args:
        return profile_main(args[args.index("--net") + 1] if "--net" in args[:-1] else None,
                            args[args.index("--precision") + 1] if "--precision" in args[:-1] else None)
    only = args[args.index("--net") + 1] if "--net" in args[:-1] else None
    only_precision = args[args.index("--precision") + 1] if "--precision" in args[:-1] else None
    only_device = args[args.index("--device") + 1] if "--device" in args[:-1] else None
    cases = []  # device, net, batch, hidden size (MLP) or width (CNN), reps, precision
    if torch.cuda.is_available():
        cases += [("cuda", "mlp", 256, 256, 200, "f32"), ("cuda", "mlp", 4096, 1024, 200, "f32"),
                  ("cuda", "cnn", 256, 32, 200, "f32"), ("cuda", "vit", 256, 128, 100, "f32"),
                  ("cuda", "vit", 256, 128, 100, "tf32"), ("cuda", "vit", 256, 128, 100, "bf16")]
    cases += [("cpu", "mlp", 256, 256, 50, "f32"), ("cpu", "cnn", 64, 32, 10, "f32")]
    for device, net, batch, size, reps, precision in cases:
        if (only is not None and net != only) or (only_precision is not None and precision != only_precision):
            continue
        if only_device is not None and device != only_device:
            continue
        if device == "cpu":
            torch.set_num_threads(2)
        case = {"mlp": f"qat_step_{device}_b{batch}_h{size}", "cnn": f"qat_cnn_step_{device}_b{batch}_w{size}",
                "vit": f"qat_vit_step_{device}_b{batch}"}[net] + ("" if precision == "f32" else "_" + precision)
        dev_name = torch.cuda.get_device_name() if device == "cuda" else "cpu (2 threads)"
        results = []
        for impl, kind, compiled, graph in CONFIGS:
            # torch.compile runs on the CPU too (Inductor's C++ kernels around
            # the BLAS GEMMs): on 2 cores the strongest CPU configuration.
            if (graph and device != "cuda") or (compiled and quick):
                continue
            if kind == "ao" and NETS[net][0] is None:  # no torch.ao form of the recipe
                continue
            try:
                ms, peak = bench(device, net, batch, size, reps, 20 if device == "cuda" or net == "mlp" else 3,
                                 kind, compiled, graph, precision=precision)
            except Exception as e:  # a configuration PyTorch cannot run is reported, not fatal
                print(json.dumps({"bench": "train_step", "impl": impl, "case": case, "error": str(e)[:300]}),
                      flush=True)
                continue
            results.append((ms, impl, peak))
            print(json.dumps({"bench": "train_step", "impl": impl, "case": case, "ms": ms, "peak_bytes": peak,
                              "precision": precision, "torch": torch.__version__, "device": dev_name}), flush=True)
            torch._dynamo.reset()
        if results:
            # The strongest configuration: against qgrad's captured step on CUDA
            # ("_graph"), its own line on the CPU ("_strongest").
            ms, impl, peak = min(results)
            print(json.dumps({"bench": "train_step", "impl": "torch",
                              "case": case + ("_graph" if device == "cuda" else "_strongest"), "ms": ms,
                              "peak_bytes": peak, "config": impl, "note": f"strongest PyTorch: {impl}",
                              "torch": torch.__version__, "device": dev_name}), flush=True)
    return 0


def profile_main(only, only_precision=None):
    cases = [("mlp", 256, 256, "f32"), ("mlp", 4096, 1024, "f32"), ("cnn", 256, 32, "f32"), ("vit", 256, 128, "f32"),
             ("vit", 256, 128, "tf32"), ("vit", 256, 128, "bf16")]
    for net, batch, size, precision in cases:
        if (only is not None and net != only) or (only_precision is not None and precision != only_precision):
            continue
        k = bench("cuda", net, batch, size, 0, 20, "tensorop", True, True, profile_kernels=True, precision=precision)
        total = sum(t for _, t in k.values())
        gemm = sum(t for n, (_, t) in k.items() if is_gemm(n))
        launches = sum(c for c, _ in k.values())
        print(json.dumps({"bench": "train_step_peer_kernels", "case": f"{net}_b{batch}_{size}" + ("" if precision == "f32" else "_" + precision),
                          "config": "torch_tensorop_compiled_graph", "kernel_us_per_step": round(total, 1),
                          "gemm_us_per_step": round(gemm, 1), "launches_per_step": round(launches, 1),
                          "device": torch.cuda.get_device_name()}), flush=True)
        for name, (c, t) in sorted(k.items(), key=lambda kv: -kv[1][1])[:25]:
            print(json.dumps({"bench": "train_step_peer_kernels", "case": f"{net}_b{batch}_{size}" + ("" if precision == "f32" else "_" + precision),
                              "kernel": name[:160], "launches": round(c, 1), "us": round(t, 1)}), flush=True)
        torch._dynamo.reset()
    return 0


if __name__ == "__main__":
    sys.exit(main())
