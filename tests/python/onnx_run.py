"""Runs an ONNX model (tests/test_export.cpp) with onnxruntime's CPU provider
on f32 inputs and compares its output with qgrad's.

    onnx_run.py MODEL X.bin ROWS COLS EXPECTED.bin --step S --max-steps K --min-equal P [--expect-differ]

X.bin / EXPECTED.bin: raw little-endian f32, row-major. Passes (exit 0) when
onnx.checker accepts the model, at least a fraction P of the outputs equal
qgrad's exactly and none differs by more than K * S; with --expect-differ,
when some output differs by more than S / 2 instead. Prints "SKIPPED: ..."
and exits 77 without numpy, onnx or onnxruntime.
"""
import argparse
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("x")
    ap.add_argument("rows", type=int)
    ap.add_argument("cols", type=int)
    ap.add_argument("expected")
    ap.add_argument("--step", type=float, required=True)
    ap.add_argument("--max-steps", type=float, default=1.0)
    ap.add_argument("--min-equal", type=float, default=0.99)
    ap.add_argument("--expect-differ", action="store_true")
    a = ap.parse_args()
    try:
        import numpy as np
        import onnx
        import onnxruntime as ort
    except ImportError as e:
        print(f"SKIPPED: {e.name} is not installed")
        return 77
    onnx.checker.check_model(onnx.load(a.model), full_check=True)
    x = np.fromfile(a.x, dtype="<f4").reshape(a.rows, a.cols)
    sess = ort.InferenceSession(a.model, providers=["CPUExecutionProvider"])
    y = sess.run(None, {sess.get_inputs()[0].name: x})[0]
    ref = np.fromfile(a.expected, dtype="<f4").reshape(y.shape)
    d = np.abs(y.astype(np.float64) - ref.astype(np.float64))
    equal = float((d == 0).mean())
    print(f"max |onnxruntime - qgrad| = {d.max():.6g} ({d.max() / a.step:.3g} steps of {a.step:.6g}); "
          f"{100 * equal:.2f}% of {d.size} outputs equal")
    if a.expect_differ:
        return 0 if d.max() > a.step / 2 else 1
    # 1.001: a one-step difference, (q1 - zp) * s - (q2 - zp) * s, is s rounded in f32
    return 0 if equal >= a.min_equal and d.max() <= a.max_steps * a.step * 1.001 else 1


if __name__ == "__main__":
    sys.exit(main())
