"""Linear learning-rate scaling with gradual warm-up (Goyal et al. 2017)."""

from __future__ import annotations

import pytest

from multigpu.core import schedules


def test_scaled_lr_is_linear_in_batch_size():
    assert schedules.scaled_lr(0.1, 256, 256) == pytest.approx(0.1)
    assert schedules.scaled_lr(0.1, 8192, 256) == pytest.approx(3.2)  # Goyal et al.'s ImageNet setting
    assert schedules.scaled_lr(0.02, 32, 64) == pytest.approx(0.01)
    with pytest.raises(ValueError):
        schedules.scaled_lr(0.1, 0, 256)


def test_warmup_rises_linearly_then_holds():
    f = lambda e: schedules.warmup_lr(e, 0.1, 0.8, 2.0)  # noqa: E731
    assert f(0) == pytest.approx(0.1)
    assert f(1.0) == pytest.approx(0.45)
    assert f(2.0) == pytest.approx(0.8)
    assert f(7.5) == pytest.approx(0.8)
    values = [f(i / 10) for i in range(21)]
    assert values == sorted(values)
    assert schedules.warmup_lr(0.0, 0.1, 0.8, 0) == pytest.approx(0.8)
    with pytest.raises(ValueError):
        schedules.warmup_lr(0.0, 0.1, 0.8, -1)


@pytest.mark.parametrize("base_lr, bs, base_bs, warmup", [(0.02, 512, 64, 1.0), (0.1, 64, 256, 0.5), (0.05, 128, 128, 3.0), (0.02, 256, 32, 0.0)])
def test_schedule_is_lr_at_of_the_fractional_epoch(base_lr, bs, base_bs, warmup):
    s = schedules.linear_scaling_schedule(base_lr, bs, base_bs, warmup)
    for e in (0.0, 0.1, 0.49, 0.5, 1.0, 2.5, 10.0):
        assert s(e) == pytest.approx(schedules.lr_at(e, base_lr, bs, base_bs, warmup))
    assert s(100.0) == pytest.approx(base_lr * bs / base_bs)


def test_constant_and_warmup_steps():
    assert schedules.constant(0.3)(5.0) == 0.3
    assert schedules.warmup_steps(0.5, 47) == 24


def test_linear_scaling_schedule_warms_up_linearly():
    s = schedules.linear_scaling_schedule(0.1, batch_size=256, base_batch_size=64, warmup_epochs=2)
    assert s(0.0) == pytest.approx(0.1)
    assert s(1.0) == pytest.approx(0.25)
    assert s(2.0) == s(5.0) == pytest.approx(0.4)
    assert schedules.linear_scaling_schedule(0.1, 64, 64)(0.0) == pytest.approx(0.1)
