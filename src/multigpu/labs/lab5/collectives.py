"""Lab 5, part 2.1: which of Horovod's collectives run on this machine's workers, and what each costs.

A sharded optimizer needs an all-reduce, a reduce-scatter and an all-gather. Horovod 0.28.1 has
all three (``hvd.allreduce``, ``hvd.reducescatter``, ``hvd.allgather``), their ``grouped_*`` forms
and process sets; whether they run on CPU workers depends on the build and the controller.
:func:`collectives` tries each on real workers over a controller (Gloo or MPI) and reports "ok"
or the error; :func:`collective_times` times the three on the same tensor, side by side.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import torch


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
