#!/usr/bin/env python3
"""Golden values for qgrad's scaled_dot_product_attention from PyTorch 2.11.

    python3 tests/python/gen_sdpa_golden.py [--out tests/data/golden_sdpa.json]

(the CPU wheel is enough) and commit the JSON; tests/test_shape_attention.cpp
compares qgrad's f32 result with it within the tolerance stated in
docs/ops.md. Inputs are closed-form (sin / cos of the flat index) so the
C++ test rebuilds them exactly; the reference is F.scaled_dot_product_attention
with the math backend (SDPBackend.MATH) in f32 on the CPU, forward and the
gradients of loss = sum(out * w), w_i = cos(0.05 i). Values are plain floats
(f32 results printed as double).
"""
import argparse
import json
import math

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def filled(shape, f):
    n = math.prod(shape)
    return torch.tensor([f(i) for i in range(n)], dtype=torch.float64).to(torch.float32).reshape(shape)


def case(name, B, H, L, S, D, Dv, mask_kind, causal, scale):
    q = filled((B, H, L, D), lambda i: math.sin(0.37 * i + 0.1)).requires_grad_()
    k = filled((B, H, S, D), lambda i: math.cos(0.23 * i)).requires_grad_()
    v = filled((B, H, S, Dv), lambda i: 2.0 * math.sin(0.11 * i + 0.5)).requires_grad_()
    mask = None
    if mask_kind == "additive":
        mask = filled((L, S), lambda i: 0.5 * math.cos(0.7 * i)).requires_grad_()
    elif mask_kind == "bool":
        mask = filled((B, 1, L, S), lambda i: float((i * 7) % 5 != 0)).bool()
    with sdpa_kernel(SDPBackend.MATH):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale)
    w = filled(tuple(out.shape), lambda i: math.cos(0.05 * i))
    (out * w).sum().backward()
    r = {"name": name, "B": B, "H": H, "L": L, "S": S, "D": D, "Dv": Dv, "mask": mask_kind or "none",
         "causal": causal, "scale": scale if scale is not None else None,
         "out": out.detach().flatten().double().tolist(), "dq": q.grad.flatten().double().tolist(),
         "dk": k.grad.flatten().double().tolist(), "dv": v.grad.flatten().double().tolist()}
    if mask_kind == "additive":
        r["dmask"] = mask.grad.flatten().double().tolist()
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/data/golden_sdpa.json")
    args = ap.parse_args()
    cases = [
        case("plain", 2, 2, 3, 5, 4, 3, None, False, None),
        case("additive mask, scale 0.3", 1, 2, 4, 4, 8, 8, "additive", False, 0.3),
        case("bool mask", 2, 2, 3, 5, 4, 3, "bool", False, None),
        case("causal", 1, 3, 6, 6, 4, 5, None, True, None),
        case("causal, L > S", 1, 1, 5, 3, 4, 2, None, True, None),
        case("long rows", 1, 1, 4, 70, 16, 8, None, False, None),
    ]
    with open(args.out, "w") as f:
        json.dump({"torch": torch.__version__, "cases": cases}, f, indent=1)


if __name__ == "__main__":
    main()
