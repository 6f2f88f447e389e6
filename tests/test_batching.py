"""In-memory subsets, noise-estimate batches and sweep summaries for Lab 1's batch-size experiments."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

from multigpu.labs.lab1 import batching


class Labelled(Dataset):
    """Tiny dataset: sample i is a 2x2 image filled with i, label i % classes."""

    def __init__(self, n: int = 40, classes: int = 4) -> None:
        self.n, self.k = n, classes
        self.targets = [i % classes for i in range(n)]
        self.classes = [str(c) for c in range(classes)]

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return torch.full((2, 2), float(i)), self.targets[i]


def test_balanced_indices_are_balanced_unique_and_seeded():
    labels = np.repeat(np.arange(5), 30)
    idx = batching.balanced_indices(labels, 20, seed=1)
    assert len(idx) == 20 and len(set(idx.tolist())) == 20
    assert np.bincount(labels[idx], minlength=5).tolist() == [4] * 5
    assert np.array_equal(idx, batching.balanced_indices(labels, 20, seed=1))
    assert not np.array_equal(idx, batching.balanced_indices(labels, 20, seed=2))
    assert sorted(batching.balanced_indices(labels, 1000).tolist()) == list(range(150))


def test_balanced_indices_top_up_when_a_class_is_short():
    labels = np.array([0] * 2 + [1] * 20)
    idx = batching.balanced_indices(labels, 10)
    assert len(set(idx.tolist())) == 10 and np.sum(labels[idx] == 0) == 2


def test_in_memory_holds_the_right_samples():
    ds = Labelled()
    mem = batching.in_memory(ds, 12, seed=0)
    assert len(mem) == 12 and mem.classes == ds.classes
    images, labels = mem.tensors
    assert images.shape == (12, 2, 2) and labels.dtype == torch.long
    for image, label in zip(images, labels):
        assert int(image[0, 0]) % 4 == int(label)
    assert torch.bincount(labels).tolist() == [3, 3, 3, 3]


def test_batches_are_disjoint_and_sized():
    got = list(batching.batches(Labelled(), 5, count=4, seed=0))
    assert len(got) == 4 and all(x.shape == (5, 2, 2) and y.shape == (5,) for x, y in got)
    seen = torch.cat([x[:, 0, 0] for x, _ in got]).tolist()
    assert len(set(seen)) == 20
    with pytest.raises(ValueError):
        list(batching.batches(Labelled(), 50, count=2))


def test_summary_reads_a_history():
    h = {"steps": 30, "images_per_s": [100.0, 300.0, 200.0], "val_acc": [0.2, 0.5], "val_loss": [2.0, 1.5],
         "train_loss": [2.2, 1.25], "epoch_time_s": [1.0, 2.5], "lr": [0.1, 0.2]}
    s = batching.summary(h, 64)
    assert s["batch_size"] == 64 and s["steps"] == 30 and s["images_per_s"] == 200.0
    assert s["val_acc"] == 0.5 and s["train_loss"] == 1.25 and s["time_s"] == 3.5 and s["lr"] == 0.2 and s["model"] is None
    assert s["history"]["val_acc"] == [0.2, 0.5]


def test_compare_sweep_says_what_the_sweep_measured():
    rows = [{"batch_size": 16, "steps": 600, "images_per_s": 100.0, "val_acc": 0.70, "train_loss": 0.9},
            {"batch_size": 256, "steps": 38, "images_per_s": 250.0, "val_acc": 0.30, "train_loss": 1.4}]
    steps, accuracy = batching.compare_sweep(rows)
    assert steps == "batch 256 took 16 x fewer steps than batch 16 and ran at 2.50 x its images/s"
    assert "70.0% at batch 16, 30.0% at batch 256 (40.0 points lower)" in accuracy
    assert accuracy.endswith("fits its training images less well (higher training loss): it lost out in optimisation")
    rows[1].update(val_acc=0.75, train_loss=0.5)
    assert "(5.0 points higher)" in batching.compare_sweep(rows)[1]
    assert batching.compare_sweep(rows)[1].endswith("fits its training images as well or better")
