"""How many learners one box holds: the CPU time each lab notebook uses at its default parameters.

``multigpu workshop measure-labs`` runs every lab notebook of ``solutions/`` top to bottom with
papermill, each in a scratch copy of its folder and in a control group of its own
(``multigpu/measure-<lab>``), and reads from that group what the whole process tree used: CPU
seconds (the kernel's own accounting, so close to independent of what else loads the box), the
wall time (which is not), the peak cores (the most CPU time per second over any sampling interval)
and the peak memory. Where no cgroup hierarchy is writable, the CPU seconds come from
``getrusage(RUSAGE_CHILDREN)`` (every descendant the run waited for) and peaks are not measured.

:func:`room` turns the CPU seconds into a room's needs at a stated pace: a learner spends
``minutes`` on a lab and runs its cells ``reruns`` times over in that time, so the lab costs
``reruns x CPU s / (60 x minutes)`` cores on average while they work on it.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from multigpu.workshop import limits

SAMPLE_S = 1.0


@dataclass
class LabUse:
    """What one notebook run used; ``peak_cores`` and ``peak_mem_gb`` are None without a cgroup."""

    notebook: str
    cpu_s: float
    wall_s: float
    peak_cores: float | None
    peak_mem_gb: float | None
    ok: bool
    error: str = ""


class Meter:
    """A control group for one run: CPU seconds so far, and peak memory at the end."""

    def __init__(self, name: str) -> None:
        self.version = limits.version()
        root = limits.CGROUP
        if self.version == 2:
            self.cpu = self.mem = root / limits.PARENT / name
            (root / limits.PARENT).mkdir(exist_ok=True)
            self.cpu.mkdir(exist_ok=True)
        elif self.version == 1:
            self.cpu = root / "cpuacct" / limits.PARENT / name
            self.mem = root / "memory" / limits.PARENT / name
            for folder in (self.cpu, self.mem):
                folder.mkdir(parents=True, exist_ok=True)
            (self.mem / "memory.max_usage_in_bytes").write_text("0")

    def join(self) -> None:
        """Move the calling process into the group (run in the child between fork and exec)."""
        for folder in {self.cpu, self.mem}:
            (folder / "cgroup.procs").write_text(str(os.getpid()))

    def cpu_s(self) -> float:
        if self.version == 2:
            stat = dict(line.split() for line in (self.cpu / "cpu.stat").read_text().splitlines())
            return int(stat["usage_usec"]) / 1e6
        return int((self.cpu / "cpuacct.usage").read_text()) / 1e9

    def peak_mem_gb(self) -> float | None:
        name = "memory.peak" if self.version == 2 else "memory.max_usage_in_bytes"
        path = self.mem / name
        return int(path.read_text()) / 2**30 if path.is_file() else None

    def remove(self) -> None:
        for folder in {self.cpu, self.mem}:
            try:
                folder.rmdir()
            except OSError:
                pass  # a straggler is still in it: the next run with this name reuses the group


def papermill_command(notebook: Path, out: Path) -> list[str]:
    code = ("import papermill, sys; papermill.execute_notebook(sys.argv[1], sys.argv[2], cwd=sys.argv[3], "
            "kernel_name='python3', progress_bar=False, request_save_on_cell_execute=False)")
    return [sys.executable, "-c", code, str(notebook), str(out), str(notebook.parent)]


def measure(notebook: Path, *, quick: bool = False, cores: list[int] | None = None) -> LabUse:
    """Run ``notebook`` once, in a scratch copy of its folder, and say what it used."""
    name = notebook.stem
    meter = Meter(f"measure-{os.getpid()}-{name}") if limits.version() else None
    env = {**os.environ, "MULTIGPU_QUICK": "1" if quick else "0"}
    with tempfile.TemporaryDirectory(prefix="multigpu-measure-") as tmp:
        work = Path(tmp) / notebook.parent.name
        shutil.copytree(notebook.parent, work, ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start_cpu = meter.cpu_s() if meter else 0.0

        def enter() -> None:
            if meter:
                meter.join()
            if cores:
                os.sched_setaffinity(0, cores)

        t0 = time.perf_counter()
        proc = subprocess.Popen(papermill_command(work / notebook.name, Path(tmp) / "out.ipynb"), env=env,
                                preexec_fn=enter, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        peak = [0.0]
        sampler = threading.Thread(target=sample_peak, args=(meter, proc, peak), daemon=True) if meter else None
        if sampler:
            sampler.start()
        _, err = proc.communicate()
        wall = time.perf_counter() - t0
        if sampler:
            sampler.join()
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if meter:
        cpu = meter.cpu_s() - start_cpu
        mem = meter.peak_mem_gb()
        meter.remove()
    else:
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        mem = None
    error = "" if proc.returncode == 0 else last_error(err)
    return LabUse(notebook.name, round(cpu, 1), round(wall, 1), round(peak[0], 2) if meter else None,
                  round(mem, 2) if mem is not None else None, proc.returncode == 0, error)


def last_error(stderr: str) -> str:
    """The line of a failed run's stderr that names its exception (papermill's, the cell's), else
    its last line: progress lines that the notebook printed come after the traceback."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    named = [line for line in lines if "Error" in line.split(":")[0] or "Exception" in line.split(":")[0]]
    return (named or lines or ["failed with no message"])[-1]


def sample_peak(meter: Meter, proc: subprocess.Popen[str], peak: list[float]) -> None:
    """Keep in ``peak[0]`` the most cores' worth of CPU time the group used over one interval."""
    last_t, last_cpu = time.perf_counter(), meter.cpu_s()
    while proc.poll() is None:
        time.sleep(SAMPLE_S)
        now, cpu = time.perf_counter(), meter.cpu_s()
        peak[0] = max(peak[0], (cpu - last_cpu) / (now - last_t))
        last_t, last_cpu = now, cpu


def room(uses: list[LabUse], minutes: dict[str, float], reruns: float, cores: int) -> dict[str, float]:
    """A room's needs at a pace: the average cores one learner keeps busy over the labs (their CPU
    seconds times ``reruns``, over the minutes spent on them), the learners ``cores`` hold at that
    average, and the peak one learner can ask for at a time (the most cores any lab used)."""
    spent = sum(minutes[u.notebook] for u in uses) * 60
    average = reruns * sum(u.cpu_s for u in uses) / spent
    peaks = [u.peak_cores for u in uses if u.peak_cores is not None]
    return {"average_cores_per_learner": round(average, 3), "learners_per_core": round(1 / average, 1),
            "learners_on_box": round(cores / average, 1), "peak_cores_per_learner": max(peaks) if peaks else 0.0}


def main(notebooks: list[Path], *, quick: bool, out: Path | None) -> int:
    uses = []
    for path in notebooks:
        use = measure(path, quick=quick)
        print(f"{use.notebook}: {use.cpu_s:.0f} CPU s, {use.wall_s:.0f} s wall, peak {use.peak_cores} cores, "
              f"peak memory {use.peak_mem_gb} GiB" + ("" if use.ok else f", FAILED: {use.error}"), flush=True)
        uses.append(use)
    if out:
        out.write_text(json.dumps({"quick": quick, "load": os.getloadavg(), "labs": [asdict(u) for u in uses]},
                                  indent=1) + "\n")
    return 0 if all(u.ok for u in uses) else 1
