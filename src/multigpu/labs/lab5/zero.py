"""Lab 5, part 2: ZeRO stages 1 and 2 by hand, over Horovod's collectives.

Plain data parallelism keeps on every worker the whole optimizer state (Adam: 8 bytes per
parameter, twice the weights). :class:`ShardedAdam` keeps on each of N workers the state of
1/N of the parameters only:

- the model's parameters live in one flat buffer (:class:`FlatParameters`), padded to a
  multiple of N, and rank r owns the slice ``[r S, (r+1) S)`` of it (``S = padded / N``);
- after backward the gradient is averaged over the workers: **stage 2** reduce-scatters it
  (``hvd.reducescatter``: each rank receives the average of its own slice only), **stage 1**
  all-reduces it (``hvd.allreduce``, every rank gets the whole average) and keeps its slice;
- each rank's optimizer steps its slice (an fp32 leaf tensor, the only tensor it has state for);
- the updated slices are all-gathered (``hvd.allgather``) into every rank's flat buffer.

A ring reduce-scatter sends ``(N-1)/N`` of the gradient per worker and the all-gather as much
again: ``2 (N-1)/N``, what one all-reduce sends (ZeRO, section 7.2.1). Stage 1 as written here
(all-reduce, then the all-gather) sends 1.5 times that; DeepSpeed's stage 1 reduce-scatters too
since 2020 ("ZeRO stage 1 with reduced communication", deepspeed.ai news, 2020-03-17).
:func:`compare` runs data parallelism and both stages side by side on real workers and measures
the weights (they must agree), the optimizer state per rank (from its tensors) and the bytes
each rank sent per step (:mod:`~multigpu.labs.lab5.bytes_sent`, so over Horovod's Gloo
controller: over MPI the workers of one machine share memory and send nothing through sockets).

Every collective used here works on CPU workers in Horovod 0.28.1 as the course builds it
(``allreduce``, ``reducescatter``, ``allgather``, their ``grouped_*`` forms and process sets,
over both its MPI and its Gloo controller; checked in ``tests/test_zero.py``).
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from multigpu.labs.lab5 import bytes_sent

#: Horovod's controller whose traffic the kernel can count (TCP sockets).
MEASURABLE = ("--gloo",)
WAYS = ("data parallel", "stage 1", "stage 2")


@dataclass(frozen=True)
class Model:
    """A multi-layer perceptron: ``depth`` hidden layers of ``width``, ``inputs`` in, ``classes`` out."""

    inputs: int = 256
    width: int = 512
    depth: int = 3
    classes: int = 10
    batch: int = 64  #: global batch; each of N workers takes batch / N


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
    """ZeRO stage 2's step (the notebook's exercise): reduce-scatter the gradient, step this
    rank's shard, all-gather the updated shards into ``flat_params``."""
    import horovod.torch as hvd

    shard.grad = hvd.reducescatter(flat_grad, op=hvd.Average, name="zero.gradient")
    optimizer.step()
    flat_params.copy_(hvd.allgather(shard.detach(), name="zero.weights"))


def stage1_step(flat_params: torch.Tensor, flat_grad: torch.Tensor, shard: torch.Tensor,
                optimizer: torch.optim.Optimizer) -> None:
    """ZeRO stage 1 as the issue's first form: all-reduce the whole gradient, keep this rank's slice."""
    import horovod.torch as hvd

    s = shard.numel()
    full = hvd.allreduce(flat_grad, op=hvd.Average, name="zero1.gradient")
    shard.grad = full[hvd.rank() * s:(hvd.rank() + 1) * s].clone()
    optimizer.step()
    flat_params.copy_(hvd.allgather(shard.detach(), name="zero1.weights"))


class ShardedAdam:
    """Adam over 1/N of a model's parameters per worker (ZeRO stage 1 or 2), over Horovod.

    ``step_fn(flat_params, flat_grad, shard, optimizer)`` is the step (:func:`sharded_step`,
    :func:`stage1_step`, or a learner's). Call after ``hvd.init()`` on every rank, with the same
    initial weights everywhere.
    """

    def __init__(self, model: nn.Module, lr: float = 1e-3,
                 step_fn: Callable[..., None] = sharded_step) -> None:
        import horovod.torch as hvd

        self.flat = FlatParameters(list(model.parameters()), hvd.size())
        self.shard = self.flat.shard(hvd.rank())
        self.optimizer = torch.optim.Adam([self.shard], lr=lr)
        self.step_fn = step_fn

    def zero_grad(self) -> None:
        self.flat.grad.zero_()

    def step(self) -> None:
        self.step_fn(self.flat.flat, self.flat.grad, self.shard, self.optimizer)

    def state_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for s in self.optimizer.state.values()
                   for t in s.values() if torch.is_tensor(t) and t.dim() > 0)


class DataParallelAdam:
    """Plain data parallelism on the same flat buffer: all-reduce (average) the gradient, and
    every rank steps all of it with its own full Adam state."""

    def __init__(self, model: nn.Module, lr: float = 1e-3) -> None:
        import horovod.torch as hvd

        self.flat = FlatParameters(list(model.parameters()), hvd.size())
        self.optimizer = torch.optim.Adam(model.parameters(), lr=lr)

    def zero_grad(self) -> None:
        self.flat.grad.zero_()

    def step(self) -> None:
        import horovod.torch as hvd

        self.flat.grad.copy_(hvd.allreduce(self.flat.grad, op=hvd.Average, name="dp.gradient"))
        self.optimizer.step()

    def state_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for s in self.optimizer.state.values()
                   for t in s.values() if torch.is_tensor(t) and t.dim() > 0)


def make(way: str, model: nn.Module, step_fn: Callable[..., None] | None = None) -> Any:
    if way == "data parallel":
        return DataParallelAdam(model)
    if way == "stage 1":
        return ShardedAdam(model, step_fn=stage1_step)
    return ShardedAdam(model, step_fn=step_fn or sharded_step)


def timed_steps(shape: Model, model: nn.Module, optimizer: Any, steps: int, warmup: int, name: str,
                *, count_passes: bool = False) -> tuple[list[int], list[float], list[float]]:
    """In one Horovod worker: ``warmup + steps`` training steps of ``model`` with ``optimizer`` (its
    ``zero_grad`` and ``step``), the ranks lined up before each. Per timed step: the bytes it sent
    (the optimizer's step alone; with ``count_passes`` the whole step, for a way that communicates
    in forward and backward too), its seconds, and the seconds of its forward and backward passes."""
    import horovod.torch as hvd

    rank, n = hvd.rank(), hvd.size()
    sent, times, compute = [], [], []
    for step in range(warmup + steps):
        x, y = batch_of(shape, step, rank, n)
        hvd.allreduce(torch.zeros(1), name=f"{name}.barrier")  # start together
        t0 = time.perf_counter()
        with bytes_sent.counting() as whole:
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            t1 = time.perf_counter()
            with bytes_sent.counting() as at_step:
                optimizer.step()
        elapsed = time.perf_counter() - t0
        if step >= warmup:
            sent.append(whole() if count_passes else at_step())
            times.append(elapsed)
            compute.append(t1 - t0)
    return sent, times, compute


def train(way: str, shape: Model, steps: int, warmup: int = 1,
          step_fn: Callable[..., None] | None = None) -> dict[str, Any]:
    """In one Horovod worker: ``steps`` Adam steps of ``way`` on ``shape``; the weights, the
    optimizer state's bytes, and per timed step (:func:`timed_steps`) the bytes sent by the
    optimizer's step, the step's time and the time of its forward and backward passes alone."""
    model = build(shape)
    opt = make(way, model, step_fn)
    sent, times, compute = timed_steps(shape, model, opt, steps, warmup, way)
    return {"weights": opt.flat.flat[:opt.flat.numel].clone(), "state_bytes": opt.state_bytes(),
            "sent": sent, "step_s": times, "compute_s": compute, "parameters": opt.flat.numel}


def compare_worker(shape: Model, steps: int, ways: Sequence[str], rounds: int,
                   step_fn: Callable[..., None] | None = None) -> dict[str, Any]:
    """In each Horovod worker: every way of ``ways``, ``rounds`` times interleaved; this rank's figures."""
    import horovod.torch as hvd

    hvd.init()
    out: dict[str, Any] = {way: {"sent": [], "step_s": [], "compute_s": []} for way in ways}
    for _ in range(rounds):
        for way in ways:
            run = train(way, shape, steps, step_fn=step_fn if way == "stage 2" else None)
            row = out[way]
            for key in ("sent", "step_s", "compute_s"):
                row[key] += run[key]
            row.update(weights=run["weights"], state_bytes=run["state_bytes"], parameters=run["parameters"])
    out["rank"], out["workers"] = hvd.rank(), hvd.size()
    return out


def compare(shape: Model = Model(), workers: int = 4, steps: int = 3, rounds: int = 1,
            ways: Sequence[str] = WAYS, step_fn: Callable[..., None] | None = None,
            timeout: float = 300.0) -> dict[str, dict[str, Any]]:
    """Data parallelism and ZeRO's stages side by side on ``workers`` Horovod workers (Gloo).

    Per way: ``max_weight_diff`` (largest difference of any rank's weights from data parallel's
    rank 0 after ``steps`` steps), ``ranks_agree`` (every rank holds the same weights),
    ``state_bytes`` (each rank's optimizer state), ``sent`` (each rank's median bytes sent by
    the optimizer's step), ``step_s`` (the slowest rank's median step time) and the samples
    (also ``compute_s``: each step's forward and backward passes alone).
    """
    from multigpu.running import launch

    with launch.pickled_by_value(step_fn):
        ranks = launch.run_horovod(compare_worker, workers, args=(shape, steps, ways, rounds, step_fn),
                                   horovod_args=MEASURABLE, timeout=timeout, echo=False)
    ranks.sort(key=lambda r: r["rank"])
    reference = ranks[0]["data parallel"]["weights"] if "data parallel" in ways else None
    result: dict[str, dict[str, Any]] = {}
    for way in ways:
        rows = [r[way] for r in ranks]
        result[way] = {
            "parameters": rows[0]["parameters"],
            "gradient_bytes": 4 * rows[0]["parameters"],
            "ranks_agree": all(torch.equal(r["weights"], rows[0]["weights"]) for r in rows),
            "max_weight_diff": (max(float((r["weights"] - reference).abs().max()) for r in rows)
                                if reference is not None else float("nan")),
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
    """A learner's stage-2 ``step_fn`` against data parallelism on ``workers`` Horovod workers (Gloo):
    ``ranks_agree``, ``max_weight_diff`` from data parallel's weights after ``steps`` steps,
    ``state_ratio`` (optimizer state per rank over data parallel's) and ``sent_ratio`` (bytes sent
    per step, mean over ranks, over data parallel's)."""
    got = compare(shape, workers, steps, ways=("data parallel", "stage 2"), step_fn=step_fn, timeout=timeout)
    dp, mine = got["data parallel"], got["stage 2"]
    return {"ranks_agree": mine["ranks_agree"], "max_weight_diff": mine["max_weight_diff"],
            "state_ratio": max(mine["state_bytes"]) / max(dp["state_bytes"]),
            "sent_ratio": statistics.mean(mine["sent"]) / statistics.mean(dp["sent"])}


def collectives_worker() -> dict[str, str]:
    """In each Horovod worker: every collective ZeRO could use, tried on small tensors; "ok" or the error."""
    import horovod.torch as hvd

    # process sets are declared at init (the first and the second half of the ranks): the job's
    # size comes from the launcher's environment (horovodrun --gloo, or MPI's)
    size = int(os.environ.get("HOROVOD_SIZE", os.environ.get("PMI_SIZE", "1")))
    halves = [hvd.ProcessSet(list(range(size // 2))), hvd.ProcessSet(list(range(size // 2, size)))]
    hvd.init(process_sets=halves if size >= 2 else None)
    r, n = hvd.rank(), hvd.size()
    x = torch.arange(4.0 * n) + r
    want_sum = torch.stack([torch.arange(4.0 * n) + k for k in range(n)]).sum(0)
    mine = halves[0] if r < n // 2 else halves[1]
    tries: dict[str, Callable[[], bool]] = {
        "allreduce": lambda: torch.equal(hvd.allreduce(x, op=hvd.Sum, name="c.ar"), want_sum),
        "reducescatter": lambda: torch.equal(hvd.reducescatter(x, op=hvd.Sum, name="c.rs"), want_sum[4 * r:4 * r + 4]),
        "allgather": lambda: torch.equal(hvd.allgather(torch.full((2,), float(r)), name="c.ag"),
                                         torch.arange(n).float().repeat_interleave(2)),
        "grouped_allreduce": lambda: all(torch.equal(t, want_sum) for t in hvd.grouped_allreduce([x, x], op=hvd.Sum, name="c.gar")),
        "grouped_reducescatter": lambda: all(torch.equal(t, want_sum[4 * r:4 * r + 4]) for t in
                                             hvd.grouped_reducescatter([x, x], op=hvd.Sum, name="c.grs")),
        "grouped_allgather": lambda: all(t.numel() == 2 * n for t in
                                         hvd.grouped_allgather([torch.ones(2), torch.ones(2)], name="c.gag")),
        "allreduce in a process set": lambda: torch.equal(
            hvd.allreduce(torch.ones(1), op=hvd.Sum, name=f"c.ps{mine.process_set_id}", process_set=mine),
            torch.full((1,), float(mine.size()))),
    }
    out = {}
    for name, attempt in tries.items():
        try:
            out[name] = "ok" if attempt() else "wrong result"
        except Exception as exc:  # the error itself is the finding
            out[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    hvd.allreduce(torch.zeros(1), name="c.end")  # nobody leaves while a peer still needs it
    return out


def collectives(controller: str, workers: int = 4, timeout: float = 120.0) -> dict[str, str]:
    """Which of Horovod's collectives work on this machine's workers over ``controller`` ("gloo"
    or "mpi"): per collective, "ok" on every rank, or the first rank's error."""
    from multigpu.running import launch

    ranks = launch.run_horovod(collectives_worker, workers, horovod_args=(f"--{controller}",),
                               timeout=timeout, echo=False)
    return {name: next((r[name] for r in ranks if r[name] != "ok"), "ok") for name in ranks[0]}


def collective_times_worker(numel: int, reps: int) -> dict[str, list[float]]:
    """In each Horovod worker: ``reps`` timed rounds of an all-reduce and a reduce-scatter of the
    same ``numel`` floats and an all-gather of its 1/N slices, interleaved, after one untimed round."""
    import horovod.torch as hvd

    hvd.init()
    x, n = torch.ones(numel), hvd.size()
    ops: dict[str, Callable[[], Any]] = {
        "allreduce": lambda: hvd.allreduce(x, op=hvd.Average, name="t.ar"),
        "reducescatter": lambda: hvd.reducescatter(x, op=hvd.Average, name="t.rs"),
        "allgather": lambda: hvd.allgather(x[:numel // n], name="t.ag"),
    }
    times: dict[str, list[float]] = {name: [] for name in ops}
    for rep in range(reps + 1):
        for name, op in ops.items():
            hvd.allreduce(torch.zeros(1), name="t.barrier")
            t0 = time.perf_counter()
            op()
            if rep:
                times[name].append(time.perf_counter() - t0)
    return times


def collective_times(numel: int, workers: int = 4, reps: int = 10, controller: str = "gloo",
                     timeout: float = 300.0) -> dict[str, list[float]]:
    """Per collective, the slowest rank's time of each round (seconds), on ``workers`` Horovod workers."""
    from multigpu.running import launch

    ranks = launch.run_horovod(collective_times_worker, workers, args=(numel, reps),
                               horovod_args=(f"--{controller}",), timeout=timeout, echo=False)
    return {name: [max(r[name][k] for r in ranks) for k in range(reps)] for name in ranks[0]}
