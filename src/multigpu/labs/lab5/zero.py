"""Lab 5, part 2: ZeRO stages 1 and 2 by hand, over Horovod's collectives.

Plain data parallelism keeps on every worker the whole optimizer state (Adam: 8 bytes per
parameter, twice the weights) and the whole gradient. ZeRO shards them over the N workers:

- **stage 1** shards the optimizer state. The parameters live in one flat buffer
  (:class:`FlatParameters`), padded to a multiple of N; rank r owns the slice ``[r S, (r+1) S)``
  (``S = padded / N``) and its Adam steps that slice only (:class:`ShardedAdam`). After backward
  the whole gradient is averaged, then each rank steps its slice and the updated slices are
  all-gathered (``hvd.allgather``) into every rank's buffer. In its first form
  (:func:`stage1_step`) the gradient is all-reduced and each rank keeps its slice; as DeepSpeed
  runs it since 2020 (:func:`sharded_step`, the notebook's exercise) the gradient is
  reduce-scattered (``hvd.reducescatter``: each rank receives the average of its slice only).
  Either way every rank holds the whole gradient until backward ends.
- **stage 2** shards the gradient too (:class:`~multigpu.labs.lab5.sharded_gradients.Stage2Adam`):
  each layer's gradient is reduce-scattered as soon as backward has produced it, and freed, so a
  rank holds its 1/N of the gradient plus the few layers being reduced.

A ring reduce-scatter sends ``(N-1)/N`` of the gradient per worker and the all-gather as much
again: ``2 (N-1)/N``, what one all-reduce sends (ZeRO, section 7.2.1); stage 1 in its first form
(all-reduce, then the all-gather) sends 1.5 times that. :func:`compare` runs data parallelism
and the stages side by side on real workers and measures the weights (they must agree), each
rank's averaged gradient against data parallelism's, the gradient bytes each rank held at its
peak (:class:`~multigpu.labs.lab5.memory.GradientMemory`, from the tensors), the optimizer state per rank, and the bytes
each rank sent per step (:mod:`~multigpu.labs.lab5.bytes_sent`, so over Horovod's Gloo
controller: over MPI the workers of one machine share memory and send nothing through sockets).
Which collectives run here at all: :mod:`~multigpu.labs.lab5.collectives`.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from multigpu.labs.lab5 import bytes_sent
from multigpu.labs.lab5.memory import GradientMemory, optimizer_state_bytes
from multigpu.labs.lab5.sharded_gradients import Stage2Adam

#: Horovod's controller whose traffic the kernel can count (TCP sockets).
MEASURABLE = ("--gloo",)
WAYS = ("data parallel", "stage 1, all-reduce", "stage 1, reduce-scatter", "stage 2")


@dataclass(frozen=True)
class Model:
    """A multi-layer perceptron: ``depth`` hidden layers of ``width``, ``inputs`` in, ``classes`` out."""

    inputs: int = 256
    width: int = 512
    depth: int = 3
    classes: int = 10
    batch: int = 64  #: global batch; each of N workers takes batch / N


#: 96 equal layers of 65,792 parameters, each 1.0% of the model: stage 2's in-flight layers are a
#: small share of it; a large batch gives each layer's backward the time to hide a reduce-scatter.
MANY_LAYERS = Model(inputs=256, width=256, depth=96, batch=512)


def build(shape: Model, seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    fan_in = shape.inputs
    for _ in range(shape.depth):
        layers += [nn.Linear(fan_in, shape.width), nn.ReLU()]
        fan_in = shape.width
    return nn.Sequential(*layers, nn.Linear(fan_in, shape.classes))


def batch_of(shape: Model, step: int, rank: int, workers: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's slice of the global batch of ``step`` (the same global batch for any N)."""
    g = torch.Generator().manual_seed(1000 + step)
    x, y = torch.randn(shape.batch, shape.inputs, generator=g), torch.randint(0, shape.classes, (shape.batch,), generator=g)
    part = shape.batch // workers
    return x[rank * part:(rank + 1) * part], y[rank * part:(rank + 1) * part]


class FlatParameters:
    """A model's parameters (and their gradients) as views into one flat buffer, padded to a
    multiple of ``workers``: ``flat`` is every weight, ``grad`` every gradient; autograd
    accumulates straight into ``grad``."""

    def __init__(self, params: Sequence[nn.Parameter], workers: int) -> None:
        self.params = list(params)
        self.numel = sum(p.numel() for p in self.params)
        self.shard_numel = math.ceil(self.numel / workers)
        self.flat = torch.zeros(self.shard_numel * workers)
        self.grad = torch.zeros_like(self.flat)
        offset = 0
        for p in self.params:
            n = p.numel()
            self.flat[offset:offset + n].copy_(p.detach().flatten())
            p.data = self.flat[offset:offset + n].view_as(p)
            p.grad = self.grad[offset:offset + n].view_as(p)
            offset += n

    def shard(self, rank: int) -> torch.Tensor:
        """Rank ``rank``'s slice of the weights as an fp32 leaf tensor of its own (what its optimizer steps)."""
        s = self.shard_numel
        return self.flat[rank * s:(rank + 1) * s].clone().requires_grad_(True)


def sharded_step(flat_params: torch.Tensor, flat_grad: torch.Tensor, shard: torch.Tensor,
                 optimizer: torch.optim.Optimizer) -> None:
    """The sharded step (the notebook's exercise; ZeRO stage 1 as DeepSpeed runs it): reduce-scatter
    the gradient, step this rank's shard, all-gather the updated shards into ``flat_params``."""
    import horovod.torch as hvd

    shard.grad = hvd.reducescatter(flat_grad, op=hvd.Average, name="zero.gradient")
    optimizer.step()
    flat_params.copy_(hvd.allgather(shard.detach(), name="zero.weights"))


def stage1_step(flat_params: torch.Tensor, flat_grad: torch.Tensor, shard: torch.Tensor,
                optimizer: torch.optim.Optimizer) -> None:
    """ZeRO stage 1 in its first form: all-reduce the whole gradient (in place), step this rank's
    slice of it, all-gather the updated shards."""
    import horovod.torch as hvd

    s = shard.numel()
    hvd.allreduce_(flat_grad, op=hvd.Average, name="zero1.gradient")
    shard.grad = flat_grad[hvd.rank() * s:(hvd.rank() + 1) * s]  # a view: no second copy
    optimizer.step()
    flat_params.copy_(hvd.allgather(shard.detach(), name="zero1.weights"))


class ShardedAdam:
    """Adam over 1/N of a model's parameters per worker (ZeRO stage 1), over Horovod.

    ``step_fn(flat_params, flat_grad, shard, optimizer)`` is the step (:func:`sharded_step`,
    :func:`stage1_step`, or a learner's). Call after ``hvd.init()`` on every rank, with the same
    initial weights everywhere.
    """

    def __init__(self, model: nn.Module, lr: float = 1e-3,
                 step_fn: Callable[..., None] = sharded_step) -> None:
        import horovod.torch as hvd

        self.rank = hvd.rank()
        self.flat = FlatParameters(list(model.parameters()), hvd.size())
        self.shard = self.flat.shard(self.rank)
        self.optimizer = torch.optim.Adam([self.shard], lr=lr)
        self.step_fn = step_fn
        self.memory = GradientMemory()

    def zero_grad(self) -> None:
        self.flat.grad.zero_()
        self.shard.grad = None

    def step(self) -> None:
        self.memory.sample([self.flat.grad, self.shard.grad])
        self.step_fn(self.flat.flat, self.flat.grad, self.shard, self.optimizer)
        self.memory.sample([self.flat.grad, self.shard.grad])

    def owned_gradient(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The flat indices this rank owns and its averaged gradient there (None: no ``shard.grad``)."""
        grad, s = self.shard.grad, self.flat.shard_numel
        lo, hi = self.rank * s, min((self.rank + 1) * s, self.flat.numel)
        if grad is None or grad.numel() != s:
            return None
        return torch.arange(lo, hi), grad.detach().flatten()[:hi - lo].clone()

    def state_bytes(self) -> int:
        return optimizer_state_bytes(self.optimizer)


class DataParallelAdam:
    """Plain data parallelism on the same flat buffer: all-reduce (average, in place) the gradient,
    and every rank steps all of it with its own full Adam state."""

    def __init__(self, model: nn.Module, lr: float = 1e-3) -> None:
        import horovod.torch as hvd

        self.flat = FlatParameters(list(model.parameters()), hvd.size())
        self.optimizer = torch.optim.Adam(model.parameters(), lr=lr)
        self.memory = GradientMemory()

    def zero_grad(self) -> None:
        self.flat.grad.zero_()

    def step(self) -> None:
        import horovod.torch as hvd

        self.memory.sample([self.flat.grad])
        hvd.allreduce_(self.flat.grad, op=hvd.Average, name="dp.gradient")
        self.optimizer.step()

    def owned_gradient(self) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.arange(self.flat.numel), self.flat.grad[:self.flat.numel].clone()

    def state_bytes(self) -> int:
        return optimizer_state_bytes(self.optimizer)


def make(way: str, model: nn.Module, step_fn: Callable[..., None] | None = None) -> Any:
    if way == "data parallel":
        return DataParallelAdam(model)
    if way == "stage 1, all-reduce":
        return ShardedAdam(model, step_fn=stage1_step)
    if way == "stage 1, reduce-scatter":
        return ShardedAdam(model, step_fn=step_fn or sharded_step)
    if way == "stage 2":
        return Stage2Adam(model)
    raise ValueError(f"unknown way {way!r}; choose one of {WAYS}")


def timed_steps(shape: Model, model: nn.Module, optimizer: Any, steps: int, warmup: int,
                name: str) -> dict[str, list[Any]]:
    """In one Horovod worker: ``warmup + steps`` training steps of ``model`` with ``optimizer`` (its
    ``zero_grad`` and ``step``), the ranks lined up before each. Per timed step: the bytes the whole
    step sent, its seconds, and the seconds of its forward and backward passes; and after the first
    step, the averaged gradient this rank owns (``first_grad``: where the optimizer says, else None)."""
    import horovod.torch as hvd

    rank, n = hvd.rank(), hvd.size()
    out: dict[str, Any] = {"sent": [], "step_s": [], "compute_s": [], "first_grad": None}
    for step in range(warmup + steps):
        x, y = batch_of(shape, step, rank, n)
        hvd.allreduce(torch.zeros(1), name=f"{name}.barrier")  # start together
        t0 = time.perf_counter()
        with bytes_sent.counting() as sent:
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            t1 = time.perf_counter()
            optimizer.step()
        elapsed = time.perf_counter() - t0
        if step == 0 and hasattr(optimizer, "owned_gradient"):
            out["first_grad"] = optimizer.owned_gradient()
        if step >= warmup:
            out["sent"].append(sent())
            out["step_s"].append(elapsed)
            out["compute_s"].append(t1 - t0)
    return out


def gradient_error(mine: tuple[torch.Tensor, torch.Tensor] | None, reference: tuple[torch.Tensor, torch.Tensor]) -> float:
    """The largest difference of a way's owned averaged gradient from data parallelism's at the same
    indices (``reference``: all of them), relative to the latter's largest entry (inf: none owned).
    Compared after the first step, where both runs start from the same weights and batch."""
    if mine is None or mine[1].shape != mine[0].shape:
        return math.inf
    (index, values), full = mine, reference[1]
    return float((values - full[index]).abs().max()) / max(float(full.abs().max()), 1e-30)


def train(way: str, shape: Model, steps: int, warmup: int = 1,
          step_fn: Callable[..., None] | None = None) -> dict[str, Any]:
    """In one Horovod worker: ``steps`` Adam steps of ``way`` on ``shape``; the weights, the
    optimizer state's bytes, the peak gradient bytes held, and :func:`timed_steps`' figures."""
    model = build(shape)
    opt = make(way, model, step_fn)
    run = timed_steps(shape, model, opt, steps, warmup, way)
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    return {**run, "weights": weights, "state_bytes": opt.state_bytes(), "peak_grad_bytes": opt.memory.peak,
            "parameters": weights.numel()}


def compare_worker(shape: Model, steps: int, ways: Sequence[str], rounds: int,
                   step_fn: Callable[..., None] | None = None) -> dict[str, Any]:
    """In each Horovod worker: every way of ``ways`` (data parallelism first), ``rounds`` times
    interleaved; this rank's figures, each way's gradients compared here with data parallelism's."""
    import horovod.torch as hvd

    hvd.init()
    out: dict[str, Any] = {way: {"sent": [], "step_s": [], "compute_s": [], "grad_error": 0.0} for way in ways}
    for _ in range(rounds):
        for way in ways:
            run = train(way, shape, steps, step_fn=step_fn if way == "stage 1, reduce-scatter" else None)
            grad, row = run.pop("first_grad"), out[way]
            if way == "data parallel":
                reference = grad
            row["grad_error"] = max(row["grad_error"], gradient_error(grad, reference))
            for key in ("sent", "step_s", "compute_s"):
                row[key] += run.pop(key)
            row.update(run)
    out["rank"], out["workers"] = hvd.rank(), hvd.size()
    return out


def compare(shape: Model = Model(), workers: int = 4, steps: int = 3, rounds: int = 1,
            ways: Sequence[str] = WAYS, step_fn: Callable[..., None] | None = None,
            timeout: float = 300.0) -> dict[str, dict[str, Any]]:
    """Data parallelism and ZeRO's stages side by side on ``workers`` Horovod workers (Gloo).

    Per way: ``max_weight_diff`` (largest difference of any rank's weights from data parallel's
    rank 0 after ``steps`` steps), ``ranks_agree`` (every rank holds the same weights),
    ``grad_error`` (:func:`gradient_error`, the worst rank and round), ``peak_grad_bytes`` and
    ``state_bytes`` (each rank's), ``sent`` (each rank's median bytes sent per step),
    ``step_s`` (the slowest rank's median step time) and the samples (also ``compute_s``: each
    step's forward and backward passes alone). ``ways`` starts with "data parallel".
    """
    from multigpu.running import launch

    with launch.pickled_by_value(step_fn):
        ranks = launch.run_horovod(compare_worker, workers, args=(shape, steps, ways, rounds, step_fn),
                                   horovod_args=MEASURABLE, timeout=timeout, echo=False)
    ranks.sort(key=lambda r: r["rank"])
    reference = ranks[0]["data parallel"]["weights"]
    result: dict[str, dict[str, Any]] = {}
    for way in ways:
        rows = [r[way] for r in ranks]
        result[way] = {
            "parameters": rows[0]["parameters"],
            "gradient_bytes": 4 * rows[0]["parameters"],
            "ranks_agree": all(torch.equal(r["weights"], rows[0]["weights"]) for r in rows),
            "max_weight_diff": max(float((r["weights"] - reference).abs().max()) for r in rows),
            "grad_error": max(r["grad_error"] for r in rows),
            "peak_grad_bytes": [r["peak_grad_bytes"] for r in rows],
            "state_bytes": [r["state_bytes"] for r in rows],
            "sent": [statistics.median(r["sent"]) for r in rows],
            "step_s": max(statistics.median(r["step_s"]) for r in rows),
            "samples": {key: [r[key] for r in rows] for key in ("sent", "step_s", "compute_s")},
        }
    return result


def ring_bytes(nbytes: float, workers: int) -> float:
    """What one worker sends in a ring all-reduce of ``nbytes``: ``2 (N-1)/N x nbytes`` (02b)."""
    return 2 * (workers - 1) / workers * nbytes


def check_step(step_fn: Callable[..., None], workers: int = 4, shape: Model = Model(), steps: int = 2,
               timeout: float = 240.0) -> dict[str, float | bool]:
    """A learner's sharded ``step_fn`` against data parallelism on ``workers`` Horovod workers (Gloo):
    ``grad_error`` (each rank's ``shard.grad`` after the first step against its slice of data
    parallelism's averaged gradient), ``ranks_agree``, ``max_weight_diff`` from data parallel's weights after
    ``steps`` steps, ``state_ratio`` (optimizer state per rank over data parallel's) and
    ``sent_ratio`` (bytes sent per step, mean over ranks, over data parallel's)."""
    got = compare(shape, workers, steps, ways=("data parallel", "stage 1, reduce-scatter"), step_fn=step_fn,
                  timeout=timeout)
    dp, mine = got["data parallel"], got["stage 1, reduce-scatter"]
    return {"grad_error": mine["grad_error"], "ranks_agree": mine["ranks_agree"],
            "max_weight_diff": mine["max_weight_diff"],
            "state_ratio": max(mine["state_bytes"]) / max(dp["state_bytes"]),
            "sent_ratio": statistics.mean(mine["sent"]) / statistics.mean(dp["sent"])}
