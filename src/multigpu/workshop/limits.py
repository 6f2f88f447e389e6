"""A fair share of the box per learner, and cores of its own for the grading queue.

The box's cores are split once (:func:`split_cores`): the last ``reserved`` cores run the grading
queue, every learner server runs on the others, so a throughput verdict is never measured
against the room's own load. Each learner server then gets its own control group
(:func:`confine`): at most ``cpu_limit`` cores' worth of time (CFS quota), at most ``mem_limit``
bytes of memory, and only the learners' cores (cpuset, which a learner cannot widen the way they
could widen a plain CPU affinity). The kernel's cgroups are used where this machine lets root
write them: version 2 (one unified tree) or version 1 (one tree per controller). Where neither
is writable (a container without them) the best left is the CPU affinity alone, which keeps the
grading cores free but bounds neither time nor memory: :func:`confine` says which it applied.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")
#: The folder of the workshop's groups inside each hierarchy.
PARENT = "multigpu"
PERIOD_US = 100_000


def split_cores(cores: list[int] | None = None, reserved: int | None = None) -> tuple[list[int], list[int]]:
    """``(learner cores, grading cores)``: by default a core per worker of the assessment (4) for
    grading, at most a quarter of the box and at least one; ``reserved=0`` (and a single-core box)
    reserves none, and grading then shares the learners' cores."""
    from multigpu.grading.rules import WORKERS

    cores = sorted(cores if cores is not None else os.sched_getaffinity(0))
    if reserved is None:
        reserved = max(1, min(WORKERS, len(cores) // 4)) if len(cores) > 1 else 0
    if reserved >= len(cores):
        raise ValueError(f"cannot reserve {reserved} of {len(cores)} cores for grading: learners need at least one")
    return (cores[:len(cores) - reserved], cores[len(cores) - reserved:]) if reserved else (cores, cores)


def cpulist(cores: list[int]) -> str:
    return ",".join(str(c) for c in sorted(cores))


def version() -> int | None:
    """2 or 1 where root can make control groups here, else None."""
    if (CGROUP / "cgroup.controllers").is_file():
        return 2 if os.access(CGROUP, os.W_OK) else None
    if all(os.access(CGROUP / c, os.W_OK) for c in ("cpu", "memory", "cpuset")):
        return 1
    return None


@dataclass
class Applied:
    """What :func:`confine` did, in words for the log and the README's claims."""

    cgroup: str | None = None  # the control group's path, or None
    limits: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)

    def describe(self) -> str:
        got = "; ".join(self.limits) or "nothing"
        return got + (f" (not applied: {'; '.join(self.missing)})" if self.missing else "")


def _write(path: Path, value: str) -> None:
    path.write_text(value)


def _v1_group(controller: str, name: str) -> Path:
    parent = CGROUP / controller / PARENT
    group = parent / name
    for folder in (parent, group):
        folder.mkdir(exist_ok=True)
        if controller == "cpuset":  # a cpuset group has no cores or memory nodes until given some
            up = folder.parent
            for knob in ("cpuset.mems", "cpuset.cpus"):
                if not (folder / knob).read_text().strip():
                    _write(folder / knob, (up / knob).read_text().strip())
    return group


def confine(name: str, pid: int, *, cores: list[int], cpu_limit: float | None = None,
            mem_limit: int | None = None) -> Applied:
    """Put process ``pid`` (and so every process it starts) in the control group ``multigpu/name``
    with the limits given; CPU affinity to ``cores`` in every case. Never raises for a limit
    the machine lacks: the result lists what was applied and what was not."""
    applied = Applied()
    v = version()
    try:
        if v == 2:
            parent = CGROUP / PARENT
            parent.mkdir(exist_ok=True)
            wanted = [c for c in ("cpu", "memory", "cpuset") if c in (CGROUP / "cgroup.controllers").read_text().split()]
            for folder in (CGROUP, parent):
                _write(folder / "cgroup.subtree_control", " ".join(f"+{c}" for c in wanted))
            group = parent / name
            group.mkdir(exist_ok=True)
            if "cpuset" in wanted:
                _write(group / "cpuset.cpus", cpulist(cores))
                applied.limits.append(f"cpuset {cpulist(cores)}")
            if cpu_limit and "cpu" in wanted:
                _write(group / "cpu.max", f"{int(cpu_limit * PERIOD_US)} {PERIOD_US}")
                applied.limits.append(f"cpu {cpu_limit:g} cores")
            if mem_limit and "memory" in wanted:
                _write(group / "memory.max", str(mem_limit))
                applied.limits.append(f"memory {mem_limit / 2**30:.1f} GiB")
            _write(group / "cgroup.procs", str(pid))
            applied.cgroup = str(group)
        elif v == 1:
            g = _v1_group("cpuset", name)
            _write(g / "cpuset.cpus", cpulist(cores))
            _write(g / "cgroup.procs", str(pid))
            applied.limits.append(f"cpuset {cpulist(cores)}")
            if cpu_limit:
                g = _v1_group("cpu", name)
                _write(g / "cpu.cfs_period_us", str(PERIOD_US))
                _write(g / "cpu.cfs_quota_us", str(int(cpu_limit * PERIOD_US)))
                _write(g / "cgroup.procs", str(pid))
                applied.limits.append(f"cpu {cpu_limit:g} cores")
            if mem_limit:
                g = _v1_group("memory", name)
                _write(g / "memory.limit_in_bytes", str(mem_limit))
                _write(g / "cgroup.procs", str(pid))
                applied.limits.append(f"memory {mem_limit / 2**30:.1f} GiB")
            applied.cgroup = f"{PARENT}/{name} (cgroup v1)"
        else:
            applied.missing.append("no writable cgroup hierarchy on this machine: CPU time and memory are not bounded")
    except OSError as e:
        applied.missing.append(f"cgroups refused ({e}): CPU time and memory are not bounded")
    os.sched_setaffinity(pid, cores)
    applied.limits.append(f"affinity {cpulist(cores)}")
    return applied


def release(name: str) -> None:
    """Remove the (empty) control group ``multigpu/name`` once its server has stopped."""
    folders = [CGROUP / PARENT / name] if version() == 2 else [CGROUP / c / PARENT / name for c in ("cpu", "memory", "cpuset")]
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            pass  # absent, or a process is still in it: the next confine reuses it


def set_cores(name: str, pid: int, cores: list[int]) -> None:
    """Move the control group ``multigpu/name`` (every process in it) to ``cores``; where no
    cgroup is writable, the CPU affinity of ``pid`` and its descendants. A starting server gets
    wider cores than the learners' (``spawnqueue``) and is narrowed once it answers."""
    import psutil

    v = version()
    folder = CGROUP / PARENT / name if v == 2 else CGROUP / "cpuset" / PARENT / name
    if v and (folder / "cpuset.cpus").exists():
        try:
            _write(folder / "cpuset.cpus", cpulist(cores))
        except OSError:
            pass
    try:
        procs = [psutil.Process(pid)]
        procs += procs[0].children(recursive=True)
    except psutil.NoSuchProcess:
        return
    for proc in procs:
        try:
            proc.cpu_affinity(cores)
        except psutil.Error:
            pass
