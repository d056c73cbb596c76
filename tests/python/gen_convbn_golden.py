#!/usr/bin/env python3
"""Golden values of PyTorch's fused Conv-BN QAT modules for tests/test_qat_conv.cpp.

Writes tests/data/golden_convbn.json: for two cases,
  "convbnrelu": torch.ao.nn.intrinsic.qat.ConvBnReLU2d(3 -> 5, 3x3, padding 1, bias)
  "convbn":     torch.ao.nn.intrinsic.qat.ConvBn2d(4 -> 6, 3x3, stride 2, no bias)
each with the 'x86' default QAT qconfig's observers and ranges (weights qint8
per channel symmetric on axis 0, activations quint8 [0, 127], moving
averages 0.01; FakeQuantize modules, see qat_qconfig) and the
output activation fake quant that prepare_qat attaches (qconfig.activation()):
  the initial parameters and running statistics (random, not PyTorch's init);
  step 1 (training): x1, out1 = act(m(x1)), the gradients of sum(out1 * g1)
      with respect to x1, weight, bias, bn.weight and bn.bias, the running
      statistics after it and the weight fake quant's scales;
  step 2 (training): x2, out2, running statistics after it;
  frozen (freeze_bn_stats, still training): x3, out3, running statistics
      (unchanged), the gradients of sum(out3 * g3);
  eval (model.eval()): x4, out4.
Every tensor is f32, as a flat list of values (exact in JSON: repr of the f32).

Run with PyTorch 2.11 (CPU wheel is enough):  python3 tests/python/gen_convbn_golden.py
"""
import json
import os

import torch
import torch.ao.nn.intrinsic.qat as nniqat
from torch.ao.quantization import FakeQuantize, MovingAverageMinMaxObserver, MovingAveragePerChannelMinMaxObserver, QConfig


def flat(t):
    return [float(v) for v in t.detach().reshape(-1).tolist()]


def qat_qconfig():
    """get_default_qat_qconfig("x86") with FakeQuantize in place of FusedMovingAvgObsFakeQuantize: the
    same observers and ranges, and the qparams formulas qgrad follows (the fused kernel divides a
    symmetric range by 128 instead of (qmax - qmin) / 2 = 127.5)."""
    return QConfig(
        activation=FakeQuantize.with_args(observer=MovingAverageMinMaxObserver, quant_min=0, quant_max=255,
                                          reduce_range=True),
        weight=FakeQuantize.with_args(observer=MovingAveragePerChannelMinMaxObserver, quant_min=-128,
                                      quant_max=127, dtype=torch.qint8, qscheme=torch.per_channel_symmetric))


def case(name, cin, cout, stride, padding, bias, relu, gen):
    qconfig = qat_qconfig()
    cls = nniqat.ConvBnReLU2d if relu else nniqat.ConvBn2d
    m = cls(cin, cout, 3, stride=stride, padding=padding, bias=bias, qconfig=qconfig)
    act = qconfig.activation()
    m.train()
    act.train()
    with torch.no_grad():
        m.weight.copy_(torch.randn(m.weight.shape, generator=gen) * 0.3)
        if bias:
            m.bias.copy_(torch.randn(cout, generator=gen) * 0.2)
        m.bn.weight.copy_(torch.rand(cout, generator=gen) + 0.5)
        m.bn.bias.copy_(torch.randn(cout, generator=gen) * 0.1)
        m.bn.running_mean.copy_(torch.randn(cout, generator=gen) * 0.2)
        m.bn.running_var.copy_(torch.rand(cout, generator=gen) + 0.5)
    out = {
        "in_channels": cin, "out_channels": cout, "stride": stride, "padding": padding, "bias": bias, "relu": relu,
        "weight": flat(m.weight), "bn_weight": flat(m.bn.weight), "bn_bias": flat(m.bn.bias),
        "running_mean": flat(m.bn.running_mean), "running_var": flat(m.bn.running_var),
    }
    if bias:
        out["conv_bias"] = flat(m.bias)

    def step(tag, frozen_grad):
        x = torch.randn(4, cin, 7, 7, generator=gen).requires_grad_(True)
        y = act(m(x))
        out["x" + tag] = flat(x)
        out["out" + tag] = flat(y)
        out["out_shape"] = list(y.shape)
        if frozen_grad:
            g = torch.randn(y.shape, generator=gen)
            out["g" + tag] = flat(g)
            for p in [x, m.weight, m.bias, m.bn.weight, m.bn.bias]:
                if p is not None and p.grad is not None:
                    p.grad = None
            (y * g).sum().backward()
            out["grad_x" + tag] = flat(x.grad)
            out["grad_weight" + tag] = flat(m.weight.grad)
            if bias:
                out["grad_bias" + tag] = flat(m.bias.grad)
            out["grad_bn_weight" + tag] = flat(m.bn.weight.grad)
            out["grad_bn_bias" + tag] = flat(m.bn.bias.grad)
        out["running_mean" + tag] = flat(m.bn.running_mean)
        out["running_var" + tag] = flat(m.bn.running_var)
        out["weight_scale" + tag] = flat(m.weight_fake_quant.scale)
        out["act_scale" + tag] = flat(act.scale)
        out["act_zero_point" + tag] = [int(v) for v in act.zero_point.reshape(-1).tolist()]

    step("1", True)
    step("2", False)
    m.freeze_bn_stats()
    m.train()  # a frozen bn stays frozen
    step("3", True)
    m.eval()
    act.eval()
    step("4", False)
    return name, out


def main():
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(12)
    cases = dict([case("convbnrelu", 3, 5, 1, 1, True, True, gen), case("convbn", 4, 6, 2, 0, False, False, gen)])
    cases["torch_version"] = torch.__version__
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "golden_convbn.json")
    with open(path, "w") as f:
        json.dump(cases, f)
    print("wrote", os.path.normpath(path))


if __name__ == "__main__":
    main()
