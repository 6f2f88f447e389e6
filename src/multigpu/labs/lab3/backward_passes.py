"""Lab 3: gradient accumulation under data parallelism, counted on real workers.

Lab 1's ``accumulate`` adds up the gradients of ``k`` micro-batches before one optimizer step.
Under Horovod every backward pass starts the all-reduce of each gradient as backward produces it
(the ``DistributedOptimizer``'s hooks), so ``k`` backward passes before a step would mean ``k``
rounds of all-reduces; Horovod 0.28.1 refuses the second ("Gradients were computed more than
backward_passes_per_step times before call to step()"). ``hvd.DistributedOptimizer(...,
backward_passes_per_step=k)`` counts the passes and all-reduces the summed gradient once, after
the ``k``-th: one round per optimizer step, ``k`` times fewer bytes on the wire per image. PyTorch
DDP does the same with ``no_sync()`` around the first ``k - 1`` backward passes.

:func:`experiment` runs in every worker of a Horovod job started with ``HOROVOD_TIMELINE=DYNAMIC``
(:data:`TIMELINE_ENV`) and takes the same optimizer steps in each of :data:`WAYS`, each way with
its own timeline (Horovod's coordinator, rank 0, writes it): one batch of ``k x b`` images per
worker; ``k`` micro-batches with ``backward_passes_per_step=k``; ``k`` micro-batches with an
all-reduce after each (``optimizer.synchronize()``, what DDP does without ``no_sync``). Every way
scales each micro-batch's loss by ``1 / k``, as Lab 1's ``accumulate`` does, and ends with the
same weights as the large batch, to float32's rounding. :func:`count_allreduces` reads a timeline.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import horovod.torch as hvd
import torch
import torch.nn.functional as F
from torch import nn

from multigpu.labs.lab1.scaling_rule import SmallConvNet
from multigpu.running import timeline

#: The environment a job needs for :func:`experiment`: timelines started and stopped from Python.
TIMELINE_ENV = {"HOROVOD_TIMELINE": "DYNAMIC"}

#: The ways one optimizer step is taken: the large batch at once, accumulated with one all-reduce
#: per step, accumulated with an all-reduce per micro-batch.
WAYS = ("one batch of k x b", "k micro-batches, backward_passes_per_step=k", "k micro-batches, all-reduce each")


def model_for(seed: int) -> nn.Module:
    """The network of every way: Lab 1's small convolutional network for 16x16 images, weights from ``seed``."""
    torch.manual_seed(seed)
    return SmallConvNet(side=16, width=8)


def batches(seed: int, steps: int, per_worker: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """This rank's slice of ``steps`` global batches (``per_worker`` images each on every rank), the
    same global batches on every rank for a seed."""
    generator = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        images = torch.randn(hvd.size() * per_worker, 3, 16, 16, generator=generator)
        labels = torch.randint(0, 10, (hvd.size() * per_worker,), generator=generator)
        mine = slice(hvd.rank() * per_worker, (hvd.rank() + 1) * per_worker)
        out.append((images[mine], labels[mine]))
    return out


def one_way(way: str, k: int, micro: int, steps: int, seed: int, timeline_path: str | Path | None = None) -> list[torch.Tensor]:
    """Take ``steps`` optimizer steps ``way`` (one of :data:`WAYS`), ``k`` micro-batches of ``micro``
    images per worker each; return the weights. ``timeline_path``: record this way's collectives."""
    model = model_for(seed)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    passes = k if way == WAYS[1] else 1
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                         named_parameters=model.named_parameters(), backward_passes_per_step=passes)
    if timeline_path is not None:
        hvd.start_timeline(str(timeline_path))
    for images, labels in batches(seed, steps, k * micro):
        optimizer.zero_grad()
        if way == WAYS[0]:
            F.cross_entropy(model(images), labels).backward()
            optimizer.step()
            continue
        for x, y in zip(images.split(micro), labels.split(micro)):
            (F.cross_entropy(model(x), y) / k).backward()  # Lab 1's accumulate: each piece's share
            if way == WAYS[2]:
                optimizer.synchronize()  # all-reduce now; the next backward adds to the averaged gradient
        if way == WAYS[2]:
            with optimizer.skip_synchronize():
                optimizer.step()
        else:
            optimizer.step()  # backward_passes_per_step=k: the k-th backward started the one all-reduce
    if timeline_path is not None:
        hvd.stop_timeline()
    return [p.detach().clone() for p in model.parameters()]


def refused(k: int, micro: int, seed: int) -> str:
    """What Horovod says when ``k`` backward passes come before a step without ``backward_passes_per_step``."""
    model = model_for(seed)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                         named_parameters=[(f"refused.{n}", p) for n, p in model.named_parameters()])
    images, labels = batches(seed, 1, k * micro)[0]
    try:
        for x, y in zip(images.split(micro), labels.split(micro)):
            (F.cross_entropy(model(x), y) / k).backward()
    except AssertionError as e:
        message = str(e)
    else:
        message = ""
    optimizer.synchronize()  # finish the all-reduces the first pass started, so that no worker is left waiting
    return message


def experiment(folder: str, k: int = 4, micro: int = 4, steps: int = 3, seed: int = 0) -> dict[str, Any]:
    """In every worker of a Horovod job (``TIMELINE_ENV`` set): every way of :data:`WAYS`, each with a
    timeline ``folder/<i>.json``; per way the largest difference of its weights from the large
    batch's, and what Horovod says without ``backward_passes_per_step``."""
    hvd.init()
    torch.set_num_threads(1)
    weights = {way: one_way(way, k, micro, steps, seed, Path(folder) / f"{i}.json") for i, way in enumerate(WAYS)}
    large = weights[WAYS[0]]
    scale = max(float(w.abs().max()) for w in large)
    return {
        "k": k, "micro": micro, "steps": steps, "workers": hvd.size(),
        "parameters": len(large),
        "difference": {way: max(float((a - b).abs().max()) for a, b in zip(w, large)) / scale for way, w in weights.items()},
        "refused": refused(k, micro, seed),
    }


def count_allreduces(path: str | Path, prefix: str = "allreduce.") -> int:
    """How many all-reduces of tensors named ``prefix...`` a timeline holds (each tensor's top-level
    ALLREDUCE phases, one per all-reduce of that tensor, fused or not)."""
    return sum(1 for s in timeline.spans(timeline.load(path))
               if s.tensor.startswith(prefix) and s.depth == 0 and s.phase == "ALLREDUCE")


def rounds_per_step(result: dict[str, Any], folder: str | Path) -> dict[str, float]:
    """Per way: all-reduces of the gradients per optimizer step, in rounds (one round: every
    parameter's gradient all-reduced once), counted from the ways' timelines."""
    per_round = result["parameters"] * result["steps"]
    return {way: count_allreduces(Path(folder) / f"{i}.json") / per_round for i, way in enumerate(WAYS)}


def table(result: dict[str, Any], rounds: dict[str, float], ways: Sequence[str] = WAYS) -> str:
    """One line per way: all-reduce rounds per optimizer step and the difference from the large batch's weights."""
    lines = [f"{'way (per worker, every optimizer step)':<46}{'all-reduce rounds/step':>24}{'weights vs one batch':>22}"]
    k = result["k"]
    for way in ways:
        name = way.replace("k ", f"{k} ").replace("=k", f"={k}")
        lines.append(f"{name:<46}{rounds[way]:>24.2f}{result['difference'][way]:>22.1e}")
    return "\n".join(lines)
