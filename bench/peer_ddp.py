#!/usr/bin/env python3
"""PyTorch peer of bench_ddp_step: weak scaling of a data-parallel QAT step.

The tensor-op QAT MLP of peer_train_step.py (784-H-H-10, fake quant on the
input, per-channel symmetric int8 weights, moving-average uint8 activations),
cross-entropy, SGD momentum 0.9, at a fixed per-GPU batch, under
torch.nn.parallel.DistributedDataParallel on NCCL in its strongest
configuration: gradient_as_bucket_view=True, static_graph=True, the model
under torch.compile (--eager: without it). Launch with torchrun:

  torchrun --standalone --nproc-per-node N bench/peer_ddp.py [--batch 4096] [--hidden 4096] [--reps 30]

Without torchrun (no WORLD_SIZE) it times the step without DDP (the 1-GPU
baseline). Each rank times `reps` steps after warm-up (synchronized before
and after each, so the all-reduce is inside); rank 0 prints one JSON line in
bench_ddp_step's format (impl "torch_ddp" or "torch_ddp_eager"), the step
time being the max over ranks.
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peer_train_step import make_tensorop_model  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--eager", action="store_true", help="no torch.compile")
    a = p.parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    distributed = world > 1
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    if distributed:
        dist.init_process_group("nccl", device_id=dev)
    torch.manual_seed(1)
    model = make_tensorop_model(a.hidden).to(dev).train()
    if distributed:
        model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[local], gradient_as_bucket_view=True, static_graph=True)
    fwd = model if a.eager else torch.compile(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator(device=dev).manual_seed(100 + (dist.get_rank() if distributed else 0))
    x = torch.randn(a.batch, 784, device=dev, generator=g)
    y = torch.arange(a.batch, device=dev) % 10

    def step():
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(fwd(x), y).backward()
        opt.step()

    for _ in range(a.warmup):
        step()
    ms = []
    for _ in range(a.reps):
        torch.cuda.synchronize()
        if distributed:
            dist.barrier()
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        ms.append((time.perf_counter() - t0) * 1e3)
    t = torch.tensor(ms, device=dev)
    if distributed:
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    ms = sorted(t.tolist())
    if not distributed or dist.get_rank() == 0:
        med = ms[len(ms) // 2]
        print(json.dumps({"bench": "ddp_step", "case": f"ddp_qat_mlp_b{a.batch}_h{a.hidden}_x{world}",
                          "ms": round(med, 4), "impl": "torch_ddp_eager" if a.eager else "torch_ddp",
                          "device": torch.cuda.get_device_name(dev), "world": world, "batch_per_rank": a.batch,
                          "hidden": a.hidden, "ms_median": round(med, 4), "ms_min": round(ms[0], 4),
                          "samples_per_s": round(world * a.batch / (med / 1e3), 1), "reps": a.reps}), flush=True)
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
