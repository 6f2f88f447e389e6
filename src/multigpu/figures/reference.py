"""The reference run's figures, shipped with the course and printed beside the learner's own.

Prose in the labs states only what holds on any machine. A figure that depends on the machine
(a speed-up, an accuracy after a short run, a scaling efficiency) is printed by a code cell: the
learner's own value, the reference run's value with its machine and date, and a sentence
computed from both. The reference figures live in ``reference_runs/<notebook stem>.json``::

    {"machine": "2-core CPU (no GPU), torch 2.13.0+cpu",
     "date": "2026-11-25",
     "command": "make course",
     "figures": {"scaling_efficiency_2": {"value": 0.89, "unit": "x ideal",
                                          "what": "2 workers' throughput against the ideal"}}}

``beside("03-horovod", "scaling_efficiency_2", 0.84)`` then says
"your run: 0.84 x ideal; the reference run (2-core CPU ..., 2026-11-25): 0.89 x ideal (yours is
0.94 x the reference)". Update a notebook's file after a reference run with ``record(...)``.

GPU reference runs (``make gpu-check RECORD=1`` on a GPU machine) live beside the CPU ones, in
``reference_runs/gpu/<notebook stem>.json``, the device's name in their machine. A notebook in GPU
mode (``devices.detect()``: CUDA seen and not forced off) prints the GPU figure where one was
recorded and the CPU one otherwise; each sentence names the machine its reference ran on.
"""

from __future__ import annotations

import json
import os
import platform
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import resources
from pathlib import Path

FOLDER = "reference_runs"
#: The GPU reference runs' folder inside :data:`FOLDER`.
GPU_FOLDER = "gpu"

#: Set (to the command that runs the notebooks) to make :func:`show` record the run as the new
#: reference instead of comparing with it: ``multigpu bench --only course --record-reference``.
RECORD_ENV = "MULTIGPU_RECORD_REFERENCE"


@dataclass(frozen=True)
class Figure:
    """One figure of the reference run: its value, unit, what it measures and where it was measured."""

    value: float
    unit: str
    what: str
    machine: str
    date: str
    command: str


def _path(notebook: str) -> Path:
    return Path(str(resources.files("multigpu.figures").joinpath(FOLDER, f"{notebook}.json")))


def gpu_path(notebook: str) -> Path:
    """Where the GPU reference run of ``notebook`` lives (beside the CPU one's file)."""
    return _path(notebook).parent / GPU_FOLDER / f"{notebook}.json"


def current_mode() -> str:
    """``"gpu"`` or ``"cpu"``: the mode this process's notebook runs in."""
    from multigpu.core import devices

    return devices.detect().mode


def load(notebook: str, mode: str | None = None) -> dict[str, Figure]:
    """Every reference figure of one notebook (by its file stem, e.g. ``"01-gd-vs-sgd"``): the CPU
    run's, each replaced by the GPU run's where ``mode`` (default: :func:`current_mode`) is GPU
    and a GPU run recorded it."""
    path = _path(notebook)
    if not path.exists():
        raise FileNotFoundError(f"no reference run for {notebook!r}: {path} is missing")
    figures = _read(path)
    if (mode or current_mode()) == "gpu" and gpu_path(notebook).exists():
        figures.update(_read(gpu_path(notebook)))
    return figures


def _read(path: Path) -> dict[str, Figure]:
    raw = json.loads(path.read_text())
    return {
        key: Figure(
            value=float(entry["value"]),
            unit=entry.get("unit", ""),
            what=entry.get("what", key),
            machine=raw["machine"],
            date=raw["date"],
            command=raw.get("command", ""),
        )
        for key, entry in raw["figures"].items()
    }


def figure(notebook: str, key: str) -> Figure:
    """One reference figure; a clear error names the keys that exist."""
    figures = load(notebook)
    if key not in figures:
        raise KeyError(f"{notebook} has no reference figure {key!r}; it has {sorted(figures)}")
    return figures[key]


def _fmt(value: float, fmt: str, unit: str) -> str:
    text = format(value, fmt)
    return f"{text} {unit}".rstrip() if unit and not unit.startswith("%") else text + unit


def beside(notebook: str, key: str, yours: float, fmt: str = ".2f") -> str:
    """The learner's figure beside the reference run's, and their ratio, as one sentence."""
    ref = figure(notebook, key)
    sentence = (
        f"{ref.what}: your run {_fmt(yours, fmt, ref.unit)}; the reference run "
        f"({ref.machine}, {ref.date}) {_fmt(ref.value, fmt, ref.unit)}"
    )
    if ref.value != 0 and yours == yours:  # not NaN
        sentence += f" (yours is {yours / ref.value:.2f} x the reference)"
    return sentence


def show(notebook: str, key: str, yours: float, fmt: str = ".2f") -> None:
    """Print :func:`beside` (the form a notebook cell uses); in a reference run (``RECORD_ENV``
    set), record ``yours`` as the reference figure first."""
    command = os.environ.get(RECORD_ENV)
    if command:
        ref = figure(notebook, key)
        record(notebook, key, float(yours), unit=ref.unit, what=ref.what, machine=this_machine(),
               date=datetime.now(timezone.utc).strftime("%Y-%m-%d"), command=command, mode=current_mode())
    print(beside(notebook, key, yours, fmt))


def this_machine() -> str:
    """The machine a reference run ran on, in the words the reference files use."""
    import torch

    if torch.cuda.is_available():
        gpus = f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
    else:
        gpus = "no GPU"
    return f"{os.cpu_count()}-core {platform.machine()} CPU ({gpus}), torch {torch.__version__}"


def record(notebook: str, key: str, value: float, *, unit: str, what: str, machine: str, date: str,
           command: str, folder: Path | None = None, mode: str = "cpu") -> Path:
    """Write (or replace) one reference figure; the machine, date and command apply to the file
    (the GPU run's file where ``mode`` is ``"gpu"``)."""
    path = (folder / f"{notebook}.json") if folder else gpu_path(notebook) if mode == "gpu" else _path(notebook)
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = json.loads(path.read_text()) if path.exists() else {"figures": {}}
    raw.update(machine=machine, date=date, command=command)
    raw["figures"][key] = {"value": value, "unit": unit, "what": what}
    path.write_text(json.dumps(raw, indent=2, sort_keys=True) + "\n")
    return path
