"""What the Horovod script and its DDP twin share, with no distributed library imported: the
command line (documented in :mod:`multigpu.running.scripts.train_horovod`), the weight checksum and the
data. Their per-rank run record is :mod:`multigpu.running.run_records`."""

from __future__ import annotations

import argparse
from typing import Any

import torch

from multigpu.core import data, models, training


def parser(description: str) -> argparse.ArgumentParser:
    """The options both scripts take (see :mod:`multigpu.running.scripts.train_horovod`'s docstring)."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=training.REFERENCE.batch_size)
    p.add_argument("--base-lr", type=float, default=training.REFERENCE.lr)
    p.add_argument("--warmup-epochs", type=float, default=1.0)
    p.add_argument("--data", default=None)
    p.add_argument("--train-per-class", type=int, default=None)
    p.add_argument("--val-per-class", type=int, default=None)
    p.add_argument("--synthetic", type=int, default=0)
    p.add_argument("--max-steps", type=int, default=None)
    p.add_argument("--model", default=training.REFERENCE.model)
    p.add_argument("--target-accuracy", type=float, default=training.REFERENCE.target_accuracy)
    p.add_argument("--stop-at-target", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--fp16-allreduce", action="store_true")
    p.add_argument("--record", action="store_true")
    p.add_argument("--quiet", action="store_true")
    return p


def checksum(model: torch.nn.Module) -> float:
    """Sum of all trainable weights in float64: equal on every rank when the ranks train as one model.

    Buffers are left out: BatchNorm's running statistics are each rank's own (Horovod averages
    gradients, not buffers), so they differ between ranks even when the weights are identical.
    """
    return float(sum(p.detach().double().sum() for p in model.parameters()))


def datasets(args: argparse.Namespace, rank: int) -> tuple[Any, Any]:
    """``(train_set, val_set)`` from the options: synthetic images (no validation set), an
    ImageFolder root (the first K images of each class with ``--train-per-class K``, likewise
    ``--val-per-class``), or the course's generated set of that size (rank 0 shows the progress of
    generating it)."""
    size = models.default_image_size(args.model)
    if args.synthetic:
        return data.SyntheticImages(args.synthetic, size, seed=args.seed), None
    if args.data:  # a folder of your own; --train-per-class / --val-per-class take a slice of it
        train, val = data.load_datasets(args.data, image_size=size)
        return (train.first_per_class(args.train_per_class) if args.train_per_class else train,
                val.first_per_class(args.val_per_class) if args.val_per_class else val)
    root = data.ensure_dataset(train_per_class=args.train_per_class, val_per_class=args.val_per_class, progress=rank == 0)
    return data.load_datasets(root, image_size=size)
