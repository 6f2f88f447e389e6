"""One training loop for 1..N workers, evaluation, and the course's reference settings.

:func:`train` only calls ``optimizer.zero_grad()``, ``loss.backward()`` and
``optimizer.step()``, so it runs unchanged with a plain optimizer, a Horovod
``DistributedOptimizer`` or a DDP-wrapped model. Whatever is distributed-only is passed in:
the ``sampler`` (``set_epoch`` is called each epoch), ``rank``/``world_size`` (progress bar and
prints on rank 0 only), and ``average`` (how to average a metric across ranks; Horovod passes
one built on ``hvd.allreduce(..., name=name)``).

Aggregate throughput: ``images_per_s`` in the history is the speed of ALL workers together.
Each rank measures its own rate; the loop averages it with ``average`` and multiplies by
``world_size`` (average x N = sum). Without ``average`` it assumes the ranks run at the same
speed (own rate x ``world_size``). The rank's own rate is in ``images_per_s_worker``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from multigpu.core.meters import AverageMeter, ThroughputMeter
from multigpu.core.models import CPU_IMAGE_SIZE
from multigpu.core.notebook import progress as _progress
from multigpu.core.schedules import constant, step_decay

Average = Callable[[float, str], float]


def _identity(value: float, name: str) -> float:
    return value


@dataclass(frozen=True)
class TrainConfig:
    """The reference single-worker settings of the CPU default (AlexNetSmall, generated shapes).

    With these, one process on 2 cores reaches >= 90% validation accuracy in 3 epochs of the
    default data set (:func:`train_reference`). ``lr`` is the learning rate for ``batch_size``;
    with a larger global batch, scale it linearly and warm up (:func:`multigpu.core.schedules.linear_scaling_schedule`). The
    last ``decay_epochs`` epochs run at ``lr * decay_factor`` (:func:`reference_schedule`).
    """

    model: str = "alexnet_small"
    image_size: int = CPU_IMAGE_SIZE
    batch_size: int = 64
    lr: float = 0.02
    momentum: float = 0.9
    weight_decay: float = 5e-4
    epochs: int = 3
    decay_epochs: int = 1
    decay_factor: float = 0.1
    target_accuracy: float = 0.9
    num_workers: int = 0  #: DataLoader worker processes (0: load in the training process)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


REFERENCE = TrainConfig()


def reference_schedule(
    lr: float | None = None, epochs: int | None = None, config: TrainConfig = REFERENCE
) -> Callable[[float], float]:
    """The reference learning rate over ``epochs``: constant ``lr``, times ``config.decay_factor``
    for the last ``config.decay_epochs`` epochs."""
    epochs = epochs or config.epochs
    base = constant(config.lr if lr is None else lr)
    return step_decay(base, max(epochs - config.decay_epochs, 0), config.decay_factor)


def make_optimizer(model: nn.Module, lr: float | None = None, config: TrainConfig = REFERENCE) -> torch.optim.SGD:
    """SGD with momentum and weight decay from ``config`` (``lr`` overrides ``config.lr``)."""
    return torch.optim.SGD(
        model.parameters(),
        lr=config.lr if lr is None else lr,
        momentum=config.momentum,
        weight_decay=config.weight_decay,
    )


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Set the learning rate of every parameter group."""
    for group in optimizer.param_groups:
        group["lr"] = lr


def _get_lr(optimizer: torch.optim.Optimizer) -> float:
    return float(optimizer.param_groups[0]["lr"])


def evaluate(
    model: nn.Module,
    loader: Iterable,
    device: torch.device | str = "cpu",
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
) -> tuple[float, float]:
    """Mean loss and accuracy (0..1) of ``model`` over ``loader``; restores the training mode."""
    loss_fn = loss_fn or nn.functional.cross_entropy
    was_training = model.training
    model.eval()
    loss_sum, correct, count = 0.0, 0, 0
    with torch.no_grad():
        for images, labels in loader:
            images = images.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
            out = model(images)
            loss_sum += float(loss_fn(out, labels)) * labels.numel()
            correct += int((out.argmax(1) == labels).sum())
            count += labels.numel()
    model.train(was_training)
    if count == 0:
        return float("nan"), float("nan")
    return loss_sum / count, correct / count


def train(
    model: nn.Module,
    train_loader: Iterable,
    val_loader: Iterable | None,
    *,
    epochs: int,
    optimizer: torch.optim.Optimizer,
    device: torch.device | str = "cpu",
    lr_schedule: Callable[[float], float] | None = None,
    sampler: Any = None,
    rank: int = 0,
    world_size: int = 1,
    average: Average | None = None,
    progress: bool = True,
    target_accuracy: float | None = None,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    untimed_steps: int = 3,
    max_steps_per_epoch: int | None = None,
    verbose: bool = True,
    on_epoch_end: Callable[[dict[str, Any]], None] | None = None,
    stop_at_target: bool = False,
) -> dict[str, Any]:
    """Train ``model`` for ``epochs`` and return a history dict (one list entry per epoch).

    Each step: set the learning rate from ``lr_schedule(fractional_epoch)`` (if given; the
    argument is ``epoch + i / steps_per_epoch``, starting at 0.0), ``zero_grad``, forward,
    ``backward``, ``step``. After each epoch: evaluate on ``val_loader`` (skipped if None),
    average the metrics across ranks with ``average(value, name)`` (default: identity), and, on
    rank 0, print one line (``verbose``). ``sampler.set_epoch(epoch)`` is called when the sampler
    (or ``train_loader.sampler``) has it.

    History keys (lists unless noted): ``epoch`` (1-based), ``train_loss``, ``train_acc``,
    ``val_loss``, ``val_acc``, ``images_per_s`` (aggregate over all workers, warm-up steps
    excluded), ``images_per_s_worker`` (this rank), ``epoch_time_s`` (training part of the
    epoch, without evaluation), ``lr`` (at the end of the epoch), ``elapsed_s`` (wall time since
    the start, evaluation included); scalars ``time_to_accuracy_s`` (training time, i.e. the
    sum of ``epoch_time_s``, until the first epoch whose ``val_acc >= target_accuracy``; None if
    never reached or no target), ``target_accuracy``, ``world_size``, ``steps``. With
    ``stop_at_target`` training ends after the epoch that reached ``target_accuracy``.
    """
    loop = _Loop(model, optimizer, torch.device(device), loss_fn or nn.functional.cross_entropy, lr_schedule,
                 average or _identity, rank == 0, world_size, epochs, _steps_per_epoch(train_loader, max_steps_per_epoch),
                 max_steps_per_epoch, untimed_steps, progress, verbose)
    set_epoch = getattr(sampler, "set_epoch", None) or getattr(getattr(train_loader, "sampler", None), "set_epoch", None)
    history = _new_history(target_accuracy, world_size)
    train_time = 0.0
    t_start = time.perf_counter()
    model.train()
    for epoch in range(epochs):
        if set_epoch is not None:
            set_epoch(epoch)
        record, epoch_time = loop.epoch(epoch, train_loader, val_loader, history, t_start)
        train_time += epoch_time
        _note_target(history, record["val_acc"], target_accuracy, train_time)
        if on_epoch_end is not None:
            on_epoch_end(record)
        if stop_at_target and history["time_to_accuracy_s"] is not None:
            break  # every rank stops at the same epoch: the accuracy it compares is the averaged one
    return history


def _note_target(history: dict[str, Any], val_acc: float | None, target: float | None, train_time: float) -> None:
    """Record ``time_to_accuracy_s`` at the first epoch whose validation accuracy reaches ``target``."""
    if target is not None and history["time_to_accuracy_s"] is None and val_acc is not None and val_acc >= target:
        history["time_to_accuracy_s"] = train_time


HISTORY_KEYS = (
    "epoch", "train_loss", "train_acc", "val_loss", "val_acc", "images_per_s",
    "images_per_s_worker", "epoch_time_s", "lr", "elapsed_s",
)


def _steps_per_epoch(train_loader: Iterable, max_steps_per_epoch: int | None) -> int:
    """Steps of one epoch: the loader's length (``max_steps_per_epoch``, or 1, when it has none),
    at most ``max_steps_per_epoch``."""
    try:
        steps = len(train_loader)  # type: ignore[arg-type]
    except TypeError:
        steps = max_steps_per_epoch or 1
    return steps if max_steps_per_epoch is None else min(steps, max_steps_per_epoch)


def _new_history(target_accuracy: float | None, world_size: int) -> dict[str, Any]:
    """:func:`train`'s history before the first epoch: an empty list per epoch metric, the scalars."""
    history: dict[str, Any] = {k: [] for k in HISTORY_KEYS}
    history.update(time_to_accuracy_s=None, target_accuracy=target_accuracy, world_size=world_size, steps=0)
    return history


@dataclass
class _Loop:
    """What :func:`train` runs each epoch with: one epoch's steps, its record, its printed line."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    device: torch.device
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    lr_schedule: Callable[[float], float] | None
    average: Average
    is_root: bool
    world_size: int
    epochs: int
    steps_per_epoch: int
    max_steps_per_epoch: int | None
    untimed_steps: int
    progress: bool
    verbose: bool

    def epoch(self, epoch: int, train_loader: Iterable, val_loader: Iterable | None, history: dict[str, Any],
              t_start: float) -> tuple[dict[str, Any], float]:
        """Train one epoch, evaluate, append its record to ``history`` and print it (rank 0);
        return the record and this rank's own training time."""
        loss_meter, acc_meter = AverageMeter("loss"), AverageMeter("acc")
        meter = ThroughputMeter(untimed_steps=min(self.untimed_steps, max(0, self.steps_per_epoch - 2)), device=self.device)
        t0 = time.perf_counter()
        self.steps(epoch, train_loader, history, loss_meter, acc_meter, meter)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        epoch_time = time.perf_counter() - t0
        record = self.record(epoch, val_loader, loss_meter, acc_meter, meter.images_per_second, epoch_time, t_start)
        for k, v in record.items():
            history[k].append(v)
        if self.is_root and self.verbose:
            self.report(record, epoch, epoch_time)
        return record, epoch_time

    def steps(self, epoch: int, train_loader: Iterable, history: dict[str, Any], loss_meter: AverageMeter,
              acc_meter: AverageMeter, meter: ThroughputMeter) -> None:
        """One epoch's training steps (a progress bar on rank 0 with ``progress``)."""
        batches: Iterable = train_loader
        bar = None
        if self.progress and self.is_root:
            bar = _progress(train_loader, total=self.steps_per_epoch, desc=f"epoch {epoch + 1}/{self.epochs}", unit="batch",
                            leave=False)
            batches = bar
        meter.start()
        for i, (images, labels) in enumerate(batches):
            if self.max_steps_per_epoch is not None and i >= self.max_steps_per_epoch:
                break
            out, labels, loss_value = self.step(epoch, i, images, labels)
            n = labels.numel()
            loss_meter.update(loss_value, n)
            acc_meter.update(float((out.argmax(1) == labels).float().mean()), n)
            meter.step(n)
            history["steps"] += 1
            if bar is not None and (i % 10 == 0):
                bar.set_postfix(loss=f"{loss_meter.avg:.3f}", acc=f"{acc_meter.avg:.3f}", refresh=False)
        if bar is not None:
            bar.close()

    def step(self, epoch: int, i: int, images: torch.Tensor,
             labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, float]:
        """One step: the scheduled learning rate, ``zero_grad``, forward, ``backward``, ``step``;
        returns the (detached) output, the labels on the device and the loss."""
        if self.lr_schedule is not None:
            set_lr(self.optimizer, self.lr_schedule(epoch + i / self.steps_per_epoch))
        images = images.to(self.device, non_blocking=True)
        labels = labels.to(self.device, non_blocking=True)
        self.optimizer.zero_grad(set_to_none=True)
        out = self.model(images)
        loss = self.loss_fn(out, labels)
        loss.backward()
        self.optimizer.step()
        loss_value = float(loss.detach())
        if not math.isfinite(loss_value) and self.is_root and self.verbose:
            print(f"warning: loss is {loss_value} at epoch {epoch + 1}, step {i} (learning rate too high?)")
        return out.detach(), labels, loss_value

    def record(self, epoch: int, val_loader: Iterable | None, loss_meter: AverageMeter, acc_meter: AverageMeter,
               worker_rate: float, epoch_time: float, t_start: float) -> dict[str, Any]:
        """The epoch's entry of the history: evaluated on ``val_loader`` (when given), each metric
        averaged across ranks."""
        val_loss: float | None
        val_acc: float | None
        if val_loader is not None:
            val_loss, val_acc = evaluate(self.model, val_loader, self.device, self.loss_fn)
            val_loss, val_acc = self.average(val_loss, "val_loss"), self.average(val_acc, "val_acc")
        else:
            val_loss = val_acc = None
        return {
            "epoch": epoch + 1,
            "train_loss": self.average(loss_meter.avg, "train_loss"),
            "train_acc": self.average(acc_meter.avg, "train_acc"),
            "val_loss": val_loss,
            "val_acc": val_acc,
            "images_per_s": self.average(worker_rate, "images_per_s") * self.world_size,
            "images_per_s_worker": worker_rate,
            "epoch_time_s": self.average(epoch_time, "epoch_time_s"),
            "lr": _get_lr(self.optimizer),
            "elapsed_s": time.perf_counter() - t_start,
        }

    def report(self, record: dict[str, Any], epoch: int, epoch_time: float) -> None:
        """The epoch's line on rank 0."""
        val = f"val loss {record['val_loss']:.3f} acc {record['val_acc']:.3f} | " if record["val_acc"] is not None else ""
        print(
            f"epoch {epoch + 1}/{self.epochs} | train loss {record['train_loss']:.3f} acc {record['train_acc']:.3f} | "
            f"{val}{record['images_per_s']:.0f} img/s | {epoch_time:.1f} s | lr {record['lr']:.4g}",
            flush=True,
        )


def train_reference(
    *,
    epochs: int | None = None,
    seed: int = 0,
    data_root: str | None = None,
    batch_size: int | None = None,
    lr: float | None = None,
    lr_schedule: Callable[[float], float] | None = None,
    config: TrainConfig = REFERENCE,
    device: torch.device | str = "cpu",
    progress: bool = True,
    verbose: bool = True,
    max_steps_per_epoch: int | None = None,
) -> dict[str, Any]:
    """Single-worker training of the CPU default with the reference settings; returns the history.

    ``data_root=None`` uses (and generates once) the default data set. ``seed`` fixes the model
    initialisation, shuffling and augmentation. ``batch_size``/``lr`` override the config (for
    the batch-size experiments of Lab 1). Without ``lr_schedule`` the rate follows
    :func:`reference_schedule` (constant, then a tenth for the last epoch).
    """
    from multigpu.core import data, models

    torch.manual_seed(seed)
    train_ds, val_ds = data.load_datasets(data_root, image_size=config.image_size)
    bs = batch_size or config.batch_size
    train_loader = data.make_loader(train_ds, bs, shuffle=True, seed=seed, num_workers=config.num_workers)
    val_loader = data.make_loader(val_ds, 256, num_workers=config.num_workers)
    model = models.build_model(config.model, num_classes=len(train_ds.classes)).to(device)
    optimizer = make_optimizer(model, lr, config)
    history = train(
        model,
        train_loader,
        val_loader,
        epochs=epochs or config.epochs,
        optimizer=optimizer,
        device=device,
        lr_schedule=lr_schedule or reference_schedule(lr, epochs, config),
        progress=progress,
        target_accuracy=config.target_accuracy,
        verbose=verbose,
        max_steps_per_epoch=max_steps_per_epoch,
    )
    history.update(batch_size=bs, seed=seed)
    return history
