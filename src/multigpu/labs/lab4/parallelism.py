"""Lab 4: data parallelism against model parallelism, the same network split both ways over 2 processes.

Data parallelism gives every worker the whole model and a slice of the batch, and all-reduces the
gradients after backward: every step moves the gradient, one number per parameter, whatever the
batch. Model parallelism (here its simplest form, a pipeline of two stages without micro-batches)
gives every worker a part of the model and the whole batch: the first stage sends its output
activations forward, the second sends their gradient back, one number per activation at each cut,
whatever the number of parameters. Which moves fewer bytes depends on the layer shapes (parameters
against batch x width at the cut); model parallelism is what makes a model run at all when its
parameters, gradients and optimizer state do not fit on one device.

:func:`measure` runs both (``launch.run``, 2 processes, Gloo) on each configuration and counts the
bytes from the tensors each rank hands to ``send`` or ``all_reduce``; times are medians of steps
after warm-up. :func:`one_step_weights` is the check that both compute the same step.
"""

from __future__ import annotations

import functools
import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from multigpu.running import launch


@dataclass(frozen=True)
class Shape:
    """A multi-layer perceptron of ``depth`` square ``width`` x ``width`` layers and its global ``batch``."""

    name: str
    width: int
    depth: int
    batch: int
    classes: int = 10


#: Wide layers and a small batch (the case of large language models), narrow layers and a large batch.
SHAPES = (Shape("wide layers, batch 32", 1024, 4, 32), Shape("narrow layers, batch 2048", 128, 4, 2048))


def build(shape: Shape, seed: int = 0) -> nn.Sequential:
    """The network: ``depth`` Linear+ReLU layers of ``width``, then a classifier; the same on every rank for a seed."""
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for _ in range(shape.depth):
        layers += [nn.Linear(shape.width, shape.width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(shape.width, shape.classes))


def stages(model: nn.Sequential) -> tuple[nn.Module, nn.Module]:
    """The two pipeline stages: the first half of the hidden layers, and the rest with the classifier."""
    cut = 2 * (len(model) // 4)  # after a ReLU, half of the Linear+ReLU pairs
    return model[:cut], model[cut:]


def batch_of(shape: Shape, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of one step (inputs, labels): the same on every rank."""
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(shape.batch, shape.width, generator=g), torch.randint(0, shape.classes, (shape.batch,), generator=g)


def pipeline_step(rank: int, stage: nn.Module, opt: torch.optim.Optimizer, shape: Shape, step: int) -> int:
    """One training step of a 2-stage pipeline; the bytes this rank sent."""
    x, y = batch_of(shape, step)
    opt.zero_grad()
    if rank == 0:
        out = stage(x)
        dist.send(out.detach().contiguous(), dst=1)  # activations forward
        grad = torch.empty_like(out)
        dist.recv(grad, src=1)
        out.backward(grad)
        sent = out.numel() * out.element_size()
    else:
        inputs = torch.empty(shape.batch, shape.width)
        dist.recv(inputs, src=0)
        inputs.requires_grad_(True)
        F.cross_entropy(stage(inputs), y).backward()
        back = inputs.grad
        assert back is not None
        dist.send(back.contiguous(), dst=0)  # their gradient back
        sent = back.numel() * back.element_size()
    opt.step()
    return sent


def data_parallel_step(rank: int, world: int, model: nn.Module, opt: torch.optim.Optimizer, shape: Shape, step: int) -> int:
    """One training step of data parallelism (this rank's slice of the batch, gradients averaged).

    Returns the bytes this rank sends in a ring all-reduce of the gradient, ``2 (N-1)/N`` of it.
    """
    x, y = batch_of(shape, step)
    part = shape.batch // world
    opt.zero_grad()
    F.cross_entropy(model(x[rank * part:(rank + 1) * part]), y[rank * part:(rank + 1) * part]).backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch.cat([g.flatten() for g in grads])
    dist.all_reduce(flat)  # the gradient, summed over the workers
    flat /= world
    torch.nn.utils.vector_to_parameters(flat, grads)
    opt.step()
    return round(2 * (world - 1) / world * flat.numel() * flat.element_size())  # a ring's share per worker (02b)


def _timed(run_step: Any, steps: int, warmup: int) -> dict[str, float]:
    sent, times = 0, []
    for step in range(warmup + steps):
        dist.barrier()
        start = time.perf_counter()
        moved = run_step(step)
        dist.barrier()
        if step >= warmup:
            times.append(time.perf_counter() - start)
            sent = moved
    return {"bytes": float(sent), "step_s": statistics.median(times)}


def both_ways(rank: int, world: int, shapes: tuple[Shape, ...], steps: int, warmup: int = 2) -> dict[str, Any]:
    """In each of 2 processes: per shape, the pipeline and data parallelism, timed; what this rank measured."""
    out: dict[str, Any] = {}
    for shape in shapes:
        model = build(shape)
        mine = stages(model)[rank]
        opt = torch.optim.SGD(mine.parameters(), lr=0.01)
        pipe = _timed(functools.partial(pipeline_step, rank, mine, opt, shape), steps, warmup)
        model = build(shape)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        data = _timed(functools.partial(data_parallel_step, rank, world, model, opt, shape), steps, warmup)
        params = sum(p.numel() for p in model.parameters())
        out[shape.name] = {"pipeline": pipe, "data parallel": data, "parameters": params}
    return out


def measure(shapes: tuple[Shape, ...] = SHAPES, steps: int = 10, timeout: float = 120.0) -> dict[str, dict[str, Any]]:
    """Both ways on 2 processes (Gloo), per shape: bytes each rank sent per step (summed over ranks) and step time."""
    ranks = launch.run(both_ways, 2, args=(shapes, steps), backend="gloo", timeout=timeout, echo=False)
    result = {}
    for shape in shapes:
        per_rank = [r[shape.name] for r in ranks]
        result[shape.name] = {
            "parameters": per_rank[0]["parameters"],
            **{way: {"bytes": sum(r[way]["bytes"] for r in per_rank),
                     "step_s": max(r[way]["step_s"] for r in per_rank)} for way in ("pipeline", "data parallel")},
        }
    return result


def one_step_weights(rank: int, world: int, shape: Shape, way: str) -> list[torch.Tensor]:
    """This rank's weights after one step of ``way`` ("pipeline" or "data parallel") from :func:`build`'s start."""
    model = build(shape)
    mine = stages(model)[rank] if way == "pipeline" else model
    opt = torch.optim.SGD(mine.parameters(), lr=0.1)
    if way == "pipeline":
        pipeline_step(rank, mine, opt, shape, 0)
    else:
        data_parallel_step(rank, world, mine, opt, shape, 0)
    return [p.detach().clone() for p in mine.parameters()]
