"""Train AlexNet(Small) on the course's image data on ONE device. Your assessment: convert it to Horovod.

Run it as it is (one process, one device)::

    python train.py

Your converted version must run on 4 workers with::

    horovodrun -np 4 -H localhost:4 python train.py

The grader runs exactly that, with this script's DEFAULTS: bake the hyperparameters you choose
(per-worker batch size, learning rate, warm-up, epochs) into the defaults of ``parse_args``.

The grading contract (keep it while you convert; the assessment notebook explains it):

- Train on the data set at ``$MULTIGPU_ASSESSMENT_DATA`` when it is set (``--data``).
- At the end of EVERY epoch, EVERY worker calls :func:`save_checkpoint` with its own rank. It
  writes ``$MULTIGPU_CHECKPOINT_DIR/rank-<rank>-epoch-<epoch>.pt``: the model's weights and the
  indices of the training samples this worker trained on in that epoch.
- The grader evaluates those weights itself on a held-out set of its own. Nothing this script
  prints or writes as a metric is used for grading.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
from torch.utils.data import Dataset

from multigpu.core import data, devices, models


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Train AlexNet(Small) on the course's image data.")
    p.add_argument("--epochs", type=int, default=3, help="passes over the training data")
    p.add_argument("--batch-size", type=int, default=64, help="images per step")
    p.add_argument("--lr", type=float, default=0.02, help="learning rate (SGD with momentum)")
    p.add_argument("--decay-epochs", type=int, default=1, help="the last N epochs run at a tenth of --lr")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--weight-decay", type=float, default=5e-4)
    p.add_argument("--model", default="alexnet_small", help="alexnet_small (CPU default) or alexnet")
    p.add_argument("--data", default=os.environ.get("MULTIGPU_ASSESSMENT_DATA"),
                   help="ImageFolder root with train/ and val/ (default: the course's generated set)")
    p.add_argument("--checkpoint-dir", default=os.environ.get("MULTIGPU_CHECKPOINT_DIR", "checkpoints"),
                   help="where save_checkpoint writes (the grader sets MULTIGPU_CHECKPOINT_DIR)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: every core)")
    return p.parse_args(argv)


class WithIndex(Dataset):
    """Yields ``(image, label, index)``: the index says which sample was trained on."""

    def __init__(self, dataset: data.JPEGFolder) -> None:
        self.dataset = dataset
        self.classes = dataset.classes

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int):
        image, label = self.dataset[i]
        return image, label, i


def save_checkpoint(directory: str, model: torch.nn.Module, epoch: int, rank: int, indices: list[int]) -> Path:
    """The grading contract: ``directory/rank-<rank>-epoch-<epoch>.pt`` with the weights and the
    indices of the samples trained on this epoch. Keep this function as it is."""
    path = Path(directory) / f"rank-{rank}-epoch-{epoch}.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    tmp = path.with_suffix(".tmp")
    torch.save({"model": state, "epoch": epoch, "rank": rank, "indices": [int(i) for i in indices]}, tmp)
    os.replace(tmp, path)  # the grader never sees half a file
    return path


def evaluate(model: torch.nn.Module, loader, device: torch.device) -> float:
    """Accuracy (0..1) of ``model`` on ``loader``."""
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for images, labels in loader:
            out = model(images.to(device))
            correct += int((out.argmax(1) == labels.to(device)).sum())
            total += labels.numel()
    model.train()
    return correct / max(total, 1)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    device = devices.worker_device(0)
    torch.set_num_threads(args.threads or devices.threads_per_worker(1))

    root = args.data or data.ensure_dataset()
    size = models.default_image_size(args.model)
    train_set = WithIndex(data.JPEGFolder(root, data.train_transform(size), split="train"))
    val_set = data.JPEGFolder(root, data.val_transform(size), split="val")
    train_loader = data.make_loader(train_set, args.batch_size, shuffle=True)
    val_loader = data.make_loader(val_set, 256)

    model = models.build_model(args.model, num_classes=len(train_set.classes)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum,
                                weight_decay=args.weight_decay)
    loss_fn = torch.nn.CrossEntropyLoss()

    for epoch in range(1, args.epochs + 1):
        model.train()
        for group in optimizer.param_groups:  # a tenth of the rate for the last epochs: settles the weights
            group["lr"] = args.lr * (0.1 if epoch > args.epochs - args.decay_epochs else 1.0)
        trained_on: list[int] = []
        for images, labels, index in train_loader:
            images, labels = images.to(device), labels.to(device)
            optimizer.zero_grad()
            loss = loss_fn(model(images), labels)
            loss.backward()
            optimizer.step()
            trained_on.extend(index.tolist())
        save_checkpoint(args.checkpoint_dir, model, epoch, 0, trained_on)
        accuracy = evaluate(model, val_loader, device)
        print(f"epoch {epoch}/{args.epochs}: loss {loss.item():.3f}, validation accuracy {accuracy:.3f}", flush=True)


if __name__ == "__main__":
    main()
