"""Sections 2: scaling of Horovod and DDP against the one-thread ideal, and Horovod's CPU levers."""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from multigpu.core import devices
from multigpu.course.bench.report import ALLREDUCE_WARMUP, Figure, Plan, Section, Steps, Target, fmt, interleave, paired, steps

# --------------------------------------------------------------------------- 2. scaling


def _mpi_allreduce_times(numel: int, warmup: int, reps: int) -> list[float]:
    """Seconds of each of ``reps`` timed raw MPI all-reduces (``mpi4py``, in place, sum; run under
    horovodrun over MPI, which starts ``mpirun``): the bytes Horovod's MPI operations move, without Horovod."""
    import numpy as np
    from mpi4py import MPI

    buffer = np.ones(numel, dtype=np.float32)
    times = []
    for i in range(warmup + reps):
        t0 = time.perf_counter()
        MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, buffer, op=MPI.SUM)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return times


def _gloo_allreduce_times(rank: int, world_size: int, numel: int, warmup: int, reps: int) -> list[float]:
    """Seconds of each of ``reps`` timed ``torch.distributed.all_reduce`` calls (Gloo, CPU tensor)."""
    import torch
    import torch.distributed as dist

    tensor = torch.ones(numel)
    times = []
    for i in range(warmup + reps):
        t0 = time.perf_counter()
        dist.all_reduce(tensor)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return times


def bench_scaling(plan: Plan, deadline: float) -> Section:
    """Section 2: Horovod vs DDP training throughput on 1..N workers, Horovod vs the raw all-reduce of its transport."""
    from multigpu.core import models
    from multigpu.running import hvdtools, launch

    section = Section("scaling", "Scaling: Horovod vs DDP training throughput, Horovod vs raw all-reduce")
    launchers = {"Horovod": ("horovodrun", hvdtools.REFERENCE_MODULE), "DDP": ("torchrun", hvdtools.DDP_MODULE)}
    args = ["--synthetic", str(plan.synthetic_images), "--epochs", str(plan.epochs), "--quiet"]
    info = devices.detect()
    nbytes = models.gradient_bytes(models.build_model("alexnet_small"))
    raw = "MPI" if launch.horovod_controller() == "mpi" else "Gloo"
    libraries = ("Horovod", "MPI", "Gloo") if raw == "MPI" else ("Horovod", "Gloo")
    section.notes += _scaling_notes(plan, args, info, nbytes, raw)
    train_order = interleave([(label, n) for n in plan.scaling_workers for label in launchers], plan.scaling_repeats)
    ar_order = interleave([(lib, n) for n in plan.allreduce_workers for lib in libraries],
                          plan.allreduce_rounds)
    with tempfile.TemporaryDirectory(prefix="multigpu-bench-") as tmp, \
            steps("scaling", len(train_order) + len(ar_order)) as log:
        rates = _training_rates(plan, train_order, launchers, args, Path(tmp), log)
        op_times, round_medians = _allreduce_times(plan, ar_order, nbytes, log)
    for n in plan.scaling_workers:
        for label in launchers:
            section.figures.append(Figure(f"{label}, {n} worker(s)", "images/s", rates[label, n]))
    section.figures += _efficiencies(plan, launchers, info, rates)
    for n in plan.allreduce_workers:
        section.figures += [Figure(f"Horovod all-reduce, {n} workers", "ms", op_times["Horovod", n])]
        section.figures += [Figure(f"raw {lib} all-reduce, {n} workers", "ms", op_times[lib, n]) for lib in libraries[1:]]
        section.figures.append(Figure(f"Horovod / raw {raw} all-reduce time, {n} workers", "ratio",
                                      paired(round_medians["Horovod", n], round_medians[raw, n]), Target("<=", 1.10),
                                      note="the same transport; per job pair; lower is better"))
    return section


def _scaling_notes(plan: Plan, args: Sequence[str], info: devices.MachineInfo, nbytes: int, raw: str) -> list[str]:
    """What section 2 measures and how, as its notes say it."""
    from multigpu.running import hvdtools

    return [
        f"Training: `{hvdtools.REFERENCE_MODULE}` under horovodrun and `{hvdtools.DDP_MODULE}` under torchrun, "
        f"`{' '.join(args)}`: in-memory synthetic images, so the figures are compute + communication, no JPEG I/O. "
        "images/s of all workers together, the median over epochs of a run, warm-up steps excluded.",
        f"Efficiency = N-worker images/s / (ideal x 1-worker images/s of the same launcher, same repeat, "
        "run with `--threads 1`: one core's share); "
        f"ideal = `devices.ideal_factor(N)` = min(N, {info.devices}) here.",
        f"All-reduce: one float32 tensor of {nbytes / 1e6:.1f} MB (AlexNet-small's gradient), in place, sum; "
        f"{ALLREDUCE_WARMUP} untimed then {plan.allreduce_reps} timed per job, {plan.allreduce_rounds} job(s) per "
        f"library and worker count, interleaved; samples are rank 0's. Horovod runs over {raw} here (the course's "
        f"transport, `launch.horovod_controller()`), so Horovod / raw {raw} is Horovod's own overhead; raw Gloo "
        "(torch.distributed over TCP loopback, DDP's transport on CPU) is shown beside it.",
    ]


def _training_rates(plan: Plan, order: Sequence[tuple[int, tuple[str, int]]], launchers: dict[str, tuple[str, str]],
                    args: Sequence[str], tmp: Path, log: Steps) -> dict[tuple[str, int], list[float]]:
    """Images/s of each (launcher, workers) run of ``order``, in that order."""
    from multigpu.running import hvdtools, run_records

    rates: dict[tuple[str, int], list[float]] = {key: [] for _, key in order}
    for r, (label, n) in order:
        launcher, module = launchers[label]
        t0 = time.perf_counter()
        one_thread = ["--threads", "1"] if n == 1 else []  # the ideal's unit: one core's share
        run = hvdtools.run_script(n, [*args, *one_thread], out=tmp / f"{label}-{n}", module=module,
                                  launcher=launcher, timeout=300, echo=False)
        rates[label, n].append(run_records.throughput(run))
        log.finished(f"{label}, {n} worker(s), repeat {r + 1}/{plan.scaling_repeats}: "
                     f"{fmt(rates[label, n][-1], 'images/s')} ({time.perf_counter() - t0:.0f} s)")
    return rates


def _allreduce_times(plan: Plan, order: Sequence[tuple[int, tuple[str, int]]], nbytes: int,
                     log: Steps) -> tuple[dict[tuple[str, int], list[float]], dict[tuple[str, int], list[float]]]:
    """Each (library, workers) job of ``order``: rank 0's all-reduce times (ms), and each job's median (s)."""
    import torch

    from multigpu.running import hvdtools, launch

    op_times: dict[tuple[str, int], list[float]] = {key: [] for _, key in order}
    round_medians: dict[tuple[str, int], list[float]] = {key: [] for _, key in order}
    job_args = (nbytes // torch.float32.itemsize, ALLREDUCE_WARMUP, plan.allreduce_reps)
    for r, (lib, n) in order:
        if lib == "Horovod":
            values = launch.run_horovod(hvdtools.allreduce_times, n, args=job_args, timeout=300, echo=False)
        elif lib == "MPI":
            values = launch.run_horovod(_mpi_allreduce_times, n, args=job_args, timeout=300, echo=False)
        else:
            values = launch.run(_gloo_allreduce_times, n, args=job_args, backend="gloo", timeout=300, echo=False)
        op_times[lib, n] += [1000 * t for t in values[0]]
        round_medians[lib, n].append(statistics.median(values[0]))
        log.finished(f"{lib if lib == 'Horovod' else 'raw ' + lib} all-reduce, {n} workers, round {r + 1}/{plan.allreduce_rounds}: "
                     f"{fmt(1000 * round_medians[lib, n][-1], 'ms')} (median of {len(values[0])})")
    return op_times, round_medians


def _efficiencies(plan: Plan, launchers: dict[str, tuple[str, str]], info: devices.MachineInfo,
                  rates: dict[tuple[str, int], list[float]]) -> list[Figure]:
    """Each launcher's efficiency at each worker count past one, and Horovod over DDP."""
    figures = []
    for n in plan.scaling_workers:
        if n == 1:
            continue
        ideal = devices.ideal_factor(n, info)
        for label in launchers:
            figures.append(Figure(
                f"{label} efficiency, {n} workers", "ratio", paired(rates[label, n], rates[label, 1], ideal),
                Target(">=", 0.85 if n == 2 else 0.80) if label == "Horovod" else None,
            ))
        figures.append(Figure(f"Horovod / DDP images/s, {n} workers", "ratio",
                              paired(rates["Horovod", n], rates["DDP", n]), Target(">=", 1.0)))
    return figures


#: Horovod's CPU-mode levers: label -> environment of the run (on top of the course's defaults:
#: pinned workers, ``launch.CPU_FUSION_THRESHOLD``; Horovod's waits sleep, the project's patch). ``bench_levers`` measures each beside the defaults, torch
#: DDP and one one-thread worker, interleaved; the README's lever table comes from it.
LEVERS: dict[str, dict[str, str]] = {
    "course default (pinned, 4 MB fusion)": {},
    "HOROVOD_CYCLE_TIME=0.2 (ms)": {"HOROVOD_CYCLE_TIME": "0.2"},
    "not pinned": {"MULTIGPU_PIN": "0"},
    "HOROVOD_CYCLE_TIME=5 (ms)": {"HOROVOD_CYCLE_TIME": "5"},
    "HOROVOD_FUSION_THRESHOLD=128 MB (Horovod's default)": {"HOROVOD_FUSION_THRESHOLD": str(128 * 2**20)},
    "HOROVOD_FUSION_THRESHOLD=0 (no fusion)": {"HOROVOD_FUSION_THRESHOLD": "0"},
    "HOROVOD_CACHE_CAPACITY=0 (no response cache)": {"HOROVOD_CACHE_CAPACITY": "0"},
}
#: The lever that is a launcher option: Horovod's CPU operations over Gloo instead of MPI.
GLOO = "Gloo over TCP loopback instead of MPI (horovodrun --gloo)"
#: Worker counts the levers are measured at.
LEVER_WORKERS: tuple[int, ...] = (2, 4)
#: The ceiling of 2 workers on 2 cores: two one-thread trainings at once, one per core, with no
#: communication at all (they share memory bandwidth, caches and the chip's clock).
CONCURRENT = "two independent one-thread workers at once (no communication)"


def _concurrent_images_per_s(args: Sequence[str], cores: Sequence[int], tmp: Path) -> float:
    """Images/s of ``len(cores)`` one-worker runs of the course's script started together, each
    pinned to its own core, summed: what the cores deliver when nothing is communicated."""
    from multigpu.running import hvdtools, launch, run_records

    procs, outs = [], []
    for i, core in enumerate(cores):
        out = tmp / f"concurrent-{i}"
        out.mkdir(parents=True, exist_ok=True)
        outs.append(out)
        procs.append(launch.start([sys.executable, "-m", hvdtools.REFERENCE_MODULE, *args, "--record", "--out", str(out)],
                                  env=launch.worker_env(), cores={core}))
    job = launch.supervise(procs, [f"core {c}" for c in cores], 300, echo=False, what="concurrent one-worker runs")
    if any(job.returncodes):
        raise RuntimeError(f"a concurrent one-worker run failed (exit codes {job.returncodes}): "
                           + launch.worker_errors(job.output))
    return sum(run_records.throughput(run_records.read_records(out, 1)) for out in outs)


def _lever_runs(cores: Sequence[int]) -> list[tuple[str, str, int, dict[str, str]]]:
    """Section 3's runs, each ``(label, launcher, workers, environment)``: the one-thread worker,
    then at each of :data:`LEVER_WORKERS` DDP (pinned and not), every lever and Horovod over Gloo;
    last, with two ``cores``, the two workers that never communicate (the machine's own ceiling)."""
    runs: list[tuple[str, str, int, dict[str, str]]] = [("one worker, one thread", "horovodrun", 1, {})]
    for n in LEVER_WORKERS:
        runs += [("DDP (pinned)", "torchrun", n, {}), ("DDP, not pinned", "torchrun", n, {"MULTIGPU_PIN": "0"})]
        runs += [(f"Horovod, {label}", "horovodrun", n, env) for label, env in LEVERS.items()]
        runs.append((f"Horovod, {GLOO}", "horovodrun --gloo", n, {}))
    if len(cores) == 2:
        runs.append((CONCURRENT, "two processes", 2, {}))
    return runs


def bench_levers(plan: Plan, deadline: float) -> Section:
    """Section 3: what each Horovod lever does on this machine, against the same-run ideal and DDP.

    Every run is the course's script on in-memory synthetic images (compute + communication);
    each repeat runs one one-thread worker (the ideal's unit), torch DDP (pinned and not) and
    every lever of :data:`LEVERS` at each of :data:`LEVER_WORKERS`, in one interleaved order.
    """
    from multigpu.running import hvdtools, run_records

    section = Section("levers", "Horovod's CPU levers, one at a time, against the ideal and torch DDP")
    args = ["--synthetic", str(plan.synthetic_images), "--epochs", str(plan.epochs), "--quiet"]
    cores = sorted(os.sched_getaffinity(0))[:2]
    runs = _lever_runs(cores)
    order = interleave(runs, plan.lever_repeats)
    rates: dict[tuple[str, int], list[float]] = {(label, n): [] for label, _, n, _ in runs}
    section.notes += [
        f"`{' '.join(args)}` of `{hvdtools.REFERENCE_MODULE}` (Horovod) and `{hvdtools.DDP_MODULE}` (DDP); the "
        "one-worker run adds `--threads 1`. Each lever is the course default plus one environment change.",
        "x ideal = N-worker images/s / (min(N, cores) x the one-thread worker of the same repeat); "
        "/ DDP = against the pinned DDP run of the same repeat and worker count.",
    ]
    with tempfile.TemporaryDirectory(prefix="multigpu-levers-") as tmp, steps("levers", len(order)) as log:
        for r, (label, launcher, n, env) in order:
            if time.monotonic() > deadline:
                section.notes.append(f"stopped at repeat {r + 1}: the run's time budget was spent")
                break
            if launcher == "two processes":
                rates[label, n].append(_concurrent_images_per_s([*args, "--threads", "1"], cores, Path(tmp)))
                log.finished(f"{label}, repeat {r + 1}: {fmt(rates[label, n][-1], 'images/s')}")
                continue
            module = hvdtools.DDP_MODULE if launcher == "torchrun" else hvdtools.REFERENCE_MODULE
            extra = ["--threads", "1"] if n == 1 else []
            run = hvdtools.run_script(n, [*args, *extra], out=Path(tmp) / "run", module=module,
                                      launcher=launcher, timeout=300, env=env, echo=False)
            rates[label, n].append(run_records.throughput(run))
            log.finished(f"{label}, {n} worker(s), repeat {r + 1}: {fmt(rates[label, n][-1], 'images/s')}")
    one = rates["one worker, one thread", 1]
    section.figures.append(Figure("one worker, one thread", "images/s", one))
    if (CONCURRENT, 2) in rates:
        section.figures.append(Figure(f"{CONCURRENT}: x ideal", "ratio", paired(rates[CONCURRENT, 2], one, 2),
                                      note="the cores' own ceiling for any 2-worker run"))
    for n in LEVER_WORKERS:
        ideal = devices.ideal_factor(n)
        ddp = rates["DDP (pinned)", n]
        for label, _, workers, _ in runs:
            if workers != n or label == CONCURRENT:
                continue
            values = rates[label, n]
            target = None
            if label == f"Horovod, {next(iter(LEVERS))}":
                target = Target(">=", 0.85 if n == 2 else 0.80)
            section.figures.append(Figure(f"{label}, {n} workers: x ideal", "ratio", paired(values, one, ideal), target))
            if label.startswith("Horovod"):
                section.figures.append(Figure(f"{label}, {n} workers: / DDP", "ratio", paired(values, ddp),
                                              Target(">=", 1.0) if target else None))
    return section


