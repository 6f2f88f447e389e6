"""multigpu.labs.lab1.large_batch: LARS's trust ratio and the optimizer that applies it (Lab 1, part 5)."""

from __future__ import annotations

import math

import pytest
import torch

from multigpu.labs.lab1 import large_batch


def test_trust_ratio_is_eta_weight_norm_over_gradient_norm_plus_decay():
    w, g = torch.tensor([3.0, 4.0]), torch.tensor([0.0, 2.0])
    assert large_batch.trust_ratio(w, g, 0.1) == pytest.approx(0.25)
    assert large_batch.trust_ratio(w, g, 0.1, 0.1) == pytest.approx(0.5 / 2.5)
    kernel = torch.ones(4, 3, 2, 2)  # the norm of the whole kernel: sqrt(48)
    assert large_batch.trust_ratio(kernel, 2 * kernel, 1.0) == pytest.approx(0.5)
    assert large_batch.trust_ratio(torch.zeros(3), torch.ones(3), 0.1) == 1.0  # would never move
    assert large_batch.trust_ratio(torch.ones(3), torch.zeros(3), 0.1) == 1.0  # 0 / 0
    assert large_batch.trust_ratio(torch.ones(3), torch.zeros(3), 0.1, 0.5) == pytest.approx(0.2)


def test_lars_scales_each_layers_step_by_its_trust_ratio_and_leaves_biases_at_the_global_rate():
    torch.manual_seed(0)
    layer = torch.nn.Linear(5, 3)
    w0, b0 = layer.weight.detach().clone(), layer.bias.detach().clone()
    opt = large_batch.LARS(layer.parameters(), lr=0.5, momentum=0.9, weight_decay=0.01, eta=0.02)
    for step in range(2):
        opt.zero_grad()
        layer(torch.randn(8, 5)).pow(2).sum().backward()
        gw, gb = layer.weight.grad.clone(), layer.bias.grad.clone()
        w, b = layer.weight.detach().clone(), layer.bias.detach().clone()
        ratio = 0.02 * float(w.norm()) / (float(gw.norm()) + 0.01 * float(w.norm()))
        if step == 0:
            vw, vb = 0.5 * ratio * (gw + 0.01 * w), 0.5 * gb  # the bias: ratio 1, no weight decay
        else:
            vw, vb = 0.9 * vw + 0.5 * ratio * (gw + 0.01 * w), 0.9 * vb + 0.5 * gb
        opt.step()
        assert torch.allclose(layer.weight, w - vw, atol=1e-6) and torch.allclose(layer.bias, b - vb, atol=1e-6)
    assert not torch.equal(layer.weight, w0) and not torch.equal(layer.bias, b0)


def test_lars_uses_the_trust_ratio_it_is_given():
    calls = []

    def fixed(weight, grad, eta, weight_decay):
        calls.append((tuple(weight.shape), eta, weight_decay))
        return 0.0  # a ratio of zero: the weights must not move

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(), torch.nn.LazyLinear(2))
    model(torch.randn(2, 3, 6, 6))
    opt = large_batch.make_lars(model, 0.1, eta=0.03, trust_ratio_fn=fixed)
    before = [p.detach().clone() for p in model.parameters()]
    model(torch.randn(2, 3, 6, 6)).sum().backward()
    opt.step()
    assert calls == [((4, 3, 3, 3), 0.03, 5e-4), ((2, 64), 0.03, 5e-4)]  # the weights only
    moved = [not torch.equal(p, q) for p, q in zip(model.parameters(), before)]
    assert moved == [False, True, False, True]  # kernels frozen by the ratio 0, biases moved at lr


def test_lars_refuses_a_nonsense_rate():
    with pytest.raises(ValueError):
        large_batch.LARS(torch.nn.Linear(2, 2).parameters(), lr=-1.0)
    with pytest.raises(ValueError):
        large_batch.LARS(torch.nn.Linear(2, 2).parameters(), lr=0.1, eta=0.0)
    assert math.isfinite(large_batch.trust_ratio(torch.full((3,), 1e30), torch.full((3,), 1e-30), 1.0))
