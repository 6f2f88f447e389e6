"""MPICH's shared-memory files that a killed job leaves behind.

Horovod's MPI workers on one machine talk through a file MPICH makes in ``/dev/shm``
(``mpich_shm_*``, 2-4 MB) and removes once every local rank has it mapped; a job killed before
that (a time limit, a crash in ``hvd.init``, Ctrl-C) leaves it there, in memory, until the machine
restarts. :func:`supervise <multigpu.running.supervisor.supervise>` notes the files there when a
job starts (:func:`present`) and, when it ends, removes the new ones of this account that no
process still maps or holds open (:func:`remove_left`): another job's file in use stays.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

SHM = Path("/dev/shm")
PREFIX = "mpich_shm_"


def present(shm: Path = SHM) -> set[str]:
    """The names of MPICH's files in ``shm`` now."""
    with contextlib.suppress(OSError):
        return {name for name in os.listdir(shm) if name.startswith(PREFIX)}
    return set()


def in_use(paths: set[str]) -> set[str]:
    """Those of ``paths`` that a process this account may look at maps or holds open."""
    used: set[str] = set()
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        with contextlib.suppress(OSError):
            with open(f"/proc/{pid}/maps") as maps:
                used |= {p for p in paths if p in maps.read()}
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if target in paths:
                        used.add(target)
    return used


def remove_left(before: set[str], shm: Path = SHM, wait_s: float = 3.0) -> list[str]:
    """Remove MPICH's files in ``shm`` that were not there ``before``, belong to this account and
    are in no one's use; the names removed. A file still in use is looked at again for up to
    ``wait_s`` seconds (a killed worker may take a moment to exit)."""
    new = {str(shm / name) for name in present(shm) - before}
    mine = set()
    for path in new:
        with contextlib.suppress(OSError):
            if os.lstat(path).st_uid == os.geteuid():
                mine.add(path)
    removed: list[str] = []
    deadline = time.monotonic() + wait_s
    while mine:
        for path in sorted(mine - in_use(mine)):
            with contextlib.suppress(OSError):
                os.unlink(path)
                removed.append(os.path.basename(path))
            mine.discard(path)
        if not mine or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    return removed
