#!/usr/bin/env python3
"""Round trip of qgrad's low-bit checkpoints with Python's safetensors (run by
tests/test_lowbit.cpp).

usage: roundtrip_lowbit_safetensors.py IN OUT

Checks the file qgrad wrote at IN (values must match test_lowbit.cpp):
  w4    s4 [4, 8], element i = (i % 16) - 8, saved as U8 [4, 4] with metadata
        w4.dtype = "s4", w4.shape = "[4,8]", w4.packing = "int4x2-low-first",
        w4.group_size = "8" (the caller's key);
  u4odd u4 [5] = [1, 2, 3, 4, 15], saved as U8 [3] (odd count: last high nibble 0);
  e4m3  F8_E4M3 [6] = fp8 of [1, -2, 0.5, 208, -0, 0.3];
  e5m2  F8_E5M2 [3] = fp8 of [57344, -1.5, 1e-5]
(F8 values through torch when it is installed). Then writes OUT with
safetensors: w4_py (s4 [2, 4] = [-8..-1], U8 bytes plus the metadata keys),
and with torch: e4m3_py = fp8(2 * e4m3), e5m2_py = e5m2 unchanged.
Exit 0 on success (or "SKIPPED: ..." when safetensors is missing), 1 on a mismatch.
"""
import json
import sys

try:
    import numpy as np
    from safetensors import safe_open
    from safetensors.numpy import save_file
except ImportError:
    print("SKIPPED: python safetensors not installed")
    sys.exit(0)
try:
    import torch
    from safetensors.torch import save_file as save_torch
except ImportError:
    torch = None


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def unpack_int4(b, signed, count):
    flat = b.reshape(-1)
    lo, hi = flat & 0xF, flat >> 4
    v = np.stack([lo, hi], axis=-1).reshape(-1)[:count].astype(np.int32)
    return np.where(v >= 8, v - 16, v) if signed else v


def pack_int4(v):
    v = np.asarray(v, dtype=np.int32) & 0xF
    if v.size % 2:
        v = np.append(v, 0)
    return (v[0::2] | (v[1::2] << 4)).astype(np.uint8)


def main():
    src, dst = sys.argv[1], sys.argv[2]
    raw = open(src, "rb").read()
    hl = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + hl])
    if header["e4m3"]["dtype"] != "F8_E4M3" or header["e5m2"]["dtype"] != "F8_E5M2":
        fail("fp8 dtypes %r %r" % (header["e4m3"], header["e5m2"]))
    with safe_open(src, framework="np") as f:
        meta = f.metadata() or {}
        want_meta = {"w4.dtype": "s4", "w4.shape": "[4,8]", "w4.packing": "int4x2-low-first", "w4.group_size": "8",
                     "u4odd.dtype": "u4", "u4odd.shape": "[5]", "u4odd.packing": "int4x2-low-first"}
        for k, v in want_meta.items():
            if meta.get(k) != v:
                fail("metadata %s = %r, want %r" % (k, meta.get(k), v))
        w4 = f.get_tensor("w4")
        if w4.dtype != np.uint8 or w4.shape != (4, 4):
            fail("w4 stored as %r %r" % (w4.dtype, w4.shape))
        got = unpack_int4(w4, True, 32)
        if got.tolist() != [(i % 16) - 8 for i in range(32)]:
            fail("w4 values %r" % got.tolist())
        u4 = f.get_tensor("u4odd")
        if u4.shape != (3,) or u4.tolist() != [0x21, 0x43, 0x0F]:
            fail("u4odd bytes %r" % u4.tolist())
    out_meta = {"w4_py.dtype": "s4", "w4_py.shape": "[2, 4]", "w4_py.packing": "int4x2-low-first",
                "written_by": "python"}
    w4_py = pack_int4([-8, -7, -6, -5, -4, -3, -2, -1]).reshape(2, 2)
    if torch is None:
        save_file({"w4_py": w4_py}, dst, metadata=out_meta)
        print("OK (no torch: F8 values not checked)")
        return
    with safe_open(src, framework="pt") as f:
        e4 = f.get_tensor("e4m3")
        e5 = f.get_tensor("e5m2")
    if e4.dtype != torch.float8_e4m3fn or e5.dtype != torch.float8_e5m2:
        fail("fp8 torch dtypes %r %r" % (e4.dtype, e5.dtype))
    w4v = torch.tensor([1, -2, 0.5, 208, -0.0, 0.3]).to(torch.float8_e4m3fn)
    w5v = torch.tensor([57344, -1.5, 1e-5]).to(torch.float8_e5m2)
    if not torch.equal(e4.view(torch.uint8), w4v.view(torch.uint8)) or not torch.equal(
            e5.view(torch.uint8), w5v.view(torch.uint8)):
        fail("fp8 values %r %r" % (e4.view(torch.uint8).tolist(), e5.view(torch.uint8).tolist()))
    save_torch({"w4_py": torch.from_numpy(w4_py), "e4m3_py": (e4.to(torch.float32) * 2).to(torch.float8_e4m3fn),
                "e5m2_py": e5}, dst, metadata=out_meta)
    print("OK")


if __name__ == "__main__":
    main()
