"""Lab 5, part 3: ZeRO stage 3 (fully sharded data parallelism) by hand, and torch's ``fully_shard``.

Stage 3 shards the weights too: between uses, each of N workers keeps 1/N of every layer's
weights (and the Adam state of that 1/N). :class:`FullyShardedModel` wraps each module that holds
parameters (a "unit", here each ``nn.Linear``):

- before the unit's forward, its shards are all-gathered into a full flat buffer that the
  unit's parameters are views of (``hvd.allgather``); after its forward the buffer's storage is
  freed (``untyped_storage().resize_(0)``: autograd keeps the tensor objects, not the bytes);
- when the gradient of the unit's output arrives in backward, the weights are gathered again
  into the same storage, just before the unit's backward needs them;
- when the unit's weight gradients are complete, they are reduce-scattered (``hvd.reducescatter``,
  averaged): each rank keeps the gradient of its shard only, and the full weights are freed again;
- each rank's Adam steps its shards.

Per step each unit is gathered twice and its gradient reduce-scattered once: ``3 (N-1)/N`` of
the model per worker, 1.5 times data parallelism's all-reduce (ZeRO, section 7.2.2). The weights
held at any moment are the shards plus the unit(s) in use: :class:`ParameterMemory` samples the
bytes of every full buffer and shard at each gather and free, counted from their storages.

:func:`compare` runs it beside plain data parallelism on Horovod workers (Gloo, so the bytes are
measured: :mod:`~multigpu.labs.lab5.bytes_sent`); :func:`compare_fully_shard` runs torch's
``torch.distributed.fsdp.fully_shard`` (FSDP2) the same way over ``torch.distributed``'s gloo.
Both run on CPU workers with torch 2.13. Over gloo, ``fully_shard``'s reduce-scatter sends what
a whole all-reduce sends (gloo's ``reduce_scatter_tensor`` reduces everything, then keeps a
slice), so it moves about 2 times data parallelism's bytes where NCCL's moves 1.5.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from multigpu.labs.lab5 import bytes_sent, zero


class ParameterMemory:
    """Bytes of weights held (full buffers and shards, from their storages), now and at the peak."""

    def __init__(self) -> None:
        self.tensors: list[torch.Tensor] = []
        self.peak = 0

    def watch(self, *tensors: torch.Tensor) -> None:
        self.tensors += tensors

    def now(self) -> int:
        return sum(t.untyped_storage().nbytes() for t in self.tensors)

    def sample(self) -> None:
        self.peak = max(self.peak, self.now())


class ShardedUnit:
    """One module's parameters, sharded over the Horovod workers (see the module's docstring)."""

    def __init__(self, module: nn.Module, index: int, memory: ParameterMemory) -> None:
        import horovod.torch as hvd

        self.name, self.memory = f"fsdp.{index}", memory
        self.params = list(module.parameters(recurse=False))
        self.numel = sum(p.numel() for p in self.params)
        n, rank = hvd.size(), hvd.rank()
        s = math.ceil(self.numel / n)
        self.full = torch.zeros(s * n)
        offset = 0
        for p in self.params:
            self.full[offset:offset + p.numel()].copy_(p.detach().flatten())
            p.data = self.full[offset:offset + p.numel()].view_as(p)
            offset += p.numel()
        self.shard = self.full[rank * s:(rank + 1) * s].clone().requires_grad_(True)
        self.nbytes = self.full.untyped_storage().nbytes()
        self.grads_ready = 0
        memory.watch(self.full, self.shard)
        self.free()
        module.register_forward_pre_hook(lambda *_: self.gather("forward"))
        module.register_forward_hook(self.after_forward)
        for p in self.params:
            p.register_post_accumulate_grad_hook(self.grad_ready)

    def gather(self, phase: str) -> None:
        import horovod.torch as hvd

        storage = self.full.untyped_storage()
        if storage.nbytes() == 0:
            storage.resize_(self.nbytes)
            self.full.copy_(hvd.allgather(self.shard.detach(), name=f"{self.name}.{phase}"))
            self.memory.sample()

    def free(self) -> None:
        self.full.untyped_storage().resize_(0)

    def after_forward(self, module: nn.Module, inputs: Any, output: torch.Tensor) -> None:
        if output.requires_grad:
            output.register_hook(self.before_backward)
        self.free()

    def before_backward(self, grad: torch.Tensor) -> torch.Tensor:
        """The gradient of the unit's output has arrived: gather the weights its backward needs."""
        self.gather("backward")
        return grad

    def grad_ready(self, _: torch.Tensor) -> None:
        import horovod.torch as hvd

        self.grads_ready += 1
        if self.grads_ready < len(self.params):
            return
        self.grads_ready = 0
        flat = torch.zeros_like(self.full)
        offset = 0
        for p in self.params:
            assert p.grad is not None
            flat[offset:offset + p.numel()].copy_(p.grad.flatten())
            offset += p.numel()
            p.grad = None
        self.shard.grad = hvd.reducescatter(flat, op=hvd.Average, name=f"{self.name}.gradient")
        self.memory.sample()
        self.free()


class FullyShardedModel:
    """ZeRO stage 3 over Horovod: every parameter-holding module of ``model`` a :class:`ShardedUnit`,
    and Adam over the shards."""

    def __init__(self, model: nn.Module, lr: float = 1e-3) -> None:
        self.model, self.memory = model, ParameterMemory()
        holders = [m for m in model.modules() if any(True for _ in m.parameters(recurse=False))]
        self.units = [ShardedUnit(m, i, self.memory) for i, m in enumerate(holders)]
        self.optimizer = torch.optim.Adam([u.shard for u in self.units], lr=lr)

    def zero_grad(self) -> None:
        for u in self.units:
            u.shard.grad = None

    def step(self) -> None:
        self.optimizer.step()

    def weights(self) -> torch.Tensor:
        """The whole model's weights, gathered (for checking; costs an all-gather per unit)."""
        import horovod.torch as hvd

        parts = [hvd.allgather(u.shard.detach(), name=f"{u.name}.check")[:u.numel] for u in self.units]
        return torch.cat(parts)

    def state_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for s in self.optimizer.state.values()
                   for t in s.values() if torch.is_tensor(t) and t.dim() > 0)


def train_stage3(shape: zero.Model, steps: int, warmup: int = 1) -> dict[str, Any]:
    """In one Horovod worker: ``steps`` timed Adam steps of stage 3 on ``shape``."""
    model = zero.build(shape)
    sharded = FullyShardedModel(model)
    run = zero.timed_steps(shape, model, sharded, steps, warmup, "stage 3")
    return {"weights": sharded.weights(), "state_bytes": sharded.state_bytes(), "sent": run["sent"], "step_s": run["step_s"],
            "peak_weight_bytes": sharded.memory.peak, "parameters": sum(u.numel for u in sharded.units),
            "largest_unit_bytes": max(u.nbytes for u in sharded.units)}


def train_data_parallel(shape: zero.Model, steps: int, warmup: int = 1) -> dict[str, Any]:
    """Plain data parallelism, the whole step measured like :func:`train_stage3`'s."""
    model = zero.build(shape)
    opt = zero.DataParallelAdam(model)
    run = zero.timed_steps(shape, model, opt, steps, warmup, "dp3")
    weights = opt.flat.flat[:opt.flat.numel].clone()
    return {"weights": weights, "state_bytes": opt.state_bytes(), "sent": run["sent"], "step_s": run["step_s"],
            "peak_weight_bytes": opt.flat.flat.untyped_storage().nbytes(), "parameters": opt.flat.numel,
            "largest_unit_bytes": opt.flat.flat.untyped_storage().nbytes()}


def compare_worker(shape: zero.Model, steps: int, rounds: int) -> dict[str, Any]:
    import horovod.torch as hvd

    hvd.init()
    out: dict[str, Any] = {"rank": hvd.rank()}
    for _ in range(rounds):
        for way, fn in (("data parallel", train_data_parallel), ("stage 3", train_stage3)):
            run = fn(shape, steps)
            row = out.setdefault(way, {"sent": [], "step_s": []})
            row["sent"] += run.pop("sent")
            row["step_s"] += run.pop("step_s")
            row.update(run)
    return out


def summarise(ranks: Sequence[dict[str, Any]], ways: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Per way, over the ranks: weights against data parallel's, bytes sent and held, step time."""
    reference = ranks[0]["data parallel"]["weights"]
    out = {}
    for way in ways:
        rows = [r[way] for r in ranks]
        out[way] = {
            "parameters": rows[0]["parameters"],
            "max_weight_diff": max(float((r["weights"] - reference).abs().max()) for r in rows),
            "state_bytes": [r["state_bytes"] for r in rows],
            "peak_weight_bytes": [r.get("peak_weight_bytes", 0) for r in rows],
            "largest_unit_bytes": rows[0].get("largest_unit_bytes", 0),
            "sent": [statistics.median(r["sent"]) for r in rows],
            "step_s": max(statistics.median(r["step_s"]) for r in rows),
            "samples": {"sent": [r["sent"] for r in rows], "step_s": [r["step_s"] for r in rows]},
        }
    return out


def compare(shape: zero.Model = zero.Model(), workers: int = 4, steps: int = 3, rounds: int = 1,
            timeout: float = 300.0) -> dict[str, dict[str, Any]]:
    """Data parallelism and stage 3 by hand, side by side on ``workers`` Horovod workers (Gloo)."""
    from multigpu.running import launch

    ranks = launch.run_horovod(compare_worker, workers, args=(shape, steps, rounds),
                               horovod_args=zero.MEASURABLE, timeout=timeout, echo=False)
    ranks.sort(key=lambda r: r["rank"])
    return summarise(ranks, ("data parallel", "stage 3"))


def fully_shard_worker(rank: int, world: int, shape: zero.Model, steps: int, rounds: int) -> dict[str, Any]:
    """In each ``torch.distributed`` worker: plain data parallelism (``all_reduce``) and torch's
    ``fully_shard`` on every Linear, interleaved; this rank's figures."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    out: dict[str, Any] = {"rank": rank}
    for _ in range(rounds):
        for way in ("data parallel", "fully_shard"):
            model = zero.build(shape)
            if way == "fully_shard":
                for m in model:
                    if isinstance(m, nn.Linear):
                        fully_shard(m)
                fully_shard(model)
            opt = torch.optim.Adam(model.parameters(), lr=1e-3)
            sent, times = [], []
            for step in range(1 + steps):
                x, y = zero.batch_of(shape, step, rank, world)
                dist.barrier()
                t0 = time.perf_counter()
                with bytes_sent.counting() as counted:
                    opt.zero_grad()
                    F.cross_entropy(model(x), y).backward()
                    if way == "data parallel":
                        for p in model.parameters():
                            assert p.grad is not None
                            dist.all_reduce(p.grad)
                            p.grad /= world
                    opt.step()
                if step >= 1:
                    sent.append(counted())
                    times.append(time.perf_counter() - t0)
            full = [p.full_tensor() if hasattr(p, "full_tensor") else p for p in model.parameters()]
            row = out.setdefault(way, {"sent": [], "step_s": []})
            row["sent"] += sent
            row["step_s"] += times
            row.update(weights=torch.cat([p.detach().flatten() for p in full]),
                       state_bytes=sum(local_bytes(t) for s in opt.state.values() for t in s.values()
                                       if torch.is_tensor(t) and t.dim() > 0),
                       peak_weight_bytes=sum(local_bytes(p) for p in model.parameters()),
                       parameters=sum(p.numel() for p in full))
    return out


def local_bytes(t: torch.Tensor) -> int:
    """Bytes of this rank's part of ``t`` (a DTensor's local shard, or the whole plain tensor)."""
    local = t.to_local() if hasattr(t, "to_local") else t
    return local.numel() * local.element_size()


def compare_fully_shard(shape: zero.Model = zero.Model(), workers: int = 4, steps: int = 3, rounds: int = 1,
                        timeout: float = 300.0) -> dict[str, dict[str, Any]]:
    """torch's ``fully_shard`` beside data parallelism on ``workers`` ``torch.distributed`` workers (gloo).
    ``peak_weight_bytes`` is here each rank's sharded weights only (torch gathers the rest inside)."""
    from multigpu.running import launch

    ranks = launch.run(fully_shard_worker, workers, args=(shape, steps, rounds), backend="gloo",
                       timeout=timeout, echo=False)
    return summarise(ranks, ("data parallel", "fully_shard"))
