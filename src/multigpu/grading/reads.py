"""What a submission read: the training files opened while it ran, seen from outside the sandbox.

Every grading gives the submission its own view of the training set (:func:`private_view`: hard
links to the cached files, a copy where links cannot be made), mounted read-only in the sandbox,
and the grader watches that view with Linux's inotify (:class:`ReadWatch`) from outside the
learner's processes: every open of a training file is an event the kernel queues for the grader,
whatever the script does, and only opens made through this grading's view count (a neighbour
reading the same cache opens other paths). The grader never asks the submission what it read.

:func:`epoch_reads` sets what was read against what the ranks claimed, per epoch window of the
grader's clock (from the checkpoints' arrival): each claimed sample was read in its epoch
(``confirmed``), only in an earlier epoch (``earlier``: served from memory, a cache of the
decoded images, or not trained on at all; the grader cannot tell) or never by the epoch's end
(``never``: claimed, not trained on).

inotify needs no privilege, so a learner's own ``multigpu grade`` observes the same; where the
kernel refuses a watch (too many inotify instances or watches), :attr:`ReadLog.lost` says why and
the figures are not taken as evidence against anyone.
"""

from __future__ import annotations

import ctypes
import errno
import os
import select
import shutil
import struct
import threading
import time
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

#: inotify's event mask bits (linux/inotify.h)
IN_OPEN = 0x00000020
IN_Q_OVERFLOW = 0x00004000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len (then len bytes of name)
#: Opens recorded at most (12 bytes each: 48 MB). An honest run opens each training file once per
#: epoch (50,000 on the cpu profile); past this the log is marked lost, never grown without end.
MAX_EVENTS = 4_000_000
#: Seconds a window of the grader's clock is widened on each side: the checkpoint folder is polled
#: every 0.2 s and events are timestamped as they are drained (every 0.05 s at most).
WINDOW_SLACK_S = 1.0


def private_view(train_root: Path, dest: Path) -> Path:
    """A copy of the data set ``train_root`` at ``dest`` made of hard links (a copy of each file
    where the file system refuses links): the submission reads it, the grader watches it."""
    for folder, dirs, files in os.walk(train_root):
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
    """The opens of training files the grader saw: ``times[i]`` (seconds after the run's start,
    the runner's clock) of sample ``indices[i]``, in the order they happened."""

    times: array
    indices: array
    #: why the log is incomplete ("" when it is not): events lost, or no watch possible
    lost: str = ""

    def between(self, start: float, end: float) -> set[int]:
        """The samples opened in ``[start, end]``."""
        lo, hi = bisect_left(self.times, start), bisect_right(self.times, end)
        return set(self.indices[lo:hi])

    def before(self, end: float) -> set[int]:
        return set(self.indices[:bisect_right(self.times, end)])

    @property
    def files(self) -> int:
        """Distinct samples opened in the whole run."""
        return len(set(self.indices))


def _libc() -> ctypes.CDLL:
    """The C library's functions, as linked into this Python (no search: ``find_library`` starts
    ``ldconfig``)."""
    return ctypes.CDLL(None, use_errno=True)


class ReadWatch:
    """inotify on every folder of ``split_root`` (the training split of the private view): the
    opens of its files, timestamped by a thread of the grader as the kernel reports them. An
    observer of :func:`multigpu.grading.runner.run_untrusted` (``started``, ``tick``, ``stopped``)."""

    def __init__(self, split_root: Path, samples: Sequence[str]):
        self.index = {os.path.realpath(p): i for i, p in enumerate(samples)}
        self.times, self.indices = array("d"), array("i")
        self.lost = ""
        self.start = time.monotonic()
        self.folders: dict[int, str] = {}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        libc = _libc()
        self.fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if self.fd < 0:
            self.lost = f"inotify is not available here ({os.strerror(ctypes.get_errno())})"
            return
        for folder, _, _ in os.walk(split_root):
            real = os.path.realpath(folder)
            wd = libc.inotify_add_watch(self.fd, real.encode(), IN_OPEN)
            if wd < 0:
                err = ctypes.get_errno()
                self.lost = (f"the kernel refused to watch {real} ({os.strerror(err)}"
                             + (": raise fs.inotify.max_user_watches" if err == errno.ENOSPC else "") + ")")
                break
            self.folders[wd] = real
        self.thread = threading.Thread(target=self._drain, name="read-watch", daemon=True)
        self.thread.start()

    def started(self, start: float) -> None:
        """The run's start on the runner's monotonic clock: event times are counted from it."""
        self.start = start

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
            return ReadLog(self.times, self.indices, self.lost)

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
        now = time.monotonic() - self.start
        off = 0
        with self._lock:
            while off + _EVENT.size <= len(buf):
                wd, mask, _, n = _EVENT.unpack_from(buf, off)
                name = buf[off + _EVENT.size:off + _EVENT.size + n].rstrip(b"\0").decode(errors="replace")
                off += _EVENT.size + n
                if mask & IN_Q_OVERFLOW:
                    self.lost = "the kernel's queue of open events overflowed: some opens were not seen"
                elif name and wd in self.folders:
                    i = self.index.get(os.path.join(self.folders[wd], name))
                    if i is not None and len(self.times) < MAX_EVENTS:
                        self.times.append(now)
                        self.indices.append(i)
                    elif i is not None:
                        self.lost = f"more than {MAX_EVENTS:,} opens of training files: the rest were not recorded"
        return bool(buf)


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


def windows(checkpoint_times: Mapping[tuple[int, int], float], epochs: Sequence[int],
            slack: float = WINDOW_SLACK_S) -> dict[int, tuple[float, float]]:
    """Epoch -> ``(start, end)`` on the grader's clock: from the first rank's checkpoint of the
    epoch before (the run's start for the first) to the last rank's checkpoint of the epoch,
    widened by ``slack`` on each side."""
    def at(e: int, pick) -> float:
        ts = [t for (_, ep), t in checkpoint_times.items() if ep == e]
        return pick(ts) if ts else 0.0
    return {e: (max(0.0, at(e - 1, min) - slack) if e > 1 else 0.0, at(e, max) + slack) for e in epochs}


def epoch_reads(log: ReadLog, claimed: Mapping[int, set[int]],
                spans: Mapping[int, tuple[float, float]]) -> list[EpochReads]:
    """:class:`EpochReads` of each epoch in ``claimed`` (epoch -> the union of the ranks' indices)."""
    out = []
    for e in sorted(claimed):
        start, end = spans[e]
        read = log.between(start, end)
        ever = log.before(end)
        mine = claimed[e]
        unread = mine - read
        never = unread - ever
        out.append(EpochReads(e, len(mine), len(read), len(mine & read), len(unread) - len(never), len(never)))
    return out
