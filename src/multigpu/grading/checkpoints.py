"""The checkpoints of a run: found (:func:`find_checkpoints`), loaded as plain weights
(:func:`load_checkpoint`, ``weights_only=True``: no code from a submission runs in the grader),
compared (:func:`state_difference` of the trainable :func:`weights_only`), counted
(:func:`images_per_epoch`) and evaluated on the grader's held-out set (:func:`holdout_accuracy`)."""

from __future__ import annotations

import functools
import io
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from multigpu.core import data, models, training
from multigpu.grading import runner
from multigpu.running import timeline

#: Largest difference between two ranks' weights that still counts as identical.
IDENTICAL_TOL = 1e-6
#: Largest checkpoint file the grader reads (bytes): AlexNet's weights are 0.25 GB, AlexNetSmall's 0.09.
MAX_CHECKPOINT_BYTES = 2**30


def load_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """A checkpoint of the contract, ``{"model": {name: tensor}, "indices": [int, ...]}``, loaded
    with ``weights_only=True``: tensors and plain containers only, no code from the submission."""
    try:  # a regular file of bounded size first: a FIFO or a symlink named like a checkpoint would hang or mislead
        raw = torch.load(io.BytesIO(timeline.read_regular_file(path, MAX_CHECKPOINT_BYTES)), map_location="cpu",
                         weights_only=True)
    except Exception as e:  # an unpicklable object, a truncated file, not a torch file at all
        raise ValueError(f"{Path(path).name} cannot be loaded as plain weights: {str(e).splitlines()[0][:200]}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("model"), dict) or "indices" not in raw:
        raise ValueError(f"{Path(path).name} does not follow the contract: save it with save_checkpoint() "
                         "(a dict with 'model' = state_dict and 'indices' = the samples trained on)")
    if not all(isinstance(v, torch.Tensor) for v in raw["model"].values()):
        raise ValueError(f"{Path(path).name} does not follow the contract: 'model' must hold tensors only")
    indices = raw["indices"]
    indices = indices.tolist() if isinstance(indices, torch.Tensor) else list(indices)
    if not all(isinstance(i, int) for i in indices):
        raise ValueError(f"{Path(path).name} does not follow the contract: 'indices' must be integers")
    return {"model": raw["model"], "indices": indices}


def state_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> tuple[float, str]:
    """The largest absolute difference between two state dicts and the tensor where it is
    (``(0.0, "")`` when identical; ``inf`` when names or shapes differ)."""
    worst, where = 0.0, ""
    for name in sorted(set(a) | set(b)):
        if name not in a or name not in b or a[name].shape != b[name].shape:
            return math.inf, name
        x, y = a[name], b[name]
        if not x.is_floating_point():
            d = 0.0 if torch.equal(x, y) else math.inf
        else:
            d = float((x.double() - y.double()).abs().max()) if x.numel() else 0.0
        if d > worst:
            worst, where = d, name
    return worst, where


def weights_only(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The trainable weights of a state dict, without buffers.

    BatchNorm's running statistics are buffers each rank computes from its own shard (Horovod
    averages gradients, not buffers), so they differ between correct ranks; the weights must not.
    A state dict that fits none of the course's models is returned whole.
    """
    for name in models.MODELS:
        weights, buffers = _state_names(name)
        if set(state) == weights | buffers:
            return {k: v for k, v in state.items() if k in weights}
    return state


@functools.lru_cache(maxsize=None)
def _state_names(model_name: str) -> tuple[frozenset[str], frozenset[str]]:
    """Names of the parameters and of the buffers of a course model (they do not depend on classes)."""
    model = models.build_model(model_name, num_classes=2)
    return frozenset(n for n, _ in model.named_parameters()), frozenset(n for n, _ in model.named_buffers())


def find_checkpoints(folder: Path) -> dict[tuple[int, int], Path]:
    """The checkpoints a run left in ``folder``: ``(rank, epoch) -> path``. A ``folder`` that is a
    symbolic link (the run's processes could make it one: to another learner's run, to root's files)
    holds none; a checkpoint that is a link is found, and refused by :func:`load_checkpoint`."""
    out = {}
    for p in folder.glob("rank-*-epoch-*.pt") if folder.is_dir() and not folder.is_symlink() else []:
        m = runner.CHECKPOINT.match(p.name)
        if m:
            out[(int(m.group(1)), int(m.group(2)))] = p
    return out


def images_per_epoch(loaded: Mapping[tuple[int, int], dict]) -> dict[int, int]:
    """Samples trained on per epoch, all ranks together, from the loaded checkpoints: the DISTINCT
    indices the ranks reported (an index listed twice, by one rank or by two, is one image)."""
    seen: dict[int, set[int]] = {}
    for (_, epoch), c in loaded.items():
        seen.setdefault(epoch, set()).update(c["indices"])
    return {epoch: len(indices) for epoch, indices in seen.items()}


def _fit_model(state: dict[str, torch.Tensor], num_classes: int) -> tuple[torch.nn.Module, str] | None:
    """The course model whose architecture the weights fit (the contract allows the course's models)."""
    for name in sorted(models.MODELS, key=lambda n: n != "alexnet_small"):  # the CPU default first
        model = models.build_model(name, num_classes=num_classes)
        try:
            model.load_state_dict(state, strict=True)
        except (RuntimeError, KeyError):
            continue
        return model, name
    return None


def holdout_accuracy(state: dict[str, torch.Tensor], holdout: Path) -> float:
    """Accuracy of the weights on the grader's held-out set (evaluated by the grader itself)."""
    classes, _ = data.find_classes(holdout / "val")
    fitted = _fit_model(state, len(classes))
    if fitted is None:
        raise ValueError("the weights fit none of the course's models "
                         f"({', '.join(models.MODELS)}) with {len(classes)} classes")
    model, name = fitted
    dataset = data.JPEGFolder(holdout, data.val_transform(models.default_image_size(name)), split="val")
    _, accuracy = training.evaluate(model, data.make_loader(dataset, 256))
    return accuracy
