"""Tests of the training loop, evaluation and the learning-rate schedules (tiny, fast)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from multigpu.core import data, models, training


def tiny_problem(n: int = 64, seed: int = 0):
    """Linearly separable 2-class images: class 1 is brighter."""
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 2
    x = torch.randn(n, 3, 8, 8, generator=g) * 0.5 + (y.float() * 2 - 1).view(-1, 1, 1, 1)
    return TensorDataset(x, y)


def tiny_model() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 16), nn.ReLU(), nn.Linear(16, 2))


class CountingSampler(torch.utils.data.SequentialSampler):
    def __init__(self, ds):
        super().__init__(ds)
        self.epochs: list[int] = []

    def set_epoch(self, epoch: int) -> None:
        self.epochs.append(epoch)


def test_train_lowers_loss_and_returns_all_keys():
    torch.manual_seed(0)
    ds = tiny_problem()
    sampler = CountingSampler(ds)
    loader = data.make_loader(ds, 8, sampler=sampler)
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    seen_lrs: list[float] = []

    def schedule(epoch: float) -> float:
        seen_lrs.append(epoch)
        return 0.05 * (1 + epoch)

    h = training.train(
        model, loader, data.make_loader(ds, 16), epochs=3, optimizer=opt, lr_schedule=schedule,
        progress=False, verbose=False, target_accuracy=0.9, untimed_steps=1,
    )
    for key in ("epoch", "train_loss", "train_acc", "val_loss", "val_acc", "images_per_s",
                "images_per_s_worker", "epoch_time_s", "lr", "elapsed_s"):
        assert len(h[key]) == 3, key
    assert h["epoch"] == [1, 2, 3]
    assert h["train_loss"][-1] < h["train_loss"][0]
    assert h["val_acc"][-1] >= 0.9
    assert h["time_to_accuracy_s"] is not None and h["time_to_accuracy_s"] <= sum(h["epoch_time_s"]) + 1e-9
    assert sampler.epochs == [0, 1, 2], "sampler.set_epoch must be called every epoch"
    assert seen_lrs[0] == 0.0 and seen_lrs[8] == pytest.approx(1.0), "schedule gets the fractional epoch"
    assert h["lr"][-1] == pytest.approx(0.05 * (1 + 2 + 7 / 8))
    assert h["steps"] == 24 and all(r > 0 for r in h["images_per_s"])


def test_stop_at_target_ends_after_the_epoch_that_reached_it():
    torch.manual_seed(0)
    ds = tiny_problem()
    kwargs = dict(epochs=6, progress=False, verbose=False, untimed_steps=1)
    model = tiny_model()
    full = training.train(model, data.make_loader(ds, 8), data.make_loader(ds, 16),
                          optimizer=torch.optim.SGD(model.parameters(), lr=0.05), target_accuracy=0.9, **kwargs)
    torch.manual_seed(0)
    model = tiny_model()
    short = training.train(model, data.make_loader(ds, 8), data.make_loader(ds, 16),
                           optimizer=torch.optim.SGD(model.parameters(), lr=0.05), target_accuracy=0.9,
                           stop_at_target=True, **kwargs)
    reached = next(i for i, acc in enumerate(full["val_acc"]) if acc >= 0.9) + 1
    assert reached < 6 and short["epoch"] == list(range(1, reached + 1)) and short["steps"] == 8 * reached
    assert short["time_to_accuracy_s"] == pytest.approx(sum(short["epoch_time_s"]))
    model = tiny_model()  # a target never reached: every epoch runs
    never = training.train(model, data.make_loader(ds, 8), None, optimizer=torch.optim.SGD(model.parameters(), lr=0.05),
                           target_accuracy=0.9, stop_at_target=True, **kwargs)
    assert len(never["epoch"]) == 6 and never["time_to_accuracy_s"] is None


def test_train_uses_average_and_world_size():
    ds = tiny_problem(32)
    names: list[str] = []

    def average(value: float, name: str) -> float:
        names.append(name)
        return value

    h = training.train(
        tiny_model(), data.make_loader(ds, 8), None, epochs=1, optimizer=torch.optim.SGD(tiny_model().parameters(), lr=0.0),
        world_size=4, average=average, progress=False, verbose=False, rank=1,
    )
    assert h["images_per_s"][0] == pytest.approx(4 * h["images_per_s_worker"][0]), "aggregate = mean x world size"
    assert h["val_acc"] == [None] and h["time_to_accuracy_s"] is None
    assert {"train_loss", "train_acc", "images_per_s", "epoch_time_s"} <= set(names)


def test_train_respects_max_steps_and_progress_on_rank0(capsys):
    ds = tiny_problem(64)
    model = tiny_model()
    h = training.train(model, data.make_loader(ds, 4), None, epochs=2, optimizer=torch.optim.SGD(model.parameters(), lr=0.01),
                    max_steps_per_epoch=3, progress=True, verbose=True)
    assert h["steps"] == 6
    assert "epoch 2/2" in capsys.readouterr().out


def test_evaluate_and_mode_restore():
    ds = tiny_problem(16)
    model = tiny_model()
    model.train()
    loss, acc = training.evaluate(model, data.make_loader(ds, 5), "cpu")
    assert model.training
    assert 0.0 <= acc <= 1.0 and loss > 0
    with torch.no_grad():
        x, y = ds.tensors
        expected = nn.functional.cross_entropy(model(x), y).item()
    assert loss == pytest.approx(expected, rel=1e-5)


def test_reference_setup_and_alexnet_small_step():
    cfg = training.REFERENCE
    assert cfg.model == "alexnet_small" and cfg.epochs == 3 and cfg.batch_size > 0 and 0 < cfg.lr < 1
    model = models.build_model(cfg.model)
    opt = training.make_optimizer(model)
    assert opt.param_groups[0]["momentum"] == cfg.momentum
    ds = data.SyntheticImages(16, image_size=cfg.image_size, classes=10, pool=16)
    h = training.train(model, data.make_loader(ds, 8), data.make_loader(ds, 8), epochs=1, optimizer=opt,
                    progress=False, verbose=False)
    assert len(h["val_acc"]) == 1 and h["images_per_s"][0] > 0
