#!/usr/bin/env python3
"""Golden values for qgrad's quantization ops and lerp, from PyTorch 2.11.

Run on the GPU machine (torch is not installed elsewhere):
    python3 tests/python/gen_golden.py [--out tests/data/golden_quant.json]
and commit the JSON; tests/test_quant_golden.cpp compares qgrad with it bit
for bit on the CPU and (GPU present) on CUDA.

Reference values are computed with CPU tensors: qgrad follows PyTorch's CPU
formulas on both devices (PyTorch's CUDA quantize_per_tensor divides in
double and can differ by one step).

Encoding: every floating array is a list of hex bit patterns of its dtype
("%04x" for f16/bf16, "%08x" f32, "%016x" f64), integer arrays are plain
ints, and host scalars are float.hex() strings, so nothing is lost.

Cases and where PyTorch supports the dtype:
- fake_quantize_per_tensor / _per_channel: torch.fake_quantize_*_affine,
  f32, f64, f16, bf16 where the CPU kernel accepts the dtype (a dtype it
  rejects is listed under "unsupported" with PyTorch's message).
- learnable (LSQ): torch._fake_quantize_learnable_per_{tensor,channel}_affine,
  f32 only (PyTorch's LSQ gradient kernels are float-only). Inputs avoid
  |frac(x/s) - 0.5| < 1e-3 and use non-negative integer zero points, where
  PyTorch's backward (zp added before rounding, zp + 0.5 truncated) agrees
  with its forward; qgrad rounds both the forward way (documented). The
  scale / zero-point gradients are sums whose order PyTorch does not fix:
  "sum_exact" cases have one element per channel (compared bit for bit),
  the others are compared to a relative 1e-4.
- quantize / dequantize: torch.quantize_per_tensor / quantize_per_channel
  (f32 input only: PyTorch quantizes float32 tensors only) and
  torch.dequantize (f32 output). Per token = per channel on axis 0 of
  [N, D]; per group = per channel on axis 0 of x.reshape(-1, G). PyTorch
  has no autograd for these: the gradients recorded are qgrad's documented
  rules (dx = dy / scale * mask, dq = dy * scale) evaluated with torch
  elementwise ops in f32.
- lerp: torch.lerp with scalar and tensor weight, broadcasting, autograd
  gradients, f32, f64, f16, bf16. Broadcast-reduced gradients are sums
  (compared to a relative tolerance, "grad_tol").
NaN inputs are a documented difference (PyTorch maps NaN to qmin, qgrad
keeps NaN) and are left out.
"""
import argparse
import json
import math
import os

import torch

DT = {"f32": torch.float32, "f64": torch.float64, "f16": torch.float16, "bf16": torch.bfloat16}
INT_VIEW = {torch.float32: (torch.int32, 8), torch.float64: (torch.int64, 16),
            torch.float16: (torch.int16, 4), torch.bfloat16: (torch.int16, 4)}


def hexbits(t):
    t = t.detach().contiguous().cpu()
    view, width = INT_VIEW[t.dtype]
    mask = (1 << (4 * width)) - 1
    return ["%0*x" % (width, int(v) & mask) for v in t.reshape(-1).view(view).tolist()]


def ints(t):
    return [int(v) for v in t.detach().reshape(-1).tolist()]


def fhex(v):
    return float(v).hex()


def gen(seed):
    g = torch.Generator().manual_seed(seed)
    return g


def random_values(n, spread, seed):
    return torch.randn(n, generator=gen(seed), dtype=torch.float64) * spread


def edge_values(scale, zp, qmin, qmax):
    s = scale
    vals = [math.inf, -math.inf, 0.0, -0.0]
    for k in (qmin - zp, qmax - zp):
        vals += [k * s, (k - 0.5) * s, (k + 0.5) * s, (k - 1) * s, (k + 1) * s]
    vals += [(k + 0.5) * s for k in range(-6, 6)]  # exact ties
    vals += [1e30, -1e30]
    return torch.tensor(vals, dtype=torch.float64)


def fq_inputs(dtype, scale, zp, qmin, qmax, seed, n=96):
    spread = (qmax - qmin) * scale * 0.4
    x = torch.cat([random_values(n, spread, seed), edge_values(scale, zp, qmin, qmax)])
    return x.to(dtype)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "data", "golden_quant.json"))
    args = ap.parse_args()
    cases, unsupported = [], []

    def attempt(name, dtype_name, fn):
        try:
            fn()
        except (RuntimeError, NotImplementedError) as e:
            unsupported.append({"case": name, "dtype": dtype_name, "error": str(e).splitlines()[0][:200]})

    # ---- fake_quantize_per_tensor ----
    configs = [("s8", 0.125, 3, -128, 127), ("u8", 0.0371, 128, 0, 255), ("4bit", 0.25, -2, -8, 7)]
    for dn, dt in DT.items():
        for tag, scale, zp, qmin, qmax in configs:
            def run(dn=dn, dt=dt, tag=tag, scale=scale, zp=zp, qmin=qmin, qmax=qmax):
                x = fq_inputs(dt, scale, zp, qmin, qmax, 1).requires_grad_()
                dy = torch.randn(x.shape, generator=gen(2), dtype=torch.float64).to(dt)
                y = torch.fake_quantize_per_tensor_affine(x, scale, zp, qmin, qmax)
                y.backward(dy)
                cases.append({"op": "fake_quantize_per_tensor", "name": tag, "dtype": dn, "shape": list(x.shape),
                              "scale": fhex(scale), "zero_point": zp, "qmin": qmin, "qmax": qmax,
                              "x": hexbits(x), "dy": hexbits(dy), "y": hexbits(y), "dx": hexbits(x.grad)})
                # tensor-qparams overload
                s_t = torch.tensor([scale], dtype=torch.float32)
                z_t = torch.tensor([zp], dtype=torch.int32)
                y2 = torch.fake_quantize_per_tensor_affine(x.detach(), s_t, z_t, qmin, qmax)
                cases.append({"op": "fake_quantize_per_tensor_tensor_qparams", "name": tag, "dtype": dn,
                              "shape": list(x.shape), "scale": fhex(float(s_t[0])), "zero_point": zp,
                              "qmin": qmin, "qmax": qmax, "x": hexbits(x), "y": hexbits(y2)})
            attempt("fake_quantize_per_tensor/" + tag, dn, run)

    # ---- fake_quantize_per_channel ----
    for dn, dt in DT.items():
        for shape, axis in (([6, 40], 0), ([3, 5, 7], 1), ([2, 3, 4, 9], 3)):
            def run(dn=dn, dt=dt, shape=shape, axis=axis):
                c = shape[axis]
                scale = (torch.rand(c, generator=gen(3)) * 0.2 + 0.01).float()
                zp = torch.randint(-5, 6, (c,), generator=gen(4), dtype=torch.int32)
                n = math.prod(shape)
                # finite, moderate edges only: PyTorch's per-channel kernel casts zp + nearbyint(v) to int64
                # without a range check (UB; on x86 +inf and huge values become INT64_MIN, i.e. qmin), a
                # documented difference (qgrad saturates as PyTorch's per-tensor kernel does)
                edges = edge_values(0.125, 0, -16, 15)
                edges = edges[torch.isfinite(edges) & (edges.abs() < 1e6)]
                base = torch.cat([random_values(n - len(edges), 4.0, 5), edges])
                x = base.reshape(shape).to(dt).requires_grad_()
                dy = torch.randn(shape, generator=gen(6), dtype=torch.float64).to(dt)
                y = torch.fake_quantize_per_channel_affine(x, scale, zp, axis, -16, 15)
                y.backward(dy)
                cases.append({"op": "fake_quantize_per_channel", "name": "axis%d" % axis, "dtype": dn,
                              "shape": shape, "axis": axis, "qmin": -16, "qmax": 15,
                              "scale_t": hexbits(scale), "zero_point_t": ints(zp),
                              "x": hexbits(x), "dy": hexbits(dy), "y": hexbits(y), "dx": hexbits(x.grad)})
            attempt("fake_quantize_per_channel", dn, run)

    # ---- learnable (LSQ), f32 ----
    def lsq_x(shape, scales, axis, seed):
        x = torch.randn(shape, generator=gen(seed), dtype=torch.float32) * 2.0
        inv = (1.0 / scales).float()
        bshape = [1] * len(shape)
        bshape[axis] = -1
        v = x * inv.reshape(bshape)
        frac = v - torch.floor(v)
        bad = (frac - 0.5).abs() < 1e-3
        return torch.where(bad, x + 0.3 * scales.reshape(bshape), x)

    for name, shape, axis, per_tensor, gf in (("tensor", [4, 50], 0, True, 1.0), ("tensor_one", [1], 0, True, 0.5),
                                              ("channel", [6, 40], 0, False, 1.0), ("channel_axis1", [3, 5, 7], 1, False, 0.3),
                                              ("channel_one", [64], 0, False, 0.7)):
        def run(name=name, shape=shape, axis=axis, per_tensor=per_tensor, gf=gf):
            c = 1 if per_tensor else shape[axis]
            scale = (torch.rand(c, generator=gen(7)) * 0.04 + 0.01).float()
            # non-negative integers: PyTorch's backward truncates zp + 0.5 toward zero, which for a
            # negative zp is zp + 1 (a documented difference, left out of the parity data)
            zp = torch.randint(0, 10, (c,), generator=gen(8)).float()
            if per_tensor:
                x = lsq_x(shape, scale.expand(shape[0]).contiguous(), 0, 9)
            else:
                x = lsq_x(shape, scale, axis, 9)
            x = x.detach().requires_grad_()
            s = scale.clone().requires_grad_()
            z = zp.clone().requires_grad_()
            dy = torch.randn(shape, generator=gen(10), dtype=torch.float32)
            if per_tensor:
                y = torch._fake_quantize_learnable_per_tensor_affine(x, s, z, -32, 31, gf)
            else:
                y = torch._fake_quantize_learnable_per_channel_affine(x, s, z, axis, -32, 31, gf)
            y.backward(dy)
            per_channel_count = math.prod(shape) // c
            cases.append({"op": "fake_quantize_learnable_per_tensor" if per_tensor else "fake_quantize_learnable_per_channel",
                          "name": name, "dtype": "f32", "shape": shape, "axis": axis, "qmin": -32, "qmax": 31,
                          "grad_factor": fhex(gf), "scale_t": hexbits(s), "zero_point_t": hexbits(z),
                          "x": hexbits(x), "dy": hexbits(dy), "y": hexbits(y), "dx": hexbits(x.grad),
                          "dscale": hexbits(s.grad), "dzero_point": hexbits(z.grad),
                          "sum_exact": per_channel_count == 1})
        attempt("lsq/" + name, "f32", run)
    for dn in ("f64", "f16", "bf16"):
        unsupported.append({"case": "lsq", "dtype": dn, "error": "PyTorch's LSQ gradient kernels are float32-only"})

    # ---- quantize / dequantize (f32 input, f32 output) ----
    # Zero points in [0, 127]: FBGEMM's AVX2 quantize clips x * inv to 2147483520.f, converts to int32
    # and then adds zp in int32, which wraps for +-inf / huge inputs when zp < 0 (-inf -> qmax) or
    # zp >= 128 (+inf -> qmin); qgrad saturates instead (documented), so those are left out.
    for qn, qdt, zp in (("s8", torch.qint8, 3), ("u8", torch.quint8, 100)):
        qmin, qmax = (-128, 127) if qn == "s8" else (0, 255)
        # per tensor
        scale = 0.0371
        x = fq_inputs(torch.float32, scale, zp, qmin, qmax, 11)
        dy = torch.randn(x.shape, generator=gen(12), dtype=torch.float32)
        q = torch.quantize_per_tensor(x, scale, zp, qdt)
        qi = q.int_repr().to(torch.int64)
        y = torch.dequantize(q)
        sf = torch.tensor(scale, dtype=torch.float32)
        mask = ((torch.round(x * (1.0 / sf)) + zp) >= qmin) & ((torch.round(x * (1.0 / sf)) + zp) <= qmax)
        dq = dy * sf
        dx = dq / sf * mask.float()
        cases.append({"op": "quantize_per_tensor", "name": qn, "dtype": "f32", "qdtype": qn, "shape": list(x.shape),
                      "scale": fhex(scale), "zero_point": zp, "x": hexbits(x), "q": ints(qi), "y": hexbits(y),
                      "dy": hexbits(dy), "dq": hexbits(dq), "dx": hexbits(dx)})
        # per channel / token / group
        for kind, shape, axis, group in (("channel", [5, 24], 1, 0), ("channel", [4, 6, 5], 0, 0),
                                         ("token", [6, 32], 0, 0), ("group", [3, 64], 0, 16)):
            n = math.prod(shape)
            xv = torch.cat([edge_values(0.125, 0, qmin, qmax), random_values(n, 3.0, 13)])[:n].float().reshape(shape)
            if kind == "group":
                x2 = xv.reshape(-1, group)
                c = x2.shape[0]
                ax = 0
            else:
                x2 = xv
                c = shape[axis]
                ax = axis
            scales = (torch.rand(c, generator=gen(14)) * 0.05 + 0.01).float()
            zps = torch.randint(qmin // 2, qmax // 2, (c,), generator=gen(15))
            q = torch.quantize_per_channel(x2, scales.double(), zps, ax, qdt)
            qi = q.int_repr().to(torch.int64).reshape(shape)
            y = torch.dequantize(q).reshape(shape)
            entry = {"op": "quantize_per_" + kind, "name": qn, "dtype": "f32", "qdtype": qn, "shape": shape,
                     "axis": ax, "group_size": group, "scale_t": hexbits(scales), "zero_point_t": ints(zps),
                     "x": hexbits(xv), "q": ints(qi), "y": hexbits(y)}
            cases.append(entry)

    # ---- lerp ----
    for dn, dt in DT.items():
        for name, sa, sb, w in (("scalar_small", [300], [300], 0.3), ("scalar_big", [300], [300], 0.8),
                                ("tensor", [300], [300], [300]), ("broadcast", [3, 1, 5], [4, 5], [1, 4, 1])):
            def run(dn=dn, dt=dt, name=name, sa=sa, sb=sb, w=w):
                a = torch.randn(sa, generator=gen(16), dtype=torch.float64).to(dt).requires_grad_()
                b = torch.randn(sb, generator=gen(17), dtype=torch.float64).to(dt).requires_grad_()
                entry = {"op": "lerp", "name": name, "dtype": dn, "shape_a": sa, "shape_b": sb,
                         "a": hexbits(a), "b": hexbits(b)}
                if isinstance(w, float):
                    wt = w
                    entry["weight"] = fhex(w)
                else:
                    wt = (torch.rand(w, generator=gen(18), dtype=torch.float64) * 2.0 - 0.5).to(dt).requires_grad_()
                    entry["weight_t"] = hexbits(wt)
                    entry["shape_w"] = w
                y = torch.lerp(a, b, wt)
                dy = torch.randn(y.shape, generator=gen(19), dtype=torch.float64).to(dt)
                y.backward(dy)
                entry.update({"shape_y": list(y.shape), "y": hexbits(y), "dy": hexbits(dy), "da": hexbits(a.grad),
                              "db": hexbits(b.grad), "grad_tol": name == "broadcast"})
                if not isinstance(w, float):
                    entry["dw"] = hexbits(wt.grad)
                cases.append(entry)
            attempt("lerp/" + name, dn, run)

    doc = {"torch_version": torch.__version__, "generator": "tests/python/gen_golden.py",
           "cases": cases, "unsupported": unsupported}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
    print("wrote %d cases (%d unsupported) to %s (%d bytes)" % (len(cases), len(unsupported), args.out,
                                                                   os.path.getsize(args.out)))


if __name__ == "__main__":
    main()
