"""The bench's reporting framework: plans, figures with spreads and targets, sections, the
machine, progress lines, and results.json / results.md."""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from multigpu.core import devices, layout
from multigpu.core.notebook import progress

V = TypeVar("V")

REPO = layout.course_root()
SECTION_NAMES: tuple[str, ...] = ("pipeline", "warm", "scaling", "levers", "links", "sharding", "course", "grading")
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
    #: when set (the command, for the files), the course section records its run as the reference
    record_reference: str = ""


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
    unit: str  #: ``"s"``, ``"ms"``, ``"us"``, ``"images/s"`` or ``"ratio"``
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
    elif unit in ("ms", "us"):
        text, suffix = f"{x:.1f}", unit
    elif unit == "images/s":
        text, suffix = f"{x:,.0f}", "images/s"
    else:
        text, suffix = f"{x:.2f}", ""
    return f"{text} {suffix}" if with_unit and suffix else text


def range_text(s: Spread, unit: str) -> str:
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
    return f"| {name} | {fmt(s.median, f.unit)} | {range_text(s, f.unit)} | {s.n} | {target} | {verdict} |"


def section_markdown(section: Section) -> str:
    """A section as markdown: title, notes, and the table of its figures."""
    lines = [f"### {section.title}", ""]
    lines += [f"- {note}" for note in section.notes]
    if section.status in ("error", "skipped"):
        lines.append(f"- **{section.status}**: {section.error}")
    if section.notes or section.status in ("error", "skipped"):
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


@contextmanager
def environ(**values: str) -> Iterator[None]:
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


def first_line(exc: BaseException) -> str:
    """``Type: first line of the message``, for a table cell."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def paired(a: Sequence[float], b: Sequence[float], scale: float = 1.0) -> list[float]:
    """Ratios of samples measured next to each other: ``a[r] / (scale * b[r])``."""
    return [x / (scale * y) for x, y in zip(a, b)]
