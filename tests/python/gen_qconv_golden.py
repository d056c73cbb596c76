#!/usr/bin/env python3
"""Golden int8 convolution and int8 pooling from PyTorch (CPU) for
tests/test_qconv_golden.cpp.

Writes tests/data/golden_qconv.json:
  pool: PyTorch's quantized pooling on NCHW-contiguous quint8 / qint8 tensors
      with zero point 0 (the int_repr of input and output): F.max_pool2d
      (values; indices come from the float path, which qgrad's integer path
      shares), F.avg_pool2d (avg_pool2d_out_frame: count_include_pad on/off,
      ceil_mode, windows of 4 and 6 elements, whose exact halves round to
      even) and F.adaptive_avg_pool2d (uneven windows, upsampling, global).
      Expected: equal bit for bit.
  conv: torch.ops.quantized.conv2d on quint8 x (per-tensor scale sa and zero
      point za, from torch.quantize_per_tensor) and per-channel symmetric
      qint8 weights (axis 0), float bias, for stride / padding / dilation /
      groups / depthwise cases. Recorded per case: x (f32 bits), w_q, w_scale
      (f32 bits), bias (f32 bits), a_q = the int_repr of torch's quantized x,
      y64 = F.conv2d in float64 of the dequantized operands (the exact
      accumulation, torch's reference), and torch's requantized output (int_repr,
      with its output scale and zero point). Expected (test_qconv_golden.cpp):
      qgrad's f32 output equals, bit for bit, the f32 epilogue of the exact
      integer convolution of torch's a_q (so qgrad's activation quantization
      and zero-point padding are torch's); it is within 1e-5 relative of y64;
      requantized with torch's output qparams it is within 1 LSB of torch's
      output (the requantization rounds its own float multiplier).
  The activation range is PyTorch's reduce_range [0, 127] with x kept inside it
  (torch clamps quint8 at 255, qgrad at qmax), run on the x86 engine (fbgemm),
  or quint8 [0, 255] with za = 128, run on QNNPACK: the x86 engine saturates
  int16 pair sums of u8 x s8 products (vpmaddubsw) for activations above 127,
  so its outputs there are off by up to tens of LSB (the reason PyTorch's x86
  qconfig uses reduce_range); QNNPACK accumulates exactly.

Run with PyTorch 2.11 (the CPU wheel is enough):  python3 tests/python/gen_qconv_golden.py
"""
import json
import os
import struct

import torch
import torch.nn.functional as F


def f32_hex(t):
    return ["%08x" % (int(v) & 0xFFFFFFFF) for v in t.detach().float().contiguous().view(torch.int32).view(-1).tolist()]


def f64_hex(t):
    return ["%016x" % (int(v) & 0xFFFFFFFFFFFFFFFF) for v in t.detach().double().contiguous().view(torch.int64).view(-1).tolist()]


def ints(t):
    return [int(v) for v in t.contiguous().view(-1).tolist()]


def f32(v):
    return struct.unpack("f", struct.pack("f", v))[0]


def pool_cases(g):
    out = []
    for qdtype, lo, hi, name in ((torch.quint8, 0, 256, "u8"), (torch.qint8, -128, 128, "s8")):
        for shape in ((2, 3, 7, 8), (1, 4, 6, 6), (2, 2, 12, 13)):
            raw = torch.randint(lo, hi, shape, generator=g, dtype=torch.int32)
            store = torch.uint8 if qdtype == torch.quint8 else torch.int8
            qx = torch._make_per_tensor_quantized_tensor(raw.to(store), 0.1, 0)
            assert qx.is_contiguous() and not qx.is_contiguous(memory_format=torch.channels_last)
            ops = []
            for k, s, p, ceil, cip in ((3, 2, 1, True, True), (3, 2, 1, True, False), (2, 2, 0, False, True),
                                       ((2, 3), (1, 2), (1, 0), False, False), (3, 1, 1, False, True),
                                       ((3, 2), (2, 1), (1, 1), True, False)):
                y = F.avg_pool2d(qx, k, s, p, ceil, cip)
                ops.append({"op": "avg", "k": list(k) if isinstance(k, tuple) else [k, k],
                            "s": list(s) if isinstance(s, tuple) else [s, s],
                            "p": list(p) if isinstance(p, tuple) else [p, p], "ceil": ceil, "cip": cip,
                            "shape": list(y.shape), "y": ints(y.int_repr())})
            for osz in ((3, 4), (1, 1), (5, 11), (2, 2)):
                y = F.adaptive_avg_pool2d(qx, osz)
                ops.append({"op": "adaptive", "out": list(osz), "shape": list(y.shape), "y": ints(y.int_repr())})
            for k, s, p, d, ceil in ((3, 2, 1, 1, True), (2, 2, 0, 1, False), (3, 1, 1, 2, False)):
                y = F.max_pool2d(qx, k, s, p, d, ceil)
                ops.append({"op": "max", "k": [k, k], "s": [s, s], "p": [p, p], "d": [d, d], "ceil": ceil,
                            "shape": list(y.shape), "y": ints(y.int_repr())})
            out.append({"dtype": name, "shape": list(shape), "x": ints(raw), "ops": ops})
    return out


def conv_cases(g):
    cases = (
        # x, w, stride, padding, dilation, groups, reduce_range
        ((2, 3, 6, 5), (4, 3, 3, 3), (1, 1), (1, 1), (1, 1), 1, False),
        ((2, 3, 7, 6), (5, 3, 3, 2), (2, 2), (1, 2), (1, 1), 1, True),
        ((2, 4, 7, 7), (6, 2, 3, 3), (1, 2), (1, 1), (2, 2), 2, False),
        ((2, 8, 6, 6), (8, 1, 3, 3), (1, 1), (1, 1), (1, 1), 8, True),  # depthwise
        ((2, 16, 8, 8), (32, 16, 3, 3), (1, 1), (1, 1), (1, 1), 1, False),
        ((1, 1, 28, 28), (8, 1, 3, 3), (1, 1), (1, 1), (1, 1), 1, True),  # the Fashion-MNIST first layer
    )
    out = []
    for xs, ws, st, pd, dl, groups, reduce_range in cases:
        O = ws[0]
        sa = f32(0.05)
        if reduce_range:
            za, qmin, qmax = 3, 0, 127
            x = (torch.rand(xs, generator=g, dtype=torch.float64) * (qmax - za + 0.49) - za) * sa
        else:
            za, qmin, qmax = 128, 0, 255
            x = (torch.rand(xs, generator=g, dtype=torch.float64) * 300 - 150) * sa  # past both ends
        x = x.float()
        flat = x.view(-1)
        for i, k in enumerate((0.5, 1.5, -0.5, -2.5, 2.5, 0.0)):  # ties, exactly
            flat[(7 * i) % flat.numel()] = f32(k * sa)
        w_q = torch.randint(-127, 128, ws, generator=g, dtype=torch.int32)
        w_scale = (torch.rand(O, generator=g) * 0.02 + 0.001).float()
        bias = torch.randn(O, generator=g).float()
        qx = torch.quantize_per_tensor(x, sa, za, torch.quint8)
        qw = torch._make_per_channel_quantized_tensor(w_q.to(torch.int8), w_scale.double(),
                                                      torch.zeros(O, dtype=torch.int64), 0)
        xd = (qx.int_repr().double() - za) * sa
        wd = w_q.double() * w_scale.double().view(-1, 1, 1, 1)
        y64 = F.conv2d(xd, wd, bias.double(), st, pd, dl, groups)
        so = float(f32(float((y64.max() - y64.min()) / 255)))
        zo = int(round(-float(y64.min()) / so))
        zo = max(0, min(255, zo))
        # x86 (fbgemm / onednn) multiplies u8 activations by s8 weights with
        # vpmaddubsw, whose int16 pair sums saturate unless the activations
        # stay in [0, 127]: that is why PyTorch's x86 qconfig observes them
        # with reduce_range. Full-range activations therefore take QNNPACK,
        # which accumulates in int32 exactly.
        engine = "x86" if reduce_range else "qnnpack"
        torch.backends.quantized.engine = engine
        packed = torch.ops.quantized.conv2d_prepack(qw, bias, list(st), list(pd), list(dl), groups)
        qy = torch.ops.quantized.conv2d(qx, packed, so, zo)
        torch.backends.quantized.engine = "x86"
        out.append({"x_shape": list(xs), "w_shape": list(ws), "stride": list(st), "padding": list(pd),
                    "dilation": list(dl), "groups": groups, "engine": engine, "sa": "%08x" % struct.unpack("I", struct.pack("f", sa))[0],
                    "za": za, "qmin": qmin, "qmax": qmax, "x": f32_hex(x), "w_q": ints(w_q),
                    "w_scale": f32_hex(w_scale), "bias": f32_hex(bias), "a_q": ints(qx.int_repr()),
                    "y64": f64_hex(y64), "y_shape": list(y64.shape), "out_scale": so, "out_zero_point": zo,
                    "q_out": ints(qy.int_repr())})
    return out


def main():
    torch.backends.quantized.engine = "x86"
    g = torch.Generator().manual_seed(2026)
    doc = {"torch": torch.__version__, "engine": torch.backends.quantized.engine, "pool": pool_cases(g),
           "conv": conv_cases(g)}
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "golden_qconv.json")
    with open(path, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
    print("wrote", os.path.normpath(path))


if __name__ == "__main__":
    main()
