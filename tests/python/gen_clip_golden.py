"""Golden values of torch.nn.utils.clip_grad_norm_ for tests/test_clip_grad.cpp.

Run with torch 2.11 (CPU): python3 tests/python/gen_clip_golden.py
The gradients are exact f32 values from integer formulas, so the C++ test
rebuilds the same tensors without any file.
"""
import torch

SIZES = [(70, 70), (5, 3), (0,), (300, 451), (1,)]


def grads():
    out = []
    for k, shape in enumerate(SIZES):
        n = 1
        for d in shape:
            n *= d
        i = torch.arange(n, dtype=torch.int64)
        v = ((i * 7919 + k * 104729) % 2001 - 1000).to(torch.float32) / 256.0 * (2.0 ** (k - 3))
        out.append(v.reshape(shape))
    return out


# PyTorch raises for the inf-norm of an empty tensor (qgrad: 0, the max's
# identity), so the inf case leaves the empty one out (its grad stays None).
for norm_type, max_norm in [(2.0, 5.0), (1.0, 1e9), (float("inf"), 0.5), (2.0, 1e9)]:
    ps = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads()]
    for p, g in zip(ps, grads()):
        if g.numel() > 0 or norm_type != float("inf"):
            p.grad = g.clone()
    total = torch.nn.utils.clip_grad_norm_(ps, max_norm, norm_type)
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    samples = [ps[0].grad.flatten()[123].item(), ps[3].grad.flatten()[100000].item(), ps[4].grad.flatten()[0].item()]
    print(f"{{{norm_type!r}, {max_norm!r}, {total.item()!r}, {coef.item()!r}, "
          f"{{{', '.join(repr(s) for s in samples)}}}}},")
