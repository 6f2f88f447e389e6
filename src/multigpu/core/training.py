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
    never reached or no target), ``target_accuracy``, ``world_size``, ``steps``.
    """
    average = average or _identity
    loss_fn = loss_fn or nn.functional.cross_entropy
    device = torch.device(device)
    is_root = rank == 0
    set_epoch = getattr(sampler, "set_epoch", None) or getattr(getattr(train_loader, "sampler", None), "set_epoch", None)
    try:
        steps_per_epoch = len(train_loader)  # type: ignore[arg-type]
    except TypeError:
        steps_per_epoch = max_steps_per_epoch or 1
    if max_steps_per_epoch is not None:
        steps_per_epoch = min(steps_per_epoch, max_steps_per_epoch)

    keys = (
        "epoch", "train_loss", "train_acc", "val_loss", "val_acc", "images_per_s",
        "images_per_s_worker", "epoch_time_s", "lr", "elapsed_s",
    )
    history: dict[str, Any] = {k: [] for k in keys}
    history.update(time_to_accuracy_s=None, target_accuracy=target_accuracy, world_size=world_size, steps=0)
    train_time = 0.0
    t_start = time.perf_counter()
    model.train()

    for epoch in range(epochs):
        if set_epoch is not None:
            set_epoch(epoch)
        loss_meter, acc_meter = AverageMeter("loss"), AverageMeter("acc")
        meter = ThroughputMeter(untimed_steps=min(untimed_steps, max(0, steps_per_epoch - 2)), device=device)
        batches: Iterable = train_loader
        bar = None
        if progress and is_root:
            bar = _progress(train_loader, total=steps_per_epoch, desc=f"epoch {epoch + 1}/{epochs}", unit="batch", leave=False)
            batches = bar
        t0 = time.perf_counter()
        meter.start()
        for i, (images, labels) in enumerate(batches):
            if max_steps_per_epoch is not None and i >= max_steps_per_epoch:
                break
            if lr_schedule is not None:
                set_lr(optimizer, lr_schedule(epoch + i / steps_per_epoch))
            images = images.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
            optimizer.zero_grad(set_to_none=True)
            out = model(images)
            loss = loss_fn(out, labels)
            loss.backward()
            optimizer.step()
            n = labels.numel()
            loss_value = float(loss.detach())
            if not math.isfinite(loss_value) and is_root and verbose:
                print(f"warning: loss is {loss_value} at epoch {epoch + 1}, step {i} (learning rate too high?)")
            loss_meter.update(loss_value, n)
            acc_meter.update(float((out.detach().argmax(1) == labels).float().mean()), n)
            meter.step(n)
            history["steps"] += 1
            if bar is not None and (i % 10 == 0):
                bar.set_postfix(loss=f"{loss_meter.avg:.3f}", acc=f"{acc_meter.avg:.3f}", refresh=False)
        if bar is not None:
            bar.close()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        epoch_time = time.perf_counter() - t0
        train_time += epoch_time

        val_loss: float | None
        val_acc: float | None
        if val_loader is not None:
            val_loss, val_acc = evaluate(model, val_loader, device, loss_fn)
            val_loss, val_acc = average(val_loss, "val_loss"), average(val_acc, "val_acc")
        else:
            val_loss = val_acc = None
        worker_rate = meter.images_per_second
        record = {
            "epoch": epoch + 1,
            "train_loss": average(loss_meter.avg, "train_loss"),
            "train_acc": average(acc_meter.avg, "train_acc"),
            "val_loss": val_loss,
            "val_acc": val_acc,
            "images_per_s": average(worker_rate, "images_per_s") * world_size,
            "images_per_s_worker": worker_rate,
            "epoch_time_s": average(epoch_time, "epoch_time_s"),
            "lr": _get_lr(optimizer),
            "elapsed_s": time.perf_counter() - t_start,
        }
        for k, v in record.items():
            history[k].append(v)
        if (
            target_accuracy is not None
            and history["time_to_accuracy_s"] is None
            and val_acc is not None
            and val_acc >= target_accuracy
        ):
            history["time_to_accuracy_s"] = train_time
        if is_root and verbose:
            val = f"val loss {val_loss:.3f} acc {val_acc:.3f} | " if val_acc is not None else ""
            print(
                f"epoch {epoch + 1}/{epochs} | train loss {record['train_loss']:.3f} acc {record['train_acc']:.3f} | "
                f"{val}{record['images_per_s']:.0f} img/s | {epoch_time:.1f} s | lr {record['lr']:.4g}",
                flush=True,
            )
        if on_epoch_end is not None:
            on_epoch_end(record)
    return history


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
