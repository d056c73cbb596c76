#!/usr/bin/env python3
"""Round trip between qgrad and Python's safetensors (run by test_checkpoint).

usage: roundtrip_safetensors.py IN OUT

Checks the file qgrad wrote at IN (values below must match
tests/test_checkpoint.cpp), then writes OUT with safetensors itself:
every float tensor doubled, integers and bools unchanged, a new tensor
"py_new" and metadata {"written_by": "python"}. BF16 has no numpy dtype:
it is checked from the raw bytes and not written back.
Exit 0 on success (or "SKIPPED: ..." when safetensors is missing), 1 on a mismatch.
"""
import json
import struct
import sys

try:
    import numpy as np
    from safetensors import safe_open
    from safetensors.numpy import save_file
except ImportError:
    print("SKIPPED: python safetensors not installed")
    sys.exit(0)


def expected():
    return {
        "f32": (np.arange(12, dtype=np.float32) * 0.5 - 1.0).reshape(3, 4),
        "f64": np.array([1.5, -2.25, 1e300], dtype=np.float64),
        "f16": np.array([1.0, -0.5, 1000.0], dtype=np.float16),
        "i8": np.array([-128, 0, 127], dtype=np.int8),
        "u8": np.array([0, 7, 255], dtype=np.uint8),
        "i32": np.array([-(2**31), 5, 2**31 - 1], dtype=np.int32),
        "i64": np.array([-1, 2**40, -(2**62)], dtype=np.int64),
        "bool": np.array([True, False, True]),
        "scalar": np.array(3.25, dtype=np.float32),
        "empty": np.zeros((0, 4), dtype=np.float32),
    }


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def main():
    src, dst = sys.argv[1], sys.argv[2]
    want = expected()
    with safe_open(src, framework="np") as f:
        meta = f.metadata() or {}
        if meta.get("producer") != "qgrad":
            fail("metadata %r" % meta)
        keys = set(f.keys())
        if keys != set(want) | {"bf16"}:
            fail("keys %r" % sorted(keys))
        got = {k: f.get_tensor(k) for k in want}
    for k, w in want.items():
        g = got[k]
        if g.dtype != w.dtype or g.shape != w.shape or not np.array_equal(g, w):
            fail("%s: got %r %r %r" % (k, g.dtype, g.shape, g))
    # BF16 from the raw bytes: [1.0, -2.0, 0.5] -> 0x3f80, 0xc000, 0x3f00.
    raw = open(src, "rb").read()
    (hl,) = struct.unpack("<Q", raw[:8])
    info = json.loads(raw[8:8 + hl])["bf16"]
    b, e = info["data_offsets"]
    bits = np.frombuffer(raw[8 + hl + b:8 + hl + e], dtype="<u2").tolist()
    if info["shape"] != [3] or bits != [0x3F80, 0xC000, 0x3F00]:
        fail("bf16 %r %r" % (info, bits))
    out = {}
    for k, g in got.items():
        out[k] = np.asarray(g * 2, dtype=g.dtype) if g.dtype.kind == "f" else g
    out["py_new"] = np.arange(5, dtype=np.int64)
    save_file(out, dst, metadata={"written_by": "python"})
    print("OK")


if __name__ == "__main__":
    main()
