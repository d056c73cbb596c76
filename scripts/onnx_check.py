#!/usr/bin/env python3
"""Runs an exported qgrad model (examples' --export-onnx, docs/export.md) with
onnxruntime's CPU execution provider on the Fashion-MNIST test set and prints
its accuracy and its agreement with qgrad's own predictions.

    scripts/onnx_check.py MODEL.onnx [--data DIR] [--predictions FILE]
                          [--logits FILE.npy] [--min-agreement P] [--limit N]

--predictions: qgrad's predicted classes, one per line (the *_predictions.txt
beside the export); --logits: qgrad's logits (*_logits.npy), for the largest
logit difference. The model is first checked with onnx.checker. Exit code 1
when the checker fails or the agreement is below --min-agreement (a fraction),
77 when onnx/onnxruntime/numpy or the data set is missing (a skip).
"""
import argparse
import gzip
import pathlib
import sys

SKIP = 77


def load_images(data, limit):
    import numpy as np
    path = pathlib.Path(data) / "t10k-images-idx3-ubyte.gz"
    labels = pathlib.Path(data) / "t10k-labels-idx1-ubyte.gz"
    if not path.exists() or not labels.exists():
        print(f"SKIPPED: Fashion-MNIST test set not found under {data}")
        sys.exit(SKIP)
    raw = gzip.decompress(path.read_bytes())
    n, rows, cols = (int.from_bytes(raw[i:i + 4], "big") for i in (4, 8, 12))
    px = np.frombuffer(raw, np.uint8, offset=16).reshape(n, rows * cols)
    y = np.frombuffer(gzip.decompress(labels.read_bytes()), np.uint8, offset=8).astype(np.int64)
    if limit:
        px, y = px[:limit], y[:limit]
    # qgrad's normalisation (nn/data.h), in f32 as it computes it: (x/255 - mean) * (1/std)
    v = px.astype(np.float32) / np.float32(255)
    x = (v - np.float32(0.2860)) * np.float32(1.0 / 0.3530)
    return x.astype(np.float32), y


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--predictions", help="qgrad's predicted classes, one per line")
    ap.add_argument("--logits", help="qgrad's logits (.npy, f32 [N, classes])")
    ap.add_argument("--min-agreement", type=float, default=0.0,
                    help="fail (exit 1) when the agreement with --predictions is below this fraction")
    ap.add_argument("--limit", type=int, default=0, help="only the first N test images (0: all)")
    a = ap.parse_args()
    try:
        import numpy as np
        import onnx
        import onnxruntime as ort
    except ImportError as e:
        print(f"SKIPPED: {e.name} is not installed (pip install numpy onnx onnxruntime)")
        return SKIP

    model = onnx.load(a.model)
    onnx.checker.check_model(model, full_check=True)
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    ops = sorted({n.op_type for n in model.graph.node})
    print(f"{a.model}: onnx.checker passed; opset {opset}; ops {', '.join(ops)}")

    x, labels = load_images(a.data, a.limit)
    sess = ort.InferenceSession(a.model, providers=["CPUExecutionProvider"])
    inp = sess.get_inputs()[0].name
    out = np.concatenate([sess.run(None, {inp: x[i:i + 1000]})[0] for i in range(0, len(x), 1000)])
    pred = out.argmax(axis=1)  # the first largest logit, as the predictions files
    print(f"onnxruntime {ort.__version__} (CPU): accuracy {100 * (pred == labels).mean():.2f}% "
          f"on {len(labels)} test images")
    rc = 0
    if a.logits:
        ref = np.load(a.logits)[:len(out)]
        if ref.shape != out.shape:
            print(f"error: --logits has shape {ref.shape}, the model gives {out.shape}")
            return 1
        d = np.abs(ref.astype(np.float64) - out.astype(np.float64))
        i = np.unravel_index(d.argmax(), d.shape)
        print(f"largest logit difference vs qgrad: {d.max():.6g} (image {i[0]}, class {i[1]}); "
              f"{(d.max(axis=1) > 0).sum()} images differ in any logit")
    if a.predictions:
        ref = np.loadtxt(a.predictions, dtype=np.int64, ndmin=1)[:len(pred)]
        if ref.shape != pred.shape:
            print(f"error: --predictions has {len(ref)} entries, the test set {len(pred)}")
            return 1
        agree = (ref == pred).mean()
        print(f"agreement with qgrad's predictions: {100 * agree:.2f}% ({(ref != pred).sum()} of {len(pred)} differ)")
        if agree < a.min_agreement:
            print(f"FAILED: agreement {agree:.6f} is below {a.min_agreement}")
            rc = 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
