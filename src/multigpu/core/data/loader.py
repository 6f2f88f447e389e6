"""The DataLoader the course uses, and the default train/val datasets."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from multigpu.core.data.datasets import JPEGFolder
from multigpu.core.data.generate import ensure_dataset
from multigpu.core.data.transforms import collate, train_transform, val_transform
from multigpu.core.models import CPU_IMAGE_SIZE


def _seed_worker(worker_id: int) -> None:
    # torch already seeds each worker (base_seed + id); numpy needs the same treatment.
    np.random.seed(torch.initial_seed() % 2**32)


def make_loader(
    dataset: Dataset,
    batch_size: int,
    *,
    shuffle: bool = False,
    sampler: Sampler | None = None,
    num_workers: int = 0,
    pin_memory: bool = False,
    prefetch_factor: int | None = None,
    seed: int = 0,
    drop_last: bool = False,
    persistent_workers: bool | None = None,
) -> DataLoader:
    """A DataLoader with sensible defaults for a 2-core machine.

    ``num_workers=0`` (default) loads in the training process: on 2 cores extra loader
    processes compete with the model for the same cores. ``seed`` fixes the shuffling order
    and the workers' augmentation streams. With a ``sampler`` (e.g. ``DistributedSampler``)
    ``shuffle`` must be False: the sampler shuffles. Worker processes stay alive between
    epochs (``persistent_workers``) when there are any.
    """
    if sampler is not None and shuffle:
        raise ValueError("pass shuffle=False with a sampler (the sampler does the shuffling)")
    kwargs: dict[str, Any] = {}
    if num_workers > 0:
        kwargs["prefetch_factor"] = prefetch_factor if prefetch_factor is not None else 2
        kwargs["persistent_workers"] = True if persistent_workers is None else persistent_workers
        kwargs["worker_init_fn"] = _seed_worker
    return DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=shuffle,
        sampler=sampler,
        num_workers=num_workers,
        pin_memory=pin_memory,
        drop_last=drop_last,
        collate_fn=collate,
        generator=torch.Generator().manual_seed(seed),
        **kwargs,
    )


def load_datasets(
    root: str | os.PathLike | None = None, image_size: int = CPU_IMAGE_SIZE, **params: Any
) -> tuple[JPEGFolder, JPEGFolder]:
    """``(train, val)`` JPEGFolders with the course transforms. ``root=None`` uses (and if needed
    generates) the default data set; any ImageFolder root with ``train/`` and ``val/`` works."""
    if root is None:
        root = ensure_dataset(**params)
    return (
        JPEGFolder(root, train_transform(image_size), split="train"),
        JPEGFolder(root, val_transform(image_size), split="val"),
    )
