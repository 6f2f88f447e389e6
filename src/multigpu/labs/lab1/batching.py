"""Helpers for the batch-size experiments of Lab 1: in-memory subsets, run summaries, batches.

Decoding JPEGs costs more than a small model's training step on a CPU, so the batch-size
sweep decodes a class-balanced subset once (:func:`in_memory`) and trains from tensors; the
throughput it measures is then that of the training step alone (Lab 2 times the input pipeline).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from statistics import median
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from multigpu.core.data import finish


def balanced_indices(labels: list[int] | np.ndarray, n: int, seed: int = 0) -> np.ndarray:
    """``n`` indices with the classes as equally represented as possible, in shuffled order.

    Takes a random ``ceil(n / classes)`` of each class, then keeps the first ``n`` of a shuffled,
    round-robin interleaving (so a prefix of the result is balanced too). ``n`` larger than the
    data set gives every index.
    """
    labels = np.asarray(labels)
    rng = np.random.default_rng(seed)
    n = min(int(n), len(labels))
    classes = np.unique(labels)
    per = -(-n // len(classes))
    pools = [rng.permutation(np.flatnonzero(labels == c))[:per] for c in classes]
    order = [pool[i] for i in range(per) for pool in pools if i < len(pool)]
    chosen = np.array(order[:n], dtype=int)
    if len(chosen) < n:  # some class ran out: top up from the rest
        rest = np.setdiff1d(np.arange(len(labels)), chosen)
        chosen = np.concatenate([chosen, rng.permutation(rest)[: n - len(chosen)]])
    return rng.permutation(chosen)


def in_memory(dataset: Dataset, n: int | None = None, seed: int = 0) -> TensorDataset:
    """A class-balanced subset of ``n`` samples of ``dataset`` (all if ``None``), decoded once.

    ``dataset[i]`` must return ``(tensor, label)`` (e.g. a ``JPEGFolder`` with a transform;
    its per-image :class:`multigpu.core.data.Pixels` are finished one by one with
    :func:`multigpu.core.data.finish`). Returns a ``TensorDataset`` of ``(images, labels)`` with
    ``.classes`` copied over when present. Use a deterministic transform (``val_transform``):
    random augmentation would be frozen.
    """
    labels = getattr(dataset, "targets", None)
    if labels is None:
        labels = [int(dataset[i][1]) for i in range(len(dataset))]  # type: ignore[arg-type]
    idx = balanced_indices(labels, len(labels) if n is None else n, seed)
    images, targets = [], []
    for i in idx:
        image, label = dataset[int(i)]
        images.append(torch.as_tensor(finish(image)))
        targets.append(int(label))
    out = TensorDataset(torch.stack(images), torch.tensor(targets, dtype=torch.long))
    if hasattr(dataset, "classes"):
        out.classes = list(dataset.classes)  # type: ignore[attr-defined]
    return out


def batches(dataset: Dataset, batch_size: int, count: int, seed: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """``count`` random, disjoint batches of ``batch_size`` samples (for gradient-noise estimates)."""
    need = batch_size * count
    if need > len(dataset):  # type: ignore[arg-type]
        raise ValueError(f"{count} batches of {batch_size} need {need} samples, the data set has {len(dataset)}")  # type: ignore[arg-type]
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed))  # type: ignore[arg-type]
    for k in range(count):
        items = [dataset[int(i)] for i in order[k * batch_size : (k + 1) * batch_size]]
        yield torch.stack([torch.as_tensor(finish(a)) for a, _ in items]), torch.tensor([int(b) for _, b in items])


def summary(history: Mapping[str, Any], batch_size: int, model: nn.Module | None = None) -> dict[str, Any]:
    """One row of a batch-size sweep from a :func:`multigpu.core.training.train` history.

    ``images_per_s`` is the median over epochs (robust to one slow epoch on a busy machine),
    ``val_acc`` the accuracy after the last epoch, ``train_loss`` the mean training loss of the last
    epoch (did the model fit its training set: optimisation, beside ``val_acc``'s generalisation), ``time_s`` the training time (no evaluation).
    The full ``history`` (and ``model`` when given) are kept for plots and later measurements.
    """
    return {
        "batch_size": int(batch_size),
        "steps": int(history["steps"]),
        "images_per_s": float(median(history["images_per_s"])),
        "val_acc": float(history["val_acc"][-1]),
        "val_loss": float(history["val_loss"][-1]),
        "train_loss": float(history["train_loss"][-1]),  # mean over the last epoch's steps
        "time_s": float(sum(history["epoch_time_s"])),
        "lr": float(history["lr"][-1]),
        "history": dict(history),
        "model": model,
    }


def compare_sweep(rows: list[Mapping[str, Any]]) -> list[str]:
    """Sentences that say what a batch-size sweep (rows of :func:`summary`, smallest batch first)
    measured: steps, throughput, accuracy and training loss of the largest batch against the smallest."""
    small, large = rows[0], rows[-1]
    b0, b1 = small["batch_size"], large["batch_size"]
    drop = 100 * (small["val_acc"] - large["val_acc"])
    fits = ("fits its training images less well (higher training loss): it lost out in optimisation"
            if large["train_loss"] > small["train_loss"] else "fits its training images as well or better")
    return [
        f"batch {b1} took {small['steps'] / large['steps']:.0f} x fewer steps than batch {b0} and ran at "
        f"{large['images_per_s'] / small['images_per_s']:.2f} x its images/s",
        f"validation accuracy {100 * small['val_acc']:.1f}% at batch {b0}, {100 * large['val_acc']:.1f}% at batch {b1} "
        f"({abs(drop):.1f} points {'lower' if drop > 0 else 'higher'}); training loss {small['train_loss']:.3f} "
        f"against {large['train_loss']:.3f}: the large batch {fits}",
    ]
