"""Lab 5, part 5: pipeline parallelism, GPipe against 1F1B, the bubble measured.

The model is cut into ``p`` stages, one per worker; the batch into ``m`` micro-batches. Each
stage runs a forward ("F", i) and a backward ("B", i) per micro-batch i, in an order its
schedule fixes:

- **GPipe** (Huang et al. 2019): every forward, then every backward. A stage keeps the
  activations of all ``m`` micro-batches until their backward.
- **1F1B** (PipeDream-Flush, Narayanan et al. 2021, section 2.2.1): stage s first runs
  ``min(p - s, m)`` forwards (the warm-up), then alternates one backward and one forward, then
  runs the remaining backwards (the cool-down). It keeps at most ``p - s`` micro-batches'
  activations, whatever ``m``.

Both leave every stage idle for the same share of a step, the **bubble**:
``(p - 1) / (m + p - 1)`` when every stage takes the same time per micro-batch. :func:`measure`
runs torch's own ``torch.distributed.pipelining`` schedules (``ScheduleGPipe``,
``Schedule1F1B``; both run on CPU workers over gloo with torch 2.13) on real workers, times each
stage's forwards and backwards from inside the stage, records the order they ran in, and counts
the bytes autograd held for the backward pass at its peak
(:class:`~multigpu.labs.lab5.memory.SavedTensors`). Two kinds of stage:

- ``"stand-in"``: each forward sleeps ``forward_s`` and each backward ``backward_s``, and keeps a
  fixed activation. The stages then need no processor, so 4 of them on a 2-core machine run as
  they would on 4 devices: the timing of the schedule alone.
- ``"mlp"``: real layers computing on the processor (use as many stages as cores: stages sharing
  a core would wait for each other, not for the schedule).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from multigpu.labs.lab5.memory import SavedTensors

Op = tuple[str, int]
SCHEDULES = ("GPipe", "1F1B")


def gpipe_order(stage: int, stages: int, micro_batches: int) -> list[Op]:
    """GPipe's order on any stage: all forwards, then all backwards."""
    return [("F", i) for i in range(micro_batches)] + [("B", i) for i in range(micro_batches)]


def one_f_one_b_order(stage: int, stages: int, micro_batches: int) -> list[Op]:
    """1F1B's order on ``stage`` (0-based) of ``stages``: warm-up forwards, then one backward and
    one forward in turn, then the remaining backwards."""
    warmup = min(stages - stage, micro_batches)
    order: list[Op] = [("F", i) for i in range(warmup)]
    for i in range(micro_batches - warmup):
        order += [("B", i), ("F", warmup + i)]
    return order + [("B", i) for i in range(micro_batches - warmup, micro_batches)]


ORDERS = {"GPipe": gpipe_order, "1F1B": one_f_one_b_order}


def in_flight(order: Sequence[Op]) -> list[int]:
    """Micro-batches whose forward ran and whose backward has not, after each op of ``order``."""
    held, out = 0, []
    for op, _ in order:
        held += 1 if op == "F" else -1
        out.append(held)
    return out


def order_problems(order: Sequence[Op], stage: int, stages: int, micro_batches: int) -> list[str]:
    """What breaks 1F1B's rules in ``order``, each as what to do instead (empty: it is 1F1B's order)."""
    order = [tuple(op) for op in order]  # type: ignore[misc]
    m, want_warmup = micro_batches, min(stages - stage, micro_batches)
    if sorted(order) != sorted((k, i) for k in "FB" for i in range(m)):
        return [f"run every micro-batch's forward and backward exactly once: {2 * m} ops, not {len(order)}"]
    problems = []
    for kind in "FB":
        seen = [i for k, i in order if k == kind]
        if seen != sorted(seen):
            problems.append(f"run the {kind} ops in micro-batch order 0, 1, 2, ...: got {seen}")
    position = {op: n for n, op in enumerate(order)}
    early = [i for i in range(m) if position[("B", i)] < position[("F", i)]]
    if early:
        problems.append(f"run each micro-batch's backward after its forward: {early} went backward first")
    warmup = next(n for n, (k, _) in enumerate(order) if k == "B")
    if warmup != want_warmup:
        problems.append(f"start with {want_warmup} forwards, min(stages - stage, micro_batches), not {warmup}")
    steady = "".join(k for k, _ in order[warmup:warmup + 2 * (m - want_warmup)])
    if not problems and steady != "BF" * (m - want_warmup):
        problems.append(f"after the warm-up alternate one backward and one forward until the forwards run out: "
                        f"got {steady}")
    return problems


def bubble(stages: int, micro_batches: int) -> float:
    """The idle share of each stage's step when all stages take the same time: (p-1)/(m+p-1)."""
    return (stages - 1) / (micro_batches + stages - 1)


# --------------------------------------------------------------------------- stages that run


class Recorder:
    """A stage's ops as they ran: (op, micro-batch, start, end), times from ``perf_counter``."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int, float, float]] = []
        self.forwards = self.backwards = 0

    def forward(self, start: float) -> None:
        self.events.append(("F", self.forwards, start, time.perf_counter()))
        self.forwards += 1

    def backward(self, start: float) -> None:
        self.events.append(("B", self.backwards, start, time.perf_counter()))
        self.backwards += 1


class _Sleep(torch.autograd.Function):
    """Sleeps ``forward_s`` forward and ``backward_s`` backward; keeps its input for backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, forward_s: float, backward_s: float, rec: Recorder) -> torch.Tensor:
        start = time.perf_counter()
        time.sleep(forward_s)
        ctx.save_for_backward(x)
        ctx.backward_s, ctx.rec = backward_s, rec
        rec.forward(start)
        return x * 1.0

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        start = time.perf_counter()
        time.sleep(ctx.backward_s)
        _ = ctx.saved_tensors  # what the stage kept for its backward (autograd releases it after this)
        ctx.rec.backward(start)
        return grad, None, None, None


class StandIn(nn.Module):
    """A stage whose work is a fixed, timed wait (see the module's docstring)."""

    def __init__(self, forward_s: float, backward_s: float, rec: Recorder) -> None:
        super().__init__()
        self.forward_s, self.backward_s, self.rec = forward_s, backward_s, rec
        self.scale = nn.Parameter(torch.ones(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.clone()  # a micro-batch of the first stage is a view of the whole batch: its own storage
        return _Sleep.apply(x * self.scale, self.forward_s, self.backward_s, self.rec)


class _Clock(torch.autograd.Function):
    """Identity that notes the time its backward runs (``mark`` "start" or "end" of a stage's backward)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, rec: Recorder, mark: str, box: list[float]) -> torch.Tensor:
        ctx.rec, ctx.mark, ctx.box = rec, mark, box
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        if ctx.mark == "start":
            ctx.box.append(time.perf_counter())
        else:
            ctx.rec.backward(ctx.box.pop(0))
        return grad, None, None, None


class TimedLayers(nn.Module):
    """Real layers whose forward and backward are timed from inside (see :class:`Recorder`)."""

    def __init__(self, layers: nn.Module, rec: Recorder) -> None:
        super().__init__()
        self.layers, self.rec = layers, rec
        self.starts: list[float] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        start = time.perf_counter()
        if not x.requires_grad:  # the first stage: its input's gradient marks the end of its backward
            x = x.detach().clone().requires_grad_(True)  # (a micro-batch's own storage, not a view of the batch)
        y = self.layers(_Clock.apply(x, self.rec, "end", self.starts))
        self.rec.forward(start)
        return _Clock.apply(y, self.rec, "start", self.starts)


@dataclass(frozen=True)
class Setup:
    """What :func:`measure` runs: the kind of stage, its sizes and times."""

    kind: str = "stand-in"  #: "stand-in" or "mlp"
    forward_s: float = 0.02  #: stand-in: seconds per micro-batch forward
    backward_s: float = 0.04  #: stand-in: seconds per micro-batch backward
    width: int = 256  #: activations per sample (stand-in and mlp)
    layers: int = 4  #: mlp: Linear+ReLU layers per stage
    micro_batch: int = 32  #: samples per micro-batch


#: Real compute for 2 stages on 2 cores: 4 layers of 1024 per stage, micro-batches of 64.
MLP = Setup("mlp", width=1024, layers=4, micro_batch=64)


def build_stage(setup: Setup, rec: Recorder) -> nn.Module:
    if setup.kind == "stand-in":
        return StandIn(setup.forward_s, setup.backward_s, rec)
    torch.manual_seed(0)
    layers = nn.Sequential(*[m for _ in range(setup.layers) for m in (nn.Linear(setup.width, setup.width), nn.ReLU())])
    return TimedLayers(layers, rec)


def run_worker(rank: int, world: int, setup: Setup, micro_batches: Sequence[int], steps: int) -> dict[str, Any]:
    """In each stage's worker: per schedule and m, ``steps`` timed steps of torch's schedule."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    classes = {"GPipe": ScheduleGPipe, "1F1B": Schedule1F1B}
    out: dict[str, Any] = {}
    for m in micro_batches:
        for name in SCHEDULES:
            rec = Recorder()
            module = build_stage(setup, rec)
            stage = PipelineStage(module, rank, world, torch.device("cpu"))
            try:
                schedule = classes[name](stage, n_microbatches=m, loss_fn=lambda y, t: ((y - t) ** 2).mean())
            except ValueError as exc:  # torch's 1F1B wants m >= p
                out[f"{name}|{m}"] = f"{type(exc).__name__}: {exc}"
                continue
            x = torch.randn(m * setup.micro_batch, setup.width)
            rows = []
            for step in range(steps + 1):
                saved = SavedTensors(exclude=list(module.parameters()))
                dist.barrier()
                rec.events.clear()
                rec.forwards = rec.backwards = 0
                start = time.perf_counter()
                with saved.hooks():
                    if rank == 0:
                        schedule.step(x)
                    elif rank == world - 1:
                        schedule.step(target=torch.zeros_like(x))
                    else:
                        schedule.step()
                end = time.perf_counter()
                if step:
                    rows.append({"span": (start, end), "events": list(rec.events), "peak_saved": saved.peak})
            out[f"{name}|{m}"] = rows
    return out


def stage_figures(rows: Sequence[dict[str, Any]], ends: Sequence[float]) -> dict[str, Any]:
    """One stage's figures over its timed steps; ``ends[k]``: when step k ended on the last stage to end."""
    idle, order = [], []
    for row, end in zip(rows, ends):
        start = row["span"][0]
        busy = sum(e - s for _, _, s, e in row["events"])
        idle.append(1 - busy / (end - start))
        order = [(op, i) for op, i, _, _ in sorted(row["events"], key=lambda e: e[2])]
    forward_s = statistics.median(e - s for r in rows for op, _, s, e in r["events"] if op == "F")
    backward_s = statistics.median(e - s for r in rows for op, _, s, e in r["events"] if op == "B")
    return {"bubble": statistics.median(idle), "order": order, "peak_in_flight": max(in_flight(order)),
            "peak_saved_bytes": max(r["peak_saved"] for r in rows), "forward_s": forward_s, "backward_s": backward_s}


def measure(setup: Setup = Setup(), stages: int = 4, micro_batches: Sequence[int] = (1, 4, 8, 16), steps: int = 2,
            timeout: float = 300.0) -> dict[tuple[str, int], dict[str, Any]]:
    """torch's GPipe and 1F1B on ``stages`` workers for each m; per (schedule, m): each stage's
    bubble (idle share of the step, the step timed from a common barrier to the last stage's
    end), the order it ran, the micro-batches it held at its peak, its peak bytes saved for
    backward, and the formula's bubble. Where torch refuses a schedule (its 1F1B wants
    ``m >= p``), ``refused`` holds its error."""
    from multigpu.running import launch

    ranks = launch.run(run_worker, stages, args=(setup, tuple(micro_batches), steps), backend="gloo",
                       threads=1, timeout=timeout, echo=False)
    out: dict[tuple[str, int], dict[str, Any]] = {}
    for m in micro_batches:
        for name in SCHEDULES:
            key = f"{name}|{m}"
            if isinstance(ranks[0][key], str):
                out[(name, m)] = {"refused": ranks[0][key], "formula": bubble(stages, m)}
                continue
            ends = [max(r[key][k]["span"][1] for r in ranks) for k in range(steps)]
            per_stage = [stage_figures(r[key], ends) for r in ranks]
            out[(name, m)] = {"stages": per_stage, "bubble": statistics.mean(s["bubble"] for s in per_stage),
                              "formula": bubble(stages, m), "step_s": statistics.median(
                                  e - max(r[key][k]["span"][0] for r in ranks) for k, e in enumerate(ends))}
    return out
