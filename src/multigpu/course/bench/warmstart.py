"""Section ``warm``: what a job's start costs with warm workers (:mod:`multigpu.running.warm`)
against fresh interpreters, side by side."""

from __future__ import annotations

import os
import time

from multigpu.course.bench.report import Figure, Plan, Section, Target, interleave, paired, steps

#: The jobs timed: (name, workers, how it starts) over each launcher a lab uses.
JOBS = (("launch.run, 2 workers (torch.distributed, Gloo)", 2, "run"),
        ("launch.run_horovod, 4 workers (horovodrun, MPI)", 4, "horovod"))


def trivial(rank: int, world: int) -> int:
    return rank


def horovod_rank() -> int:
    import horovod.torch as hvd

    hvd.init()
    return int(hvd.rank())


def one_job(kind: str, workers: int) -> float:
    """Seconds of one job that does nothing but start, rendezvous and return."""
    from multigpu.running import launch

    start = time.perf_counter()
    if kind == "run":
        launch.run(trivial, workers, timeout=300, echo=False)
    else:
        launch.run_horovod(horovod_rank, workers, timeout=300, echo=False)
    return time.perf_counter() - start


def timed(kind: str, workers: int, warm_on: bool) -> float:
    from multigpu.running import warm

    before = os.environ.get(warm.ENV)
    os.environ[warm.ENV] = "1" if warm_on else "0"
    try:
        return one_job(kind, workers)
    finally:
        if before is None:
            os.environ.pop(warm.ENV, None)
        else:
            os.environ[warm.ENV] = before


def bench_warm(plan: Plan, deadline: float) -> Section:
    """Each job of :data:`JOBS` with fresh interpreters and with warm workers, interleaved; the warm
    parent started before the first timed job (a kernel starts it once, at its first job)."""
    from multigpu.running import warm

    section = Section("warm", "A job's start: warm workers against fresh interpreters")
    repeats = 3 if plan.quick else 7
    warm.python()  # the warm parent, started once
    times: dict[tuple[str, bool], list[float]] = {(name, w): [] for name, _, _ in JOBS for w in (False, True)}
    with steps("warm", repeats * len(JOBS) * 2) as log:
        for _, (name, workers, kind) in interleave(JOBS, repeats):
            for warm_on in (False, True):
                log.starting(f"{name}, {'warm' if warm_on else 'fresh'}")
                times[(name, warm_on)].append(timed(kind, workers, warm_on))
                log.finished(f"{times[(name, warm_on)][-1]:.2f} s")
    for name, _, _ in JOBS:
        section.figures += [Figure(f"{name}: fresh", "s", times[(name, False)]),
                            Figure(f"{name}: warm", "s", times[(name, True)]),
                            Figure(f"{name}: warm / fresh", "ratio", paired(times[(name, True)], times[(name, False)]),
                                   target=Target("<=", 0.5))]
    section.notes.append(f"{repeats} interleaved repeats of a job that only starts its workers, joins the rendezvous "
                         "and returns (fresh: MULTIGPU_WARM=0); horovodrun and mpirun are the real ones in both.")
    return section

