#!/usr/bin/env python3
"""Golden FP8 conversions from PyTorch (CPU tensors) for tests/test_lowbit.cpp.

Writes tests/data/golden_fp8.json:
  e4m3_to_f32 / e5m2_to_f32: for each of the 256 bit patterns b, the f32 bits
      of torch.tensor([b], uint8).view(float8_*).to(float32);
  f32_inputs: f32 bit patterns (ties, max +- ulps, the overflow thresholds,
      subnormals of f32 and of each fp8 format, NaN, +-inf, -0, and random
      values over the whole exponent range);
  f32_to_e4m3 / f32_to_e5m2: the fp8 bits of x.to(float8_e4m3fn / float8_e5m2);
  ops: torchao's int4 per-group fake quantize (choose_qparams_affine +
      _fake_quantize_affine, transcribed in torch ops) for G in 32..256,
      symmetric / asymmetric, s4 / u4 ranges; and its FP8 fake quantize
      (_choose_scale_float8 + _quantize_affine_float8 + _dequantize_affine_float8)
      per tensor, per token and per 1x128 block, e4m3 and e5m2;
  int4 packing: torch has no packed int4 dtype; qgrad's nibble order is
      ONNX's (checked in test_lowbit.cpp against hand-packed bytes).

Run with PyTorch 2.11 (CPU wheel is enough):  python3 tests/python/gen_fp8_golden.py
"""
import json
import os
import struct
import sys

import torch


def f32_bits(values):
    t = torch.tensor(values, dtype=torch.float32)
    return [int(v) & 0xFFFFFFFF for v in t.view(torch.int32).tolist()]


def bits_f32(bits):
    return torch.tensor([b - (1 << 32) if b >= (1 << 31) else b for b in bits], dtype=torch.int32).view(torch.float32)


def tensor_bits(t):
    return [int(v) & 0xFFFFFFFF for v in t.contiguous().view(torch.int32).view(-1).tolist()]


def hexes(t):
    return ["%08x" % b for b in tensor_bits(t)]


def fp8_values(dtype):
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    return codes.view(dtype).to(torch.float32)


def torchao_int4(x, G, symmetric, qmin, qmax):
    """torchao's _choose_qparams_affine + _fake_quantize_affine over groups of G
    along the last axis (quant_primitives.py), written in torch ops, f32."""
    eps = torch.finfo(torch.float32).smallest_normal
    xg = x.view(x.shape[0], -1, G)
    mn, mx = torch.amin(xg, dim=-1), torch.amax(xg, dim=-1)
    min_neg = torch.min(mn, torch.zeros_like(mn))
    max_pos = torch.max(mx, torch.zeros_like(mx))
    if symmetric:
        scale = torch.max(-min_neg, max_pos) / (float(qmax - qmin) / 2)
        zp = torch.full_like(scale, int((qmax + qmin + 1) / 2))
        scale = torch.clamp(scale, min=eps)
    else:
        scale = (max_pos - min_neg) / float(qmax - qmin)
        scale = torch.clamp(scale, min=eps)
        zp = torch.clamp(qmin - torch.round(min_neg / scale), qmin, qmax)
    zp = zp.to(torch.int32)
    s, z = scale.unsqueeze(-1), zp.unsqueeze(-1)
    q = torch.clamp(torch.round(xg * (1.0 / s)) + z, qmin, qmax)
    y = (q.to(torch.float32) - z.to(torch.float32)) * s
    return y.view(x.shape), scale, zp


def torchao_fp8(x, block, dtype):
    """torchao's _choose_scale_float8 + _quantize_affine_float8 +
    _dequantize_affine_float8 over blocks of `block` consecutive elements."""
    xb = x.reshape(-1, block)
    m = torch.finfo(dtype).max
    scale = xb.abs().amax(dim=-1, keepdim=True) / m
    q = (xb / scale).clamp(min=-m, max=m).to(dtype)
    y = q.to(torch.float32) * scale
    return y.view(x.shape), scale.view(-1)


def golden_ops():
    g = torch.Generator().manual_seed(99)
    x = torch.randn(6, 256, generator=g) * 2.0
    x[0, 5] = 0.0
    x[1, 7] = -0.0
    x[2, 0:32] = 0.0  # an all-zero int4 group: scale = eps
    xf = torch.randn(4, 256, generator=g) * 5.0  # FP8: no all-zero block (torchao has no floor)
    ops = {"x_int4": hexes(x), "x_fp8": hexes(xf), "int4": [], "fp8": []}
    for G in (32, 64, 128, 256):
        for symmetric in (True, False):
            for qmin, qmax in ((-8, 7), (0, 15)):
                y, s, z = torchao_int4(x, G, symmetric, qmin, qmax)
                ops["int4"].append({"group": G, "symmetric": symmetric, "qmin": qmin, "qmax": qmax,
                                    "y": hexes(y), "scale": hexes(s), "zero_point": z.view(-1).tolist()})
    for dtype, name in ((torch.float8_e4m3fn, "f8e4m3"), (torch.float8_e5m2, "f8e5m2")):
        for block in (1024, 256, 128):  # per tensor, per token, 1x128
            y, s = torchao_fp8(xf, block, dtype)
            ops["fp8"].append({"dtype": name, "block": block, "y": hexes(y), "scale": hexes(s)})
    return ops


def main():
    inputs = set()

    def add_f32(v):
        inputs.add(struct.unpack("<I", struct.pack("<f", v))[0])

    def add_bits(b):
        inputs.add(b & 0xFFFFFFFF)

    # Every fp8 value, its neighbours in f32 (+-1 ulp) and the midpoints to the
    # next fp8 value (ties) with their neighbours.
    for dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        vals = fp8_values(dtype)
        finite = sorted({float(v) for v in vals.tolist() if v == v and abs(v) != float("inf")})
        for v in finite:
            b = f32_bits([v])[0]
            for d in (-2, -1, 0, 1, 2):
                if v != 0 or d >= 0:
                    add_bits(b + d)
        for a, c in zip(finite, finite[1:]):
            mid = (a + c) / 2  # exact in f32 (fp8 values have <= 4 significant bits)
            b = f32_bits([mid])[0]
            for d in (-1, 0, 1):
                add_bits(b + d)
    # Overflow thresholds and specials.
    for v in (448.0, 464.0, 480.0, 496.0, 512.0, 57344.0, 61440.0, 65536.0, 1e30, 3.4028234663852886e38, 0.0, 1.0):
        for s in (1.0, -1.0):
            b = f32_bits([s * v])[0]
            for d in (-1, 0, 1):
                add_bits(b + d if v != 0 else b)
    for b in (0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FA00000, 0x80000000, 0x00000000,
              0x00000001, 0x80000001, 0x007FFFFF, 0x00800000, 0x3B000000, 0x3A800000, 0x3A000000,
              0x37800000, 0x37000000, 0x36800000):
        add_bits(b)
    # Random values over the exponent range around the fp8 formats.
    g = torch.Generator().manual_seed(1234)
    r = torch.randn(3000, generator=g) * torch.exp2(torch.randint(-30, 20, (3000,), generator=g).float())
    for b in f32_bits(r.tolist()):
        add_bits(b)

    f32_inputs = sorted(inputs)
    x = bits_f32(f32_inputs)
    to_e4m3 = x.to(torch.float8_e4m3fn).view(torch.uint8).tolist()
    to_e5m2 = x.to(torch.float8_e5m2).view(torch.uint8).tolist()
    doc = {
        "generator": "tests/python/gen_fp8_golden.py",
        "torch_version": torch.__version__,
        "e4m3_to_f32": ["%08x" % b for b in tensor_bits(fp8_values(torch.float8_e4m3fn))],
        "e5m2_to_f32": ["%08x" % b for b in tensor_bits(fp8_values(torch.float8_e5m2))],
        "f32_inputs": ["%08x" % b for b in f32_inputs],
        "f32_to_e4m3": ["%02x" % b for b in to_e4m3],
        "f32_to_e5m2": ["%02x" % b for b in to_e5m2],
    }
    doc["ops"] = golden_ops()
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "golden_fp8.json")
    with open(out, "w") as f:
        json.dump(doc, f, indent=0)
    print("wrote", out, len(f32_inputs), "f32 inputs, torch", torch.__version__, file=sys.stderr)


if __name__ == "__main__":
    main()
