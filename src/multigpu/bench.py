"""``make bench``: the course's performance figures on this machine, each against its target.

    multigpu bench [--quick] [--only SECTION ...] [--out bench/]

Sections, run in this order (``--only`` picks some):

- ``pipeline``: images/s of the JPEG read + decode + augment pipeline with the default
  DataLoader settings, against the read + decode bound (Pillow alone on the same files, in as
  many processes as the loader uses). Target: ratio >= 0.9.
- ``scaling``: aggregate images/s of the reference Horovod script and of the DDP script on 1, 2
  and 4 workers (synthetic in-memory data: compute and communication, no JPEG I/O), their
  efficiency against ``devices.ideal_factor(N)`` x one worker of the same launcher with one
  thread, and the time of one all-reduce of AlexNet-small's gradient with Horovod and with raw
  ``torch.distributed`` (Gloo). Targets: Horovod efficiency >= 0.85 at 2 workers and >= 0.80 at
  4; Horovod >= DDP at 2 and 4 workers; Horovod's all-reduce <= 1.10 x raw Gloo.
- ``levers``: Horovod's CPU levers (:data:`LEVERS`) one at a time at 2 and 4 workers, each
  against the one-thread ideal and pinned DDP of the same repeat, and the cores' own ceiling
  (two one-thread workers that never communicate). Targets on the course default as above.
- ``course``: wall time of every solution notebook run top to bottom (papermill, default
  parameters; ``--quick``: quick parameters, labelled so) and their sum. One run each (n=1).
  Targets: whole course < 15 min, no notebook > 6 min.
- ``grading``: wall time to grade the reference assessment solution end to end, and the
  projected time of a 30-learner workshop graded one submission after another. Targets: one
  submission <= 3 min (median of 5), the workshop <= 1.5 h. Repeats stop early rather than push
  the run past its time budget.

Method: every figure is the median over repeats with its min-max spread; every comparison is
measured side by side in one run, interleaved (A, B, A, B, ...), because this machine's speed
drifts by a factor of several within minutes. A ratio's samples are the ratios of the pairs
measured next to each other. Targets are goals: a figure that misses one reads "NOT met" and
the run still exits 0. Only a measurement that crashes makes it exit 1 (the results of every
other section are still written).

Writes ``OUT/results.json`` (machine, every sample, every figure) and ``OUT/results.md`` (the
same as tables), after each section, so an interrupted run leaves what it measured.
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

from multigpu import devices, layout
from multigpu.notebook import progress

V = TypeVar("V")

REPO = layout.course_root()
SECTION_NAMES: tuple[str, ...] = ("pipeline", "scaling", "levers", "course", "grading")
#: Learners in the workshop the grading projection is for.
WORKSHOP_LEARNERS = 30
#: Seconds a notebook cell may run. A longer cell already breaks the 6-minute notebook target, and
#: without a limit a lost kernel reply (seen with ipykernel 7: the kernel idles, papermill waits
#: forever) would stall the whole run.
CELL_TIMEOUT_S = 600


# --------------------------------------------------------------------------- figures


@dataclass(frozen=True)
class Plan:
    """How much to measure: the default run (under 20 minutes here) or the quick one (~2-3)."""

    quick: bool
    pipeline_repeats: int  #: timed loader runs (and as many decode-bound runs)
    pipeline_batches: int  #: batches per loader run, after one warm-up batch
    scaling_repeats: int  #: runs of each (launcher, workers) pair
    scaling_workers: tuple[int, ...]
    synthetic_images: int  #: --synthetic N of the training scripts
    epochs: int  #: --epochs of the training scripts; throughput is the median over epochs
    allreduce_workers: tuple[int, ...]
    allreduce_rounds: int  #: jobs of each (library, workers) pair
    allreduce_reps: int  #: timed all-reduces per job, after :data:`ALLREDUCE_WARMUP`
    grading_repeats: int  #: at most this many gradings (fewer when the budget runs out)
    lever_repeats: int  #: runs of each Horovod lever (and of the baselines beside them)
    budget_s: float  #: the whole run should end within this many seconds


DEFAULT = Plan(
    quick=False, pipeline_repeats=5, pipeline_batches=16,
    scaling_repeats=3, scaling_workers=(1, 2, 4), synthetic_images=2560, epochs=2,
    allreduce_workers=(2, 4), allreduce_rounds=2, allreduce_reps=10,
    grading_repeats=5, lever_repeats=3, budget_s=60 * 60,
)
QUICK = Plan(
    quick=True, pipeline_repeats=3, pipeline_batches=8,
    scaling_repeats=1, scaling_workers=(1, 2, 4), synthetic_images=1024, epochs=2,
    allreduce_workers=(2, 4), allreduce_rounds=1, allreduce_reps=10,
    grading_repeats=1, lever_repeats=1, budget_s=5 * 60,
)
#: Untimed all-reduces before the timed ones (connection set-up, buffer allocation).
ALLREDUCE_WARMUP = 3


@dataclass(frozen=True)
class Spread:
    """Median of the samples and their range."""

    median: float
    low: float
    high: float
    n: int


def spread(samples: Sequence[float]) -> Spread:
    """The median, minimum, maximum and count of ``samples`` (at least one)."""
    if not samples:
        raise ValueError("no samples: a figure needs at least one measurement")
    return Spread(statistics.median(samples), min(samples), max(samples), len(samples))


def interleave(variants: Sequence[V], repeats: int) -> list[tuple[int, V]]:
    """The order to measure in: ``(repeat, variant)``, every variant once per repeat.

    ``interleave("AB", 3)`` is A, B, A, B, A, B (never all A before any B), so a drift of the
    machine's speed hits every variant alike.
    """
    return [(r, v) for r in range(repeats) for v in variants]


@dataclass(frozen=True)
class Target:
    """A goal for a figure: ``value op target`` with ``op`` one of ``<``, ``<=``, ``>``, ``>=``."""

    op: str
    value: float

    def __post_init__(self) -> None:
        if self.op not in ("<", "<=", ">", ">="):
            raise ValueError(f"unknown comparison {self.op!r}")

    def met(self, x: float) -> bool:
        return {"<": x < self.value, "<=": x <= self.value, ">": x > self.value, ">=": x >= self.value}[self.op]


@dataclass
class Figure:
    """One reported number: its samples, unit, optional target; or the error that stopped it."""

    name: str
    unit: str  #: ``"s"``, ``"ms"``, ``"images/s"`` or ``"ratio"``
    samples: list[float] = field(default_factory=list)
    target: Target | None = None
    note: str = ""
    error: str = ""

    @property
    def spread(self) -> Spread | None:
        return spread(self.samples) if self.samples and not self.error else None

    @property
    def met(self) -> bool | None:
        """Whether the median meets the target (None without a target or a measurement)."""
        s = self.spread
        return None if self.target is None or s is None else self.target.met(s.median)

    def to_dict(self) -> dict[str, Any]:
        s = self.spread
        return {
            "name": self.name, "unit": self.unit,
            "median": s.median if s else None, "min": s.low if s else None, "max": s.high if s else None,
            "n": s.n if s else 0, "samples": list(self.samples),
            "target": {"op": self.target.op, "value": self.target.value} if self.target else None,
            "met": self.met, "note": self.note, "error": self.error,
        }


@dataclass
class Section:
    """The figures of one section, what they measure, and whether the section ran."""

    name: str
    title: str
    figures: list[Figure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    status: str = "ok"  #: ``"ok"``, ``"skipped"`` or ``"error"``
    error: str = ""
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "title": self.title, "status": self.status, "error": self.error,
            "seconds": self.seconds, "notes": list(self.notes), "figures": [f.to_dict() for f in self.figures],
        }


def fmt(x: float, unit: str, *, with_unit: bool = True) -> str:
    """A value as the tables show it: seconds from 100 s on as minutes, rates without decimals."""
    if unit == "s":
        text, suffix = (f"{x / 60:.1f}", "min") if x >= 100 else (f"{x:.1f}", "s")
    elif unit == "ms":
        text, suffix = f"{x:.1f}", "ms"
    elif unit == "images/s":
        text, suffix = f"{x:,.0f}", "images/s"
    else:
        text, suffix = f"{x:.2f}", ""
    return f"{text} {suffix}" if with_unit and suffix else text


def _range(s: Spread, unit: str) -> str:
    """``low-high``; both in the unit of the high end (``90.0 s-2.1 min`` would mislead)."""
    if unit == "s" and s.high >= 100:
        return f"{s.low / 60:.1f}\u2013{s.high / 60:.1f} min"
    return f"{fmt(s.low, unit, with_unit=False)}\u2013{fmt(s.high, unit)}"


def figure_row(f: Figure) -> str:
    """One markdown table row: figure | median | spread | n | target | met."""
    target = f"{f.target.op} {fmt(f.target.value, f.unit)}" if f.target else ""
    verdict = {True: "met", False: "NOT met", None: ""}[f.met]
    s = f.spread
    if s is None:
        return f"| {f.name} | error: {f.error or 'no measurement'} | | 0 | {target} | |"
    name = f"{f.name} ({f.note})" if f.note else f.name
    return f"| {name} | {fmt(s.median, f.unit)} | {_range(s, f.unit)} | {s.n} | {target} | {verdict} |"


def section_markdown(section: Section) -> str:
    """A section as markdown: title, notes, and the table of its figures."""
    lines = [f"### {section.title}", ""]
    lines += [f"- {note}" for note in section.notes]
    if section.status == "error":
        lines.append(f"- **error**: {section.error}")
    if section.notes or section.status == "error":
        lines.append("")
    if section.figures:
        lines += ["| figure | median | spread (min\u2013max) | n | target | |", "|---|---:|---:|---:|---|---|"]
        lines += [figure_row(f) for f in section.figures]
        lines.append("")
    return "\n".join(lines)


# --------------------------------------------------------------------------- the machine


def _cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (empty where there is none)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _commit() -> str:
    """The repository's current commit (short), or empty outside a git checkout."""
    try:
        out = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def machine() -> dict[str, Any]:
    """What the figures were measured on: mode, cores and GPUs, CPU, torch and Horovod."""
    info = devices.detect()
    build = devices.horovod_build()
    return {
        "mode": info.mode, "cores": info.cores, "gpus": info.gpus, "gpu_names": list(info.gpu_names),
        "cpu": _cpu_model(), "torch": info.torch_version,
        "horovod": build["version"] if build["installed"] else "not installed",
        "horovod_build": build, "python": platform.python_version(), "platform": platform.platform(),
        "load_average": list(os.getloadavg()), "description": devices.describe(info=info), "commit": _commit(),
    }


def machine_markdown(m: dict[str, Any]) -> str:
    """The machine as a few markdown lines, for the top of the results."""
    hw = f"{m['gpus']} GPU(s) ({', '.join(m['gpu_names'])})" if m["mode"] == "gpu" else "no GPU"
    ops = [k for k in ("gloo", "nccl", "mpi") if m["horovod_build"].get(k)]
    horovod = f"Horovod {m['horovod']} ({', '.join(ops) or 'no operations'})" if ops else f"Horovod {m['horovod']}"
    load = " / ".join(f"{x:.2f}" for x in m["load_average"])
    return "\n".join([
        f"- **Machine**: {m['mode'].upper()} mode, {m['cores']} CPU cores ({m['cpu'] or 'unknown CPU'}), {hw}",
        f"- **Software**: torch {m['torch']}, {horovod}, Python {m['python']}, {m['platform']}",
        f"- **Load average at the start** (1/5/15 min): {load}" + (f"; commit {m['commit']}" if m["commit"] else ""),
        f"- {m['description']}",
    ])


def report_markdown(report: dict[str, Any], sections: Sequence[Section]) -> str:
    """The whole results file: what was run, on what machine, then one table per section."""
    kind = "quick parameters (--quick)" if report["quick"] else "default parameters"
    head = [
        "# Benchmark results", "",
        f"`{report['command']}`, {kind}, started {report['started']}, took {fmt(report['duration_s'], 's')}.",
        "Each figure: median over n repeats with its min\u2013max spread; comparisons measured side by side, "
        "interleaved, in this one run. Targets are goals, not failures.", "",
        machine_markdown(report["machine"]), "",
    ]
    return "\n".join(head + [section_markdown(s) for s in sections])


def write_results(out: Path, report: dict[str, Any], sections: Sequence[Section]) -> tuple[Path, Path]:
    """Write ``out/results.json`` and ``out/results.md``; return their paths."""
    out.mkdir(parents=True, exist_ok=True)
    data = dict(report, sections=[s.to_dict() for s in sections])
    json_path, md_path = out / "results.json", out / "results.md"
    json_path.write_text(json.dumps(data, indent=2, allow_nan=False) + "\n")
    md_path.write_text(report_markdown(report, sections))
    return json_path, md_path


# --------------------------------------------------------------------------- progress


class Steps:
    """A tqdm bar over a section's measurements, and one printed line per measurement."""

    def __init__(self, section: str, total: int) -> None:
        self.section, self.total, self.done = section, total, 0
        self.bar = progress(total=total, desc=section, unit="step", leave=False)

    def starting(self, what: str) -> None:
        """Announce a long measurement (minutes) before it starts."""
        self.bar.write(f"[{self.section} {self.done + 1}/{self.total}] {what} ...")

    def finished(self, what: str) -> None:
        """Report a finished measurement."""
        self.done += 1
        self.bar.write(f"[{self.section} {self.done}/{self.total}] {what}")
        self.bar.update()

    def close(self) -> None:
        self.bar.close()


@contextmanager
def steps(section: str, total: int) -> Iterator[Steps]:
    """A :class:`Steps` that closes its bar however the section ends."""
    s = Steps(section, total)
    try:
        yield s
    finally:
        s.close()


# --------------------------------------------------------------------------- 1. input pipeline


def decode_files(paths: Sequence[str]) -> int:
    """Read and decode each file with Pillow, nothing else (the bound's work, also in a pool)."""
    from multigpu import data

    for path in paths:
        with open(path, "rb") as f:
            data.decode(f.read())
    return len(paths)


class DecodeBound:
    """Read + decode ``paths`` as fast as Pillow can in ``processes`` processes (0: this one).

    A context manager: the pool starts on entry, so its start-up is never timed (as with a
    loader's persistent workers). Each process decodes an equal share of the files.
    """

    def __init__(self, paths: Sequence[str], processes: int) -> None:
        self.paths, self.processes = list(paths), processes
        self.pool: Any = None

    def __enter__(self) -> DecodeBound:
        if self.processes > 0:
            self.pool = multiprocessing.get_context("spawn").Pool(self.processes)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.pool is not None:
            self.pool.terminate()
            self.pool.join()

    def images_per_s(self) -> float:
        """Read and decode every file once; images per second over all processes."""
        t0 = time.perf_counter()
        if self.pool is None:
            n = decode_files(self.paths)
        else:
            n = sum(self.pool.map(decode_files, [self.paths[i :: self.processes] for i in range(self.processes)]))
        return n / (time.perf_counter() - t0)


def bench_pipeline(plan: Plan, deadline: float) -> Section:
    """Section 1: the default input pipeline against the read + decode bound, interleaved."""
    from multigpu import data, profiling
    from multigpu import training

    section = Section("pipeline", "Input pipeline: JPEG read + decode + augment vs read + decode alone")
    root = data.ensure_dataset()
    dataset = data.JPEGFolder(root, data.train_transform(training.REFERENCE.image_size), split="train")
    loader = data.make_loader(dataset, training.REFERENCE.batch_size)  # every other setting at its default
    warmup = 1
    batches = itertools.islice(iter(loader.batch_sampler), warmup, warmup + plan.pipeline_batches)
    paths = [dataset.samples[i][0] for batch in batches for i in batch]  # exactly the files a timed run loads
    workers = loader.num_workers
    section.notes += [
        f"`data.make_loader` defaults: batch size {loader.batch_size} (the reference), {workers} loader worker "
        f"process(es); {len(paths)} images of the generated set per run after {warmup} warm-up batch.",
        f"Bound: the same files read and decoded by Pillow in a tight loop in "
        f"{f'{workers} processes' if workers else 'the main process'} (as many as the loader uses), no augmentation.",
        "One untimed round of each first (page cache, start-up).",
    ]
    rates: dict[str, list[float]] = {"loader": [], "bound": []}
    order = interleave(list(rates), plan.pipeline_repeats)
    with DecodeBound(paths, workers) as bound, steps("pipeline", len(order)) as log:
        measure: dict[str, Callable[[], float]] = {
            "loader": lambda: profiling.loader_images_per_s(loader, batches=plan.pipeline_batches, warmup=warmup),
            "bound": bound.images_per_s,
        }
        for run in measure.values():
            run()
        for r, name in order:
            rates[name].append(measure[name]())
            log.finished(f"{name}, repeat {r + 1}/{plan.pipeline_repeats}: {fmt(rates[name][-1], 'images/s')}")
    section.figures = [
        Figure("read + decode + augment (default DataLoader)", "images/s", rates["loader"]),
        Figure("read + decode bound (Pillow alone)", "images/s", rates["bound"]),
        Figure("pipeline / bound", "ratio", [a / b for a, b in zip(rates["loader"], rates["bound"])], Target(">=", 0.9)),
    ]
    return section


# --------------------------------------------------------------------------- 2. scaling


def _horovod_allreduce_times(numel: int, warmup: int, reps: int) -> list[float]:
    """Seconds of each of ``reps`` timed ``hvd.allreduce_`` calls (run under horovodrun)."""
    import horovod.torch as hvd
    import torch

    hvd.init()
    tensor = torch.ones(numel)
    times = []
    for i in range(warmup + reps):
        t0 = time.perf_counter()
        hvd.allreduce_(tensor, op=hvd.Sum, name="bench.allreduce")
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


def _paired(a: Sequence[float], b: Sequence[float], scale: float = 1.0) -> list[float]:
    """Ratios of samples measured next to each other: ``a[r] / (scale * b[r])``."""
    return [x / (scale * y) for x, y in zip(a, b)]


def bench_scaling(plan: Plan, deadline: float) -> Section:
    """Section 2: Horovod vs DDP training throughput on 1..N workers, Horovod vs Gloo all-reduce."""
    import torch

    from multigpu import hvdtools, launch, models, run_records

    section = Section("scaling", "Scaling: Horovod vs DDP training throughput, Horovod vs Gloo all-reduce")
    launchers = {"Horovod": ("horovodrun", hvdtools.REFERENCE_MODULE), "DDP": ("torchrun", hvdtools.DDP_MODULE)}
    args = ["--synthetic", str(plan.synthetic_images), "--epochs", str(plan.epochs), "--quiet"]
    info = devices.detect()
    nbytes = models.gradient_bytes(models.build_model("alexnet_small"))
    numel = nbytes // torch.float32.itemsize
    section.notes += [
        f"Training: `{hvdtools.REFERENCE_MODULE}` under horovodrun and `{hvdtools.DDP_MODULE}` under torchrun, "
        f"`{' '.join(args)}`: in-memory synthetic images, so the figures are compute + communication, no JPEG I/O. "
        "images/s of all workers together, the median over epochs of a run, warm-up steps excluded.",
        f"Efficiency = N-worker images/s / (ideal x 1-worker images/s of the same launcher, same repeat, "
        "run with `--threads 1`: one core's share); "
        f"ideal = `devices.ideal_factor(N)` = min(N, {info.devices}) here.",
        f"All-reduce: one float32 tensor of {nbytes / 1e6:.1f} MB (AlexNet-small's gradient), in place, sum; "
        f"{ALLREDUCE_WARMUP} untimed then {plan.allreduce_reps} timed per job, {plan.allreduce_rounds} job(s) per "
        "library and worker count, interleaved; samples are rank 0's. Both on CPU tensors, so both use Gloo "
        "underneath: the ratio is Horovod's own overhead.",
    ]
    train_order = interleave([(label, n) for n in plan.scaling_workers for label in launchers], plan.scaling_repeats)
    ar_order = interleave([(lib, n) for n in plan.allreduce_workers for lib in ("Horovod", "Gloo")],
                          plan.allreduce_rounds)
    rates: dict[tuple[str, int], list[float]] = {key: [] for _, key in train_order}
    op_times: dict[tuple[str, int], list[float]] = {key: [] for _, key in ar_order}
    round_medians: dict[tuple[str, int], list[float]] = {key: [] for _, key in ar_order}
    with tempfile.TemporaryDirectory(prefix="multigpu-bench-") as tmp, \
            steps("scaling", len(train_order) + len(ar_order)) as log:
        for r, (label, n) in train_order:
            launcher, module = launchers[label]
            t0 = time.perf_counter()
            one_thread = ["--threads", "1"] if n == 1 else []  # the ideal's unit: one core's share
            run = hvdtools.run_script(n, [*args, *one_thread], out=Path(tmp) / f"{label}-{n}", module=module,
                                      launcher=launcher, timeout=300, echo=False)
            rates[label, n].append(run_records.throughput(run))
            log.finished(f"{label}, {n} worker(s), repeat {r + 1}/{plan.scaling_repeats}: "
                         f"{fmt(rates[label, n][-1], 'images/s')} ({time.perf_counter() - t0:.0f} s)")
        for r, (lib, n) in ar_order:
            job_args = (numel, ALLREDUCE_WARMUP, plan.allreduce_reps)
            if lib == "Horovod":
                values = launch.run_horovod(_horovod_allreduce_times, n, args=job_args, timeout=300, echo=False)
            else:
                values = launch.run(_gloo_allreduce_times, n, args=job_args, backend="gloo", timeout=300, echo=False)
            op_times[lib, n] += [1000 * t for t in values[0]]
            round_medians[lib, n].append(statistics.median(values[0]))
            log.finished(f"{lib} all-reduce, {n} workers, round {r + 1}/{plan.allreduce_rounds}: "
                         f"{fmt(1000 * round_medians[lib, n][-1], 'ms')} (median of {len(values[0])})")

    for n in plan.scaling_workers:
        for label in launchers:
            section.figures.append(Figure(f"{label}, {n} worker(s)", "images/s", rates[label, n]))
    for n in plan.scaling_workers:
        if n == 1:
            continue
        ideal = devices.ideal_factor(n, info)
        for label in launchers:
            section.figures.append(Figure(
                f"{label} efficiency, {n} workers", "ratio", _paired(rates[label, n], rates[label, 1], ideal),
                Target(">=", 0.85 if n == 2 else 0.80) if label == "Horovod" else None,
            ))
        section.figures.append(Figure(f"Horovod / DDP images/s, {n} workers", "ratio",
                                      _paired(rates["Horovod", n], rates["DDP", n]), Target(">=", 1.0)))
    for n in plan.allreduce_workers:
        section.figures += [
            Figure(f"Horovod all-reduce, {n} workers", "ms", op_times["Horovod", n]),
            Figure(f"raw Gloo all-reduce, {n} workers", "ms", op_times["Gloo", n]),
            Figure(f"Horovod / Gloo all-reduce time, {n} workers", "ratio",
                   _paired(round_medians["Horovod", n], round_medians["Gloo", n]), Target("<=", 1.10), note="per job pair; lower is better"),
        ]
    return section


#: Horovod's CPU-mode levers: label -> environment of the run (on top of the course's defaults:
#: patient waits and pinned workers). ``bench_levers`` measures each beside the defaults, torch
#: DDP and one one-thread worker, interleaved; the README's lever table comes from it.
LEVERS: dict[str, dict[str, str]] = {
    "course default (patient waits, pinned)": {},
    "busy wait (Horovod's own)": {"MULTIGPU_HOROVOD_SPIN": "1"},
    "not pinned": {"MULTIGPU_PIN": "0"},
    "HOROVOD_CYCLE_TIME=5 (ms)": {"HOROVOD_CYCLE_TIME": "5"},
    "HOROVOD_FUSION_THRESHOLD=4 MB": {"HOROVOD_FUSION_THRESHOLD": str(4 * 2**20)},
    "HOROVOD_FUSION_THRESHOLD=0 (no fusion)": {"HOROVOD_FUSION_THRESHOLD": "0"},
    "HOROVOD_CACHE_CAPACITY=0 (no response cache)": {"HOROVOD_CACHE_CAPACITY": "0"},
}
#: Worker counts the levers are measured at.
LEVER_WORKERS: tuple[int, ...] = (2, 4)
#: The ceiling of 2 workers on 2 cores: two one-thread trainings at once, one per core, with no
#: communication at all (they share memory bandwidth, caches and the chip's clock).
CONCURRENT = "two independent one-thread workers at once (no communication)"


def _concurrent_images_per_s(args: Sequence[str], cores: Sequence[int], tmp: Path) -> float:
    """Images/s of ``len(cores)`` one-worker runs of the course's script started together, each
    pinned to its own core, summed: what the cores deliver when nothing is communicated."""
    from multigpu import hvdtools, launch, run_records

    procs, outs = [], []
    for i, core in enumerate(cores):
        out = tmp / f"concurrent-{i}"
        out.mkdir(parents=True, exist_ok=True)
        outs.append(out)
        procs.append(subprocess.Popen(
            [sys.executable, "-m", hvdtools.REFERENCE_MODULE, *args, "--record", "--out", str(out)],
            env=launch.worker_env(), stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
            preexec_fn=lambda core=core: os.sched_setaffinity(0, {core})))
    try:
        codes = [p.wait(timeout=300) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    if any(codes):
        raise RuntimeError(f"a concurrent one-worker run failed (exit codes {codes})")
    return sum(run_records.throughput(run_records.read_records(out, 1)) for out in outs)


def bench_levers(plan: Plan, deadline: float) -> Section:
    """Section 3: what each Horovod lever does on this machine, against the same-run ideal and DDP.

    Every run is the course's script on in-memory synthetic images (compute + communication);
    each repeat runs one one-thread worker (the ideal's unit), torch DDP (pinned and not) and
    every lever of :data:`LEVERS` at each of :data:`LEVER_WORKERS`, in one interleaved order.
    """
    from multigpu import hvdtools, run_records

    section = Section("levers", "Horovod's CPU levers, one at a time, against the ideal and torch DDP")
    args = ["--synthetic", str(plan.synthetic_images), "--epochs", str(plan.epochs), "--quiet"]
    runs: list[tuple[str, str, int, dict[str, str]]] = [("one worker, one thread", "horovodrun", 1, {})]
    for n in LEVER_WORKERS:
        runs += [("DDP (pinned)", "torchrun", n, {}), ("DDP, not pinned", "torchrun", n, {"MULTIGPU_PIN": "0"})]
        runs += [(f"Horovod, {label}", "horovodrun", n, env) for label, env in LEVERS.items()]
    cores = sorted(os.sched_getaffinity(0))[:2]
    if len(cores) == 2:  # the machine's own ceiling: two workers that never communicate
        runs.append((CONCURRENT, "two processes", 2, {}))
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
        section.figures.append(Figure(f"{CONCURRENT}: x ideal", "ratio", _paired(rates[CONCURRENT, 2], one, 2),
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
            section.figures.append(Figure(f"{label}, {n} workers: x ideal", "ratio", _paired(values, one, ideal), target))
            if label.startswith("Horovod"):
                section.figures.append(Figure(f"{label}, {n} workers: / DDP", "ratio", _paired(values, ddp),
                                              Target(">=", 1.0) if target else None))
    return section


# --------------------------------------------------------------------------- 3. the course


def solution_notebooks(repo: Path = REPO) -> list[Path]:
    """Every notebook of the course: the labs, then the assessment."""
    return [p for folder in layout.ASSIGNMENTS for p in sorted((repo / layout.SOLUTIONS / folder).glob("*.ipynb"))]


@contextmanager
def _environ(**values: str) -> Iterator[None]:
    """Set environment variables for the duration (the notebook kernels inherit them)."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run_notebook(path: Path, *, quick: bool) -> float:
    """Run a notebook top to bottom with papermill in a scratch copy of its folder; its wall time.

    Like ``tests/test_notebooks.py``: files the notebook writes never land in the repository.
    A cell that runs longer than :data:`CELL_TIMEOUT_S` raises.
    """
    import papermill

    with tempfile.TemporaryDirectory(prefix="multigpu-bench-nb-") as tmp:
        work = Path(tmp) / path.parent.name
        shutil.copytree(path.parent, work, ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
        with _environ(MULTIGPU_QUICK="1" if quick else "0"):
            t0 = time.perf_counter()
            papermill.execute_notebook(
                str(work / path.name), str(Path(tmp) / f"executed-{path.name}"), cwd=str(work),
                kernel_name="python3", progress_bar=False, request_save_on_cell_execute=False,
                execution_timeout=CELL_TIMEOUT_S,
            )
            return time.perf_counter() - t0


def _first_line(exc: BaseException) -> str:
    """``Type: first line of the message``, for a table cell."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def bench_course(plan: Plan, deadline: float) -> Section:
    """Section 3: every solution notebook top to bottom, one run each, and their sum."""
    section = Section("course", "The course: every solution notebook top to bottom")
    params = "quick parameters" if plan.quick else ""
    notebooks = solution_notebooks()
    if not notebooks:
        raise FileNotFoundError(f"no notebooks under {REPO / 'solutions'}")
    section.notes += [
        f"papermill, each notebook in a scratch copy of its folder, MULTIGPU_QUICK={int(plan.quick)} "
        f"({'QUICK parameters: not the course a learner runs' if plan.quick else 'default parameters'}); "
        "one run each (n=1). The assessment notebook runs the grader.",
    ]
    if not any(p.parent.name == layout.ASSESSMENT for p in notebooks):
        section.notes.append("solutions/assessments/ holds no notebook yet: the course total covers the labs only.")
    failed = []
    with steps("course", len(notebooks)) as log:
        for path in notebooks:
            name = str(path.relative_to(REPO / layout.SOLUTIONS))
            log.starting(f"{name} ({params or 'default parameters'})")
            figure = Figure(name, "s", target=Target("<", 6 * 60), note=params)
            try:
                figure.samples.append(run_notebook(path, quick=plan.quick))
                log.finished(f"{name}: {fmt(figure.samples[0], 's')}")
            except Exception as exc:  # noqa: BLE001 - a failing notebook is reported, the others still run
                figure.error = _first_line(exc)
                failed.append(name)
                log.finished(f"{name}: FAILED ({figure.error})")
            section.figures.append(figure)
    whole = Figure("whole course end to end", "s", target=Target("<", 15 * 60), note=params)
    if failed:
        whole.error = f"incomplete: {', '.join(failed)} failed"
        section.status, section.error = "error", whole.error
    else:
        whole.samples.append(sum(f.samples[0] for f in section.figures))
    section.figures.append(whole)
    return section


# --------------------------------------------------------------------------- 4. grading


def bench_grading(plan: Plan, deadline: float) -> Section:
    """Section 4: grading the reference solution, as often as ``plan`` and the ``deadline`` allow."""
    section = Section("grading", "Grading: the reference assessment solution, end to end")
    from multigpu.grading import grader, rules

    params = "quick parameters" if plan.quick else ""
    times: list[float] = []
    verdicts: list[str] = []
    # rules.settings() and the grader read MULTIGPU_QUICK: pin it to the parameters asked for
    with _environ(MULTIGPU_QUICK="1" if plan.quick else "0"), steps("grading", plan.grading_repeats) as log:
        settings = rules.QUICK if plan.quick else rules.settings()
        for r, _ in interleave(["reference"], plan.grading_repeats):
            if times and time.monotonic() + times[-1] > deadline:
                section.notes.append(f"stopped after {len(times)} grading(s): another would pass the "
                                     f"{fmt(plan.budget_s, 's')} budget of the run.")
                break
            log.starting(f"grading the reference solution ({settings.profile} profile), "
                         f"repeat {r + 1}/{plan.grading_repeats}")
            t0 = time.perf_counter()
            result = grader.grade(grader.REFERENCE, settings, echo=False)
            times.append(time.perf_counter() - t0)
            verdicts.append(f"{'passed' if result.passed else 'FAILED'} (score {result.score})")
            log.finished(f"grade: {fmt(times[-1], 's')}, {verdicts[-1]}")
    section.notes += [
        f"`grader.grade(grader.REFERENCE, rules.{'QUICK' if plan.quick else 'settings()'})`, "
        f"profile `{settings.profile}`; verdicts: {', '.join(verdicts)}.",
        f"Workshop: {WORKSHOP_LEARNERS} x the grading time, graded one after another on this machine.",
    ]
    section.figures = [
        Figure("grade one submission", "s", times, Target("<=", 3 * 60), note=params),
        Figure(f"{WORKSHOP_LEARNERS}-learner workshop, sequential", "s", [WORKSHOP_LEARNERS * t for t in times],
               Target("<=", 90 * 60), note=params),
    ]
    return section


# --------------------------------------------------------------------------- the run

#: Each section gets the plan and the run's deadline (``time.monotonic()`` seconds) and returns its
#: figures; an exception is recorded as the section's error.
SECTIONS: dict[str, Callable[[Plan, float], Section]] = {
    "pipeline": bench_pipeline,
    "scaling": bench_scaling,
    "levers": bench_levers,
    "course": bench_course,
    "grading": bench_grading,
}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="multigpu bench", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="few repeats, quick notebook parameters (~2-3 minutes)")
    p.add_argument("--only", nargs="+", choices=SECTION_NAMES, metavar="SECTION",
                   help=f"run only these sections ({', '.join(SECTION_NAMES)})")
    p.add_argument("--out", type=Path, default=Path("bench"), help="folder for results.json and results.md")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the selected sections; 1 when a measurement crashed, 0 otherwise (targets met or not)."""
    args = parse_args(argv)
    plan = QUICK if args.quick else DEFAULT
    names = [n for n in SECTION_NAMES if not args.only or n in args.only]
    start = time.monotonic()
    deadline = start + plan.budget_s
    report: dict[str, Any] = {
        "command": " ".join(["multigpu bench", *(argv if argv is not None else sys.argv[1:])]),
        "quick": plan.quick, "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "duration_s": 0.0, "machine": machine(), "plan": asdict(plan),
    }
    print(machine_markdown(report["machine"]), flush=True)
    sections: list[Section] = []
    for name in names:
        print(f"\n== {name} ==", flush=True)
        t0 = time.monotonic()
        try:
            section = SECTIONS[name](plan, deadline)
        except Exception as exc:  # noqa: BLE001 - one crashed section must not lose the others' figures
            traceback.print_exc()
            section = Section(name, name, status="error", error=_first_line(exc))
        section.seconds = time.monotonic() - t0
        sections.append(section)
        report["duration_s"] = time.monotonic() - start
        json_path, md_path = write_results(args.out, report, sections)
        print(section_markdown(section), flush=True)
    print(f"results: {json_path} and {md_path} ({fmt(report['duration_s'], 's')})")
    errors = [s.name for s in sections if s.status == "error"]
    if errors:
        print(f"measurement(s) crashed in: {', '.join(errors)}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
