"""Tests of the meters, with a controlled clock."""

from __future__ import annotations

import pytest

from multigpu.core.meters import AverageMeter, ThroughputMeter


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_throughput_excludes_untimed_steps():
    clock = FakeClock()
    m = ThroughputMeter(untimed_steps=2, clock=clock)
    for dt in (5.0, 3.0):  # slow warm-up steps
        clock.t += dt
        m.step(10)
    assert not m.warm
    for _ in range(4):  # 4 steps of 0.5 s, 10 items each
        clock.t += 0.5
        m.step(10)
    assert m.warm and m.items == 40 and m.all_items == 60
    assert m.elapsed == pytest.approx(2.0)
    assert m.images_per_second == pytest.approx(20.0)


def test_throughput_without_warmup_counts_everything():
    clock = FakeClock()
    m = ThroughputMeter(untimed_steps=0, clock=clock)
    clock.t += 1.0
    m.step(8)
    clock.t += 1.0
    m.step(8)
    assert m.images_per_second == pytest.approx(8.0)


def test_short_run_falls_back_to_all_steps_and_reset():
    clock = FakeClock()
    m = ThroughputMeter(untimed_steps=5, clock=clock)
    assert m.images_per_second == 0.0
    clock.t += 2.0
    m.step(4)
    assert not m.warm and m.images_per_second == pytest.approx(2.0)
    m.reset()
    assert m.steps == 0 and m.images_per_second == 0.0
    with pytest.raises(ValueError):
        ThroughputMeter(untimed_steps=-1)


def test_average_meter_is_weighted_by_count():
    a = AverageMeter("loss")
    assert a.avg == 0.0
    a.update(1.0, n=3)
    a.update(0.0, n=1)
    assert a.avg == pytest.approx(0.75) and a.count == 4 and a.last == 0.0


@pytest.mark.gpu
def test_throughput_meter_syncs_cuda():
    import torch

    m = ThroughputMeter(untimed_steps=1, device="cuda")
    x = torch.randn(2048, 2048, device="cuda")
    for _ in range(3):
        x @ x
        m.step(1)
    assert m.images_per_second > 0
