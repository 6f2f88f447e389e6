"""A fair share of the box per learner, and cores of its own for the grading queue.

The box's cores are split once (:func:`split_cores`): the last ``reserved`` cores run the grading
queue, every learner server runs on the others, so a throughput verdict is never measured
against the room's own load. Each learner server then gets its own control group
(:func:`confine`): at most ``cpu_limit`` cores' worth of time (CFS quota), at most ``mem_limit``
bytes of memory, at most ``pids_limit`` processes and threads (a fork bomb stops there, not at the
box's last PID), and only the learners' cores (cpuset, which a learner cannot widen the way they
could widen a plain CPU affinity). The grading queue's jobs get groups of their own the same way.
The kernel's cgroups are used where this machine lets root write them: version 2 (one unified
tree) or version 1 (one tree per controller). Where neither is writable (a container without
them) the best left is the CPU affinity alone, which keeps the grading cores free but bounds
neither time, memory nor processes: :func:`confine` says which it applied. :func:`release` kills
whatever is left in a group, then removes it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")
#: The folder of the workshop's groups inside each hierarchy.
PARENT = "multigpu"
PERIOD_US = 100_000
#: A grading job's processes and threads at most, and an autograde step's memory (a lab notebook
#: needs what a learner server has: Lab 3 peaked at 2.9 GiB, docs/workshop.md).
GRADING_PIDS = 1024
GRADING_MEM_GB = 4.0
#: What a grading job needs besides the official run it watches (the grader, torch, a held-out
#: evaluation; not measured: an estimate, ``MULTIGPU_GRADING_JOB_MEM_GB`` replaces the total).
GRADER_MEM_GB = 2.0


def grading_limits() -> tuple[int, int]:
    """``(processes, memory bytes)`` of a grading (``MULTIGPU_GRADING_PIDS``, ``MULTIGPU_GRADING_MEM_GB``)."""
    pids = int(os.environ.get("MULTIGPU_GRADING_PIDS") or GRADING_PIDS)
    return pids, int(float(os.environ.get("MULTIGPU_GRADING_MEM_GB") or GRADING_MEM_GB) * 2**30)


def grading_job_memory() -> int:
    """A whole grading job's memory (bytes; ``MULTIGPU_GRADING_JOB_MEM_GB``): by default the official
    run's bound (``rules``: its processes' RSS) and :data:`GRADER_MEM_GB` for the grader's own. The
    control group counts what RSS does not: files a submission writes in the sandbox's ``/tmp``
    and ``/dev/shm`` (memory) and memory files it never maps, which would otherwise fill the box."""
    from multigpu.grading.rules import settings

    given = os.environ.get("MULTIGPU_GRADING_JOB_MEM_GB")
    return int(float(given) * 2**30) if given else settings().max_memory_bytes + int(GRADER_MEM_GB * 2**30)


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


#: One limit: its controller, the files that set it in cgroup v1 and in v2, its words for the log.
Knob = tuple[str, dict[str, str], dict[str, str], str]


def _knobs(cores: list[int], cpu_limit: float | None, mem_limit: int | None, pids_limit: int | None) -> list[Knob]:
    knobs: list[Knob] = [("cpuset", {"cpuset.cpus": cpulist(cores)}, {"cpuset.cpus": cpulist(cores)},
                          f"cpuset {cpulist(cores)}")]
    if cpu_limit:
        quota = str(int(cpu_limit * PERIOD_US))
        knobs.append(("cpu", {"cpu.cfs_period_us": str(PERIOD_US), "cpu.cfs_quota_us": quota},
                      {"cpu.max": f"{quota} {PERIOD_US}"}, f"cpu {cpu_limit:g} cores"))
    if mem_limit:
        knobs.append(("memory", {"memory.limit_in_bytes": str(mem_limit)}, {"memory.max": str(mem_limit)},
                      f"memory {mem_limit / 2**30:.1f} GiB"))
    if pids_limit:
        knobs.append(("pids", {"pids.max": str(pids_limit)}, {"pids.max": str(pids_limit)}, f"{pids_limit} processes"))
    return knobs


def confine(name: str, pid: int, *, cores: list[int], cpu_limit: float | None = None,
            mem_limit: int | None = None, pids_limit: int | None = None) -> Applied:
    """Put process ``pid`` (and so every process it starts) in the control group ``multigpu/name``
    with the limits given; CPU affinity to ``cores`` in every case. Never raises for a limit
    the machine lacks: the result lists what was applied and what was not."""
    applied = Applied()
    v = version()
    knobs = _knobs(cores, cpu_limit, mem_limit, pids_limit)
    try:
        if v == 2:
            _confine_v2(name, pid, knobs, applied)
        elif v == 1:
            _confine_v1(name, pid, knobs, applied)
        else:
            applied.missing.append("no writable cgroup hierarchy on this machine: CPU time, memory and processes "
                                   "are not bounded")
    except OSError as e:
        applied.missing.append(f"cgroups refused ({e}): CPU time, memory and processes are not bounded")
    os.sched_setaffinity(pid, cores)
    applied.limits.append(f"affinity {cpulist(cores)}")
    return applied


def _confine_v2(name: str, pid: int, knobs: list[Knob], applied: Applied) -> None:
    parent = CGROUP / PARENT
    parent.mkdir(exist_ok=True)
    available = (CGROUP / "cgroup.controllers").read_text().split()
    wanted = [c for c in ("cpu", "memory", "cpuset", "pids") if c in available]
    for folder in (CGROUP, parent):
        _write(folder / "cgroup.subtree_control", " ".join(f"+{c}" for c in wanted))
    group = parent / name
    group.mkdir(exist_ok=True)
    for controller, _v1, files, words in knobs:
        if controller not in wanted:
            applied.missing.append(f"no {controller} controller: {words}")
            continue
        for file, value in files.items():
            _write(group / file, value)
        applied.limits.append(words)
    _write(group / "cgroup.procs", str(pid))
    applied.cgroup = str(group)


def _confine_v1(name: str, pid: int, knobs: list[Knob], applied: Applied) -> None:
    for controller, files, _v2, words in knobs:
        if not os.access(CGROUP / controller, os.W_OK):
            applied.missing.append(f"no {controller} controller: {words}")
            continue
        group = _v1_group(controller, name)
        for file, value in files.items():
            _write(group / file, value)
        _write(group / "cgroup.procs", str(pid))
        applied.limits.append(words)
    applied.cgroup = f"{PARENT}/{name} (cgroup v1)"


#: The version 1 hierarchies :func:`confine` uses.
V1_CONTROLLERS = ("cpu", "memory", "cpuset", "pids")


def _folders(name: str) -> list[Path]:
    if version() == 2:
        return [CGROUP / PARENT / name]
    return [CGROUP / c / PARENT / name for c in V1_CONTROLLERS]


def groups() -> list[str]:
    """The names of the workshop's control groups that exist now (in any hierarchy)."""
    roots = [CGROUP / PARENT] if version() == 2 else [CGROUP / c / PARENT for c in V1_CONTROLLERS]
    found: set[str] = set()
    for root in roots:
        with contextlib.suppress(OSError):
            found |= {p.name for p in root.iterdir() if p.is_dir()}
    return sorted(found)


def gradings_of(tag: str) -> list[str]:
    """The control groups of the hub ``tag``'s gradings that exist now: the grading's and its
    autograde steps' (a grading cut off before its own clean-up leaves them)."""
    return [g for g in groups() if g == f"grading-{tag}" or g.startswith(f"autograde-{tag}-")]


def members(name: str) -> set[int]:
    """The processes in the control group ``multigpu/name`` (in any of its hierarchies)."""
    pids: set[int] = set()
    for folder in _folders(name):
        try:
            pids |= {int(p) for p in (folder / "cgroup.procs").read_text().split()}
        except (OSError, ValueError):
            pass
    return pids


def release(name: str, wait_s: float = 10.0) -> set[int]:
    """Kill every process left in the control group ``multigpu/name`` (a daemon a learner started;
    what a killed process forks on the way joins the group and is killed in the next round), then
    remove the group. Returns the processes it killed."""
    killed: set[int] = set()
    deadline = time.monotonic() + wait_s
    while (left := members(name)) and time.monotonic() < deadline:
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except ProcessLookupError:
                pass
        time.sleep(0.05)
    for folder in _folders(name):
        try:
            folder.rmdir()
        except OSError:
            pass  # absent, or a process in uninterruptible sleep is still in it: the next confine reuses it
    return killed


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
