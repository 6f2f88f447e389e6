"""What a submission read: the training files opened while it ran, seen from outside the sandbox.

Every grading gives the submission its own view of the training set (:func:`private_view`: hard
links to the cached files, a copy where links cannot be made), mounted read-only in the sandbox,
and the grader watches that view with Linux's inotify (:class:`ReadWatch`) from outside the
learner's processes: every open of a training file is an event the kernel queues for the grader,
whatever the script does, and only opens made through this grading's view count (a neighbour
reading the same cache opens other paths). The same inotify queue carries the arrival of each
checkpoint in the run's checkpoint folder, so the kernel itself orders every read before or after
every checkpoint: an epoch's window is exact, however late the grader's own threads run on a busy
machine. The grader never asks the submission what it read.

:func:`epoch_reads` sets what was read against what the ranks claimed, per epoch window (from the
first rank's checkpoint of the epoch before to the last rank's checkpoint of the epoch): each
claimed sample was read in its epoch (``confirmed``), only in an earlier epoch (``earlier``:
served from memory, a cache of the decoded images, or not trained on at all; the grader cannot
tell) or never by the epoch's end (``never``: claimed, not trained on).

inotify needs no privilege, so a learner's own ``multigpu grade`` observes the same; where the
kernel refuses a watch or drops events, :attr:`ReadLog.lost` says why and the figures are not
taken as evidence against anyone.
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import select
import shutil
import struct
import threading
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

#: inotify's event mask bits (linux/inotify.h)
IN_OPEN = 0x00000020
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_TO = 0x00000080
IN_IGNORED = 0x00008000
IN_Q_OVERFLOW = 0x00004000
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len (then len bytes of name)
#: Opens recorded at most (4 bytes each: 16 MB). An honest run opens each training file once per
#: epoch (50,000 on the cpu profile); past this the log is marked lost, never grown without end.
MAX_EVENTS = 4_000_000
#: The contract's checkpoint file name (as :data:`multigpu.grading.runner.CHECKPOINT`).
CHECKPOINT = re.compile(r"^rank-(\d+)-epoch-(\d+)\.pt$")


def private_view(train_root: Path, dest: Path) -> Path:
    """A copy of the data set ``train_root`` at ``dest`` made of hard links (a copy of each file
    where the file system refuses links): the submission reads it, the grader watches it."""
    for folder, _, files in os.walk(train_root):
        rel = Path(folder).relative_to(train_root)
        (dest / rel).mkdir(parents=True, exist_ok=True)
        for name in files:
            src, dst = Path(folder) / name, dest / rel / name
            try:
                os.link(src, dst)
            except OSError:
                shutil.copy2(src, dst)
    return dest


@dataclass
class ReadLog:
    """The opens of training files the grader saw, sample ``indices[i]`` the i-th, in the order the
    kernel queued them, and where each checkpoint arrived in that order (``arrivals``: ``(rank,
    epoch) ->`` the number of opens queued before it)."""

    indices: array
    #: the position of each checkpoint's LAST arrival: a script that wrote a checkpoint early and
    #: again later cannot stretch an epoch's window back over the epoch before
    arrivals: dict[tuple[int, int], int] = field(default_factory=dict)
    #: why the log is incomplete ("" when it is not): events lost, or no watch possible
    lost: str = ""

    def between(self, start: int, end: int) -> set[int]:
        """The samples of the opens ``start`` to ``end`` (positions in the log)."""
        return set(self.indices[start:end])

    def before(self, end: int) -> set[int]:
        return set(self.indices[:end])


class ReadWatch:
    """inotify on every folder of ``split_root`` (the training split of the private view) and on
    the run's ``checkpoints`` folder (made here if missing): the opens of training files and the
    checkpoints' arrivals, in the kernel's order, drained by a thread of the grader. An observer
    of :func:`multigpu.grading.runner.run_untrusted` (``started``, ``tick``, ``stopped``)."""

    def __init__(self, split_root: Path, samples: Sequence[str], checkpoints: Path):
        self.index = {os.path.realpath(p): i for i, p in enumerate(samples)}
        self.indices = array("i")
        self.arrivals: dict[tuple[int, int], int] = {}
        self.lost = ""
        self.folders: dict[int, str] = {}
        self.ckpt_wd = -1
        self._stop = threading.Event()
        self._lock = threading.Lock()
        libc = ctypes.CDLL(None, use_errno=True)  # this Python's C library (find_library starts ldconfig)
        self.fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0:
            self.lost = f"inotify is not available here ({os.strerror(ctypes.get_errno())})"
            return
        checkpoints.mkdir(parents=True, exist_ok=True)
        watched = [(os.path.realpath(f), IN_OPEN) for f, _, _ in os.walk(split_root)]
        for folder, mask in [*watched, (os.path.realpath(checkpoints), IN_CLOSE_WRITE | IN_MOVED_TO)]:
            wd = libc.inotify_add_watch(self.fd, folder.encode(), mask)
            if wd < 0:
                err = ctypes.get_errno()
                self.lost = (f"the kernel refused to watch {folder} ({os.strerror(err)}"
                             + (": raise fs.inotify.max_user_watches" if err == errno.ENOSPC else "") + ")")
                break
            self.folders[wd] = folder
        self.ckpt_wd = wd
        self.thread = threading.Thread(target=self._drain, name="read-watch", daemon=True)
        self.thread.start()

    def started(self, start: float) -> None:
        """Nothing to do: the kernel orders the events, no clock is needed."""

    def tick(self, pids: set[int], elapsed: float) -> None:
        """Nothing to do per tick: the kernel queues the events, the thread drains them."""

    def stopped(self) -> ReadLog:
        """Stop watching; the log of what was read."""
        if self.fd >= 0:
            self._stop.set()
            self.thread.join(timeout=5)
            os.close(self.fd)
            self.fd = -1
        with self._lock:
            return ReadLog(self.indices, dict(self.arrivals), self.lost)

    def _drain(self) -> None:
        while not self._stop.is_set():
            ready, _, _ = select.select([self.fd], [], [], 0.05)
            if ready:
                self._read_events()
        while self._read_events():  # what the kernel queued before the stop
            pass

    def _read_events(self) -> bool:
        """Record the events queued now; whether there were any."""
        try:
            buf = os.read(self.fd, 1 << 16)
        except OSError:  # nothing queued (EAGAIN), or the watch is gone
            return False
        off = 0
        with self._lock:
            while off + _EVENT.size <= len(buf):
                wd, mask, _, n = _EVENT.unpack_from(buf, off)
                name = buf[off + _EVENT.size:off + _EVENT.size + n].rstrip(b"\0").decode(errors="replace")
                off += _EVENT.size + n
                self._record(wd, mask, name)
        return bool(buf)

    def _record(self, wd: int, mask: int, name: str) -> None:
        if mask & IN_Q_OVERFLOW:
            self.lost = "the kernel's queue of events overflowed: some opens were not seen"
        elif wd == self.ckpt_wd:
            if mask & IN_IGNORED:
                self.lost = "the checkpoint folder was removed while the run went on"
            elif (m := CHECKPOINT.match(name)):  # the last write counts: it is the file the grader loads
                self.arrivals[(int(m.group(1)), int(m.group(2)))] = len(self.indices)
        elif name and wd in self.folders:
            i = self.index.get(os.path.join(self.folders[wd], name))
            if i is not None and len(self.indices) < MAX_EVENTS:
                self.indices.append(i)
            elif i is not None:
                self.lost = f"more than {MAX_EVENTS:,} opens of training files: the rest were not recorded"


@dataclass(frozen=True)
class EpochReads:
    """One epoch's claimed samples against the training files opened (distinct samples)."""

    epoch: int
    #: the samples the ranks claimed to have trained on in the epoch (their union)
    claimed: int
    #: the training files opened during the epoch's window
    read: int
    #: claimed and opened during the window
    confirmed: int
    #: claimed, not opened during the window, opened in an earlier epoch (served from memory?)
    earlier: int
    #: claimed and never opened by the end of the window
    never: int

    def to_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "claimed": self.claimed, "read": self.read, "confirmed": self.confirmed,
                "earlier": self.earlier, "never": self.never}


def windows(arrivals: Mapping[tuple[int, int], int], epochs: Sequence[int]) -> dict[int, tuple[int, int]]:
    """Epoch -> ``(start, end)``, positions in the read log: from the first rank's checkpoint of the
    epoch before (the run's start for the first) to the last rank's checkpoint of the epoch; an
    epoch with no checkpoint's arrival seen is left out."""
    def at(e: int) -> list[int]:
        return [pos for (_, ep), pos in arrivals.items() if ep == e]
    return {e: (min(at(e - 1), default=0) if e > 1 else 0, max(at(e))) for e in epochs if at(e)}


def epoch_reads(log: ReadLog, claimed: Mapping[int, set[int]]) -> list[EpochReads]:
    """:class:`EpochReads` of each epoch in ``claimed`` (epoch -> the union of the ranks' indices)
    whose window the log holds."""
    spans = windows(log.arrivals, sorted(claimed))
    out = []
    for e in sorted(spans):
        start, end = spans[e]
        read, mine = log.between(start, end), claimed[e]
        unread = mine - read
        never = unread - log.before(end)
        out.append(EpochReads(e, len(mine), len(read), len(mine & read), len(unread) - len(never), len(never)))
    return out
