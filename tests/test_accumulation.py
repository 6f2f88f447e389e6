"""multigpu.labs.lab1.accumulation: gradient accumulation, the bytes saved for backward, the cost in speed."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from multigpu.labs.lab1 import accumulation
from multigpu.labs.lab1.scaling_rule import SmallConvNet

loss_fn = nn.functional.cross_entropy


def batch(n: int = 12, side: int = 8, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    rng = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, side, side, generator=rng), torch.randint(0, 10, (n,), generator=rng)


def one_batch_gradient(model, x, y):
    model.zero_grad()
    loss = loss_fn(model(x), y)
    loss.backward()
    return loss.item(), accumulation.gradients(model)


@pytest.mark.parametrize("k", [1, 2, 4, 5, 12])
def test_accumulating_micro_batches_gives_the_whole_batchs_gradient(k):
    torch.manual_seed(0)
    model = SmallConvNet(side=8, width=4)
    x, y = batch(12)
    loss, whole = one_batch_gradient(model, x, y)
    for p in model.parameters():
        p.grad = torch.full_like(p, 7.0)  # what was in .grad before is replaced, not added to
    before = [p.detach().clone() for p in model.parameters()]
    got = accumulation.accumulate(model, loss_fn, x, y, k)
    assert got == pytest.approx(loss, rel=1e-5)
    for g, p, w in zip(whole, model.parameters(), before):
        assert torch.allclose(p.grad, g, rtol=1e-4, atol=1e-6)
        assert torch.equal(p, w)  # no optimizer step
    assert accumulation.max_difference(model, loss_fn, x, y, k) < 1e-5


def test_a_sum_over_micro_batches_is_k_times_too_large():
    model = SmallConvNet(side=8, width=4)
    x, y = batch(12)

    def summed(model, loss_fn, inputs, targets, k):
        model.zero_grad()
        for a, b in zip(inputs.chunk(k), targets.chunk(k)):
            loss_fn(model(a), b).backward()

    assert accumulation.max_difference(model, loss_fn, x, y, 3, accumulate_fn=summed) > 1.0


def test_batchnorm_makes_micro_batches_differ_from_the_whole_batch():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 10))
    x, y = batch(16)
    assert accumulation.max_difference(model.train(), loss_fn, x, y, 4) > 0.01
    assert accumulation.max_difference(model.eval(), loss_fn, x, y, 4) < 1e-5


def test_saved_bytes_leave_the_parameters_out():
    layer = nn.Linear(10, 3)
    with accumulation.SavedTensors(layer) as saved:
        layer(torch.randn(8, 10)).sum().backward()
    assert saved.peak_bytes == 8 * 10 * 4  # the input (the weight it also saves is a parameter)
    assert saved.live_bytes == 0  # freed by backward


def test_micro_batches_keep_a_kth_of_the_activations_and_one_backward_at_the_end_keeps_them_all():
    model = SmallConvNet(side=16, width=8)
    x, y = batch(32, side=16)

    def one_backward(model, loss_fn, inputs, targets, k):
        model.zero_grad()
        sum(loss_fn(model(a), b) * len(a) / len(inputs) for a, b in zip(inputs.chunk(k), targets.chunk(k))).backward()

    rows = accumulation.measure(model, loss_fn, x, y, [1, 4], repeats=1)
    assert [r["micro_batch"] for r in rows] == [32, 8]
    assert rows[1]["saved_bytes"] == pytest.approx(rows[0]["saved_bytes"] / 4, rel=0.05)
    assert all(r["s_per_example"] > 0 for r in rows)
    kept = accumulation.measure(model, loss_fn, x, y, [1, 4], accumulate_fn=one_backward, repeats=1)
    assert kept[1]["saved_bytes"] >= kept[0]["saved_bytes"]
    text = accumulation.table(rows)
    assert "0.25x" in text and "1.00x" in text


def test_micro_batches_must_be_positive():
    model = SmallConvNet(side=8, width=4)
    with pytest.raises(ValueError):
        accumulation.accumulate(model, loss_fn, *batch(4), 0)
