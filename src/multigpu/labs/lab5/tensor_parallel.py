"""Lab 5, part 4: tensor parallelism, Megatron-LM's split of a two-layer MLP.

``Y = relu(X A^T + a) B^T + b`` with ``A`` (hidden x d) and ``B`` (d x hidden). Megatron-LM
(Shoeybi et al. 2019, section 3) splits ``A`` by its rows (the hidden units: a column-parallel
layer) and ``B`` by its columns (a row-parallel layer) over N workers: each computes
``relu(X A_r^T + a_r) B_r^T``, a partial sum of ``Y``, with no communication in between (the
ReLU applies to each worker's own hidden units). The paper writes ``Y = GeLU(X A) B`` with ``A``
(d x hidden) split by its columns and ``B`` by its rows: torch's ``nn.Linear`` stores a weight as
(out, in), the transpose, so the paper's columns of ``A`` are the rows of the weight here. Two
operators make it exact:

- ``g`` after the row-parallel layer: **all-reduce** in the forward pass (the partial outputs
  summed), identity in the backward pass (the output's gradient is the same on every worker);
- ``f`` before the column-parallel layer: identity in the forward pass, **all-reduce** in the
  backward pass (each worker's gradient of ``X`` covers only its own hidden units).

One all-reduce each way per MLP, of ``batch x d`` numbers, whatever the number of parameters.
The bias ``b`` is added once, after ``g``. :class:`CopyToParallel` (``f``),
:class:`ReduceFromParallel` (``g``) and :func:`parallel_mlp` are the notebook's exercise;
:func:`check` runs any such ``parallel_mlp`` on real workers against the unsplit layer, and
:func:`measure` compares the bytes and all-reduces of a tensor-parallel step with a
data-parallel one. torch's own ``torch.distributed.tensor.parallel`` (``ColwiseParallel``,
``RowwiseParallel``) runs on CPU workers over gloo too: :func:`torch_split_matches` checks it
gives the same outputs.

This part runs over ``torch.distributed`` (gloo) rather than Horovod: torch's own tensor
parallelism, compared here, needs torch's process group, and the pipeline part needs its
point-to-point ``send``/``recv``, which Horovod does not have.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from multigpu.labs.lab5 import bytes_sent
from multigpu.labs.lab5.zero import ring_bytes


class CopyToParallel(torch.autograd.Function):
    """Megatron's ``f``: identity forward, all-reduce (sum) of the gradient backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


class ReduceFromParallel(torch.autograd.Function):
    """Megatron's ``g``: all-reduce (sum) forward, identity backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        x = x.clone()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad


def parallel_mlp(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor,
                 b2: torch.Tensor) -> torch.Tensor:
    """This worker's part of the split MLP: ``w1``, ``b1`` its rows of ``A`` and ``a``, ``w2`` its
    columns of ``B``, ``b2`` the whole bias ``b``; returns the whole output on every worker."""
    x = CopyToParallel.apply(x)
    h = F.relu(F.linear(x, w1, b1))
    return ReduceFromParallel.apply(F.linear(h, w2)) + b2


@dataclass(frozen=True)
class Layer:
    """An MLP block: ``d`` in and out, ``hidden`` in between, and the batch it sees."""

    name: str
    d: int
    hidden: int
    batch: int


def weights(layer: Layer, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """The unsplit MLP's ``A``, ``a``, ``B``, ``b`` (the same on every rank for a seed)."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(layer.hidden, layer.d, generator=g) / layer.d ** 0.5, torch.randn(layer.hidden, generator=g),
            torch.randn(layer.d, layer.hidden, generator=g) / layer.hidden ** 0.5, torch.randn(layer.d, generator=g))


def split(full: Sequence[torch.Tensor], rank: int, world: int) -> list[torch.Tensor]:
    """Rank ``rank``'s shards: rows of ``A`` and ``a``, columns of ``B``, all of ``b``."""
    a, a_bias, b, b_bias = full
    rows = torch.tensor_split(torch.arange(a.shape[0]), world)[rank]
    return [a[rows].clone(), a_bias[rows].clone(), b[:, rows].clone(), b_bias.clone()]


def unsplit_mlp(x: torch.Tensor, a: torch.Tensor, a_bias: torch.Tensor, b: torch.Tensor, b_bias: torch.Tensor) -> torch.Tensor:
    return F.linear(F.relu(F.linear(x, a, a_bias)), b, b_bias)


class AllReduceCounter:
    """Counts ``dist.all_reduce`` calls (and their bytes) while installed (``with counter:``)."""

    def __init__(self) -> None:
        self.calls, self.nbytes, self.original = 0, 0, dist.all_reduce

    def __enter__(self) -> AllReduceCounter:
        def counted(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            self.nbytes += tensor.numel() * tensor.element_size()
            return self.original(tensor, *args, **kwargs)
        dist.all_reduce = counted
        return self

    def __exit__(self, *exc: object) -> None:
        dist.all_reduce = self.original


def check_worker(rank: int, world: int, fn: Callable[..., torch.Tensor], layer: Layer, seed: int) -> dict[str, Any]:
    """In each worker: ``fn`` on this rank's shards against the unsplit MLP; errors and all-reduce counts."""
    full = [w.requires_grad_(True) for w in weights(layer, seed)]
    g = torch.Generator().manual_seed(seed + 1)
    x, dy = torch.randn(layer.batch, layer.d, generator=g), torch.randn(layer.batch, layer.d, generator=g)
    x_ref = x.clone().requires_grad_(True)
    y_ref = unsplit_mlp(x_ref, *full)
    (y_ref * dy).sum().backward()
    mine = [w.detach().clone().requires_grad_(True) for w in split([w.detach() for w in full], rank, world)]
    x_mine = x.clone().requires_grad_(True)
    with AllReduceCounter() as forward:
        y = fn(x_mine, *mine)
    with AllReduceCounter() as backward:
        (y * dy).sum().backward()
    want = split([w.grad for w in full], rank, world)  # type: ignore[misc]

    def err(a: torch.Tensor | None, b: torch.Tensor) -> float:
        return float("inf") if a is None or a.shape != b.shape else float((a - b).abs().max())

    return {"output": err(y.detach(), y_ref.detach()), "input_grad": err(x_mine.grad, x_ref.grad),  # type: ignore[arg-type]
            "weight_grads": max(err(m.grad, w) for m, w in zip(mine, want)),
            "forward_allreduces": forward.calls, "backward_allreduces": backward.calls,
            "b2_offset": float((y.detach() - y_ref.detach() - (world - 1) * full[3].detach()).abs().max())}


def check(fn: Callable[..., torch.Tensor], workers: Sequence[int] = (2, 4), layer: Layer = Layer("check", 24, 40, 6),
          seed: int = 0, timeout: float = 120.0) -> dict[int, dict[str, Any]]:
    """Run ``fn(x, w1, b1, w2, b2)`` on each N of ``workers`` real workers (gloo); per N, the largest
    error of any rank's output, input gradient and weight gradients against the unsplit MLP, and
    the most all-reduces any rank made forward and backward."""
    from multigpu.running import launch

    out = {}
    for n in workers:
        with launch.pickled_by_value(fn):
            ranks = launch.run(check_worker, n, args=(fn, layer, seed), backend="gloo", threads=1,
                               timeout=timeout, echo=False)
        out[n] = {k: max(r[k] for r in ranks) for k in ranks[0]}
    return out


def step_worker(rank: int, world: int, layers: Sequence[Layer], steps: int) -> dict[str, Any]:
    """In each worker: per layer, timed steps of the tensor-parallel MLP (whole batch, shards of
    the weights) and of data parallelism (whole weights, 1/N of the batch, gradients all-reduced)."""
    out: dict[str, Any] = {}
    for layer in layers:
        full = weights(layer)
        g = torch.Generator().manual_seed(7)
        x, dy = torch.randn(layer.batch, layer.d, generator=g), torch.randn(layer.batch, layer.d, generator=g)
        x.requires_grad_(True)  # the output of an earlier layer: its gradient is needed
        part = slice(rank * layer.batch // world, (rank + 1) * layer.batch // world)
        shards = [w.requires_grad_(True) for w in split(full, rank, world)]
        whole = [w.clone().requires_grad_(True) for w in full]
        ways = {
            "tensor parallel": lambda: (parallel_mlp(x, *shards) * dy).sum().backward(),
            "data parallel": lambda: data_parallel_step(x[part], dy[part], whole),
        }
        for way, run in ways.items():
            sent, times, calls = [], [], 0
            for step in range(steps + 1):
                dist.barrier()
                with AllReduceCounter() as counter, bytes_sent.counting() as counted:
                    t0 = time.perf_counter()
                    run()
                    elapsed = time.perf_counter() - t0
                if step:
                    sent.append(counted())
                    times.append(elapsed)
                    calls = counter.calls
            out[f"{layer.name}|{way}"] = {"sent": statistics.median(sent), "step_s": statistics.median(times),
                                          "allreduces": calls}
    return out


def data_parallel_step(x: torch.Tensor, dy: torch.Tensor, whole: Sequence[torch.Tensor]) -> None:
    """Forward and backward on this rank's slice, then one all-reduce of every gradient (flattened)."""
    for w in whole:
        w.grad = None
    (unsplit_mlp(x, *whole) * dy).sum().backward()
    flat = torch.cat([w.grad.flatten() for w in whole])  # type: ignore[union-attr]
    dist.all_reduce(flat)


def measure(layers: Sequence[Layer], workers: int, steps: int = 3, timeout: float = 300.0) -> dict[str, dict[str, Any]]:
    """Per layer and way, on ``workers`` gloo workers: the bytes each rank sent per step (median,
    the largest rank's), the slowest rank's median step time and the all-reduces per step."""
    from multigpu.running import launch

    ranks = launch.run(step_worker, workers, args=(layers, steps), backend="gloo", timeout=timeout, echo=False)
    out: dict[str, dict[str, Any]] = {}
    for layer in layers:
        params = 2 * layer.d * layer.hidden + layer.hidden + layer.d
        for way in ("tensor parallel", "data parallel"):
            rows = [r[f"{layer.name}|{way}"] for r in ranks]
            predicted = (2 * ring_bytes(4 * layer.batch * layer.d, workers) if way == "tensor parallel"
                         else ring_bytes(4 * params, workers))
            out.setdefault(layer.name, {})[way] = {
                "sent": max(r["sent"] for r in rows), "step_s": max(r["step_s"] for r in rows),
                "allreduces": max(r["allreduces"] for r in rows), "predicted": predicted}
        out[layer.name]["parameters"] = params
    return out


def torch_split_worker(rank: int, world: int, layer: Layer) -> float:
    """torch's ColwiseParallel + RowwiseParallel on an ``nn.Sequential`` MLP against our split; the largest difference."""
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    a, a_bias, b, b_bias = weights(layer)
    mlp = nn.Sequential(nn.Linear(layer.d, layer.hidden), nn.ReLU(), nn.Linear(layer.hidden, layer.d))
    with torch.no_grad():
        for param, value in zip(mlp.parameters(), (a, a_bias, b, b_bias)):
            param.copy_(value)
    parallelize_module(mlp, init_device_mesh("cpu", (world,)), {"0": ColwiseParallel(), "2": RowwiseParallel()})
    x = torch.randn(layer.batch, layer.d, generator=torch.Generator().manual_seed(3))
    theirs = mlp(x)
    theirs = theirs.full_tensor() if hasattr(theirs, "full_tensor") else theirs
    ours = parallel_mlp(x, *split((a, a_bias, b, b_bias), rank, world))
    return float((theirs - ours).abs().max())


def torch_split_matches(layer: Layer = Layer("check", 24, 40, 6), workers: int = 2, timeout: float = 120.0) -> float:
    """The largest difference between torch's tensor-parallel MLP and :func:`parallel_mlp` on any rank."""
    from multigpu.running import launch

    return max(launch.run(torch_split_worker, workers, args=(layer,), backend="gloo", timeout=timeout, echo=False))
