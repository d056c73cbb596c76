#!/usr/bin/env python3
"""PyTorch peer for bench_train_step: the QAT training step of an MLP.

784-H-H-10 MLP prepared with torch.ao.quantization's default 'x86' QAT
qconfig (per-channel symmetric qint8 weight fake-quant, per-tensor quint8
activation fake-quant with moving-average observers), cross-entropy, SGD
with momentum 0.9. Times the whole step (forward, backward, optimizer) with
CUDA events, median of many repetitions, after warm-up. Prints one JSON
line per case with the same "case" keys as bench_train_step.
"""
import json
import sys
import time

import torch
import torch.nn as nn
import torch.ao.quantization as tq


def make_model(hidden):
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


def bench(device, batch, hidden, reps, warmup):
    torch.manual_seed(0)
    model = make_model(hidden).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    # Several batches, so inputs are not the same cached tensor every step.
    xs = [torch.randn(batch, 784, device=device) for _ in range(4)]
    ys = [torch.randint(0, 10, (batch,), device=device) for _ in range(4)]

    def step(i):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(xs[i % 4]), ys[i % 4])
        loss.backward()
        opt.step()

    for i in range(warmup):
        step(i)
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        times = []
        for i in range(reps):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            step(i)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        peak = torch.cuda.max_memory_allocated()
    else:
        times = []
        for i in range(reps):
            t0 = time.perf_counter()
            step(i)
            times.append((time.perf_counter() - t0) * 1e3)
        peak = 0
    times.sort()
    return times[len(times) // 2], peak


def main():
    cases = []
    if torch.cuda.is_available():
        cases += [("cuda", 256, 256, 200), ("cuda", 4096, 1024, 200)]
    cases += [("cpu", 256, 256, 50)]
    for device, batch, hidden, reps in cases:
        if device == "cpu":
            torch.set_num_threads(2)
        ms, peak = bench(device, batch, hidden, reps, warmup=20)
        print(json.dumps({
            "bench": "train_step", "impl": "torch", "case": f"qat_step_{device}_b{batch}_h{hidden}",
            "ms": ms, "peak_bytes": peak, "torch": torch.__version__,
            "device": torch.cuda.get_device_name() if device == "cuda" else "cpu (2 threads)",
        }), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
