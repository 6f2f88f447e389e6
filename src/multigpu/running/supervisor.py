"""The one watcher of child processes: start them in their own session, stream their output, and
stop them all at a deadline, at the first crash, past an output cap or when asked to.

:func:`supervise` is what every launcher of :mod:`multigpu.running.launch` (and the grader's
sandboxed run) waits with; :func:`start` starts a process the way it expects; :func:`kill_sessions`
kills processes with everything they started.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from multigpu.running import shmfiles

#: Lines of output printed per job before the rest is dropped (the tail is still kept for errors).
MAX_PRINTED_LINES = 2000
#: Seconds the peers of a crashed worker get to exit on their own before they are killed.
CRASH_GRACE_S = 3.0
#: Bytes at the end of a job's output kept as :attr:`JobResult.tail`.
TAIL_BYTES = 32_000
#: A line longer than this is cut into pieces (output without newlines must not grow one line for ever).
MAX_LINE_BYTES = 64_000


class WorkerError(RuntimeError):
    """A worker process failed; the message holds its rank, exit code and traceback or output tail."""


class WorkerTimeout(WorkerError):
    """The job ran past its time limit and was killed."""


@dataclass
class JobResult:
    """What a finished job left: exit codes, wall time, output lines and per-rank return values,
    and why :func:`supervise` stopped it, if it did."""

    returncodes: list[int | None]
    seconds: float
    output: list[str] = field(default_factory=list)
    values: list[Any] = field(default_factory=list)
    timed_out: bool = False
    output_bytes: int = 0  #: bytes the processes wrote (counted up to the moment reading stopped)
    output_exceeded: bool = False  #: stopped for writing more than ``max_output_bytes``
    stopped: str = ""  #: the reason ``on_tick`` gave for stopping the job ("" when it did not)
    tail: str = ""  #: the last :data:`TAIL_BYTES` of the output, as written

    @property
    def text(self) -> str:
        return "\n".join(self.output)


def start(argv: Sequence[str], *, env: dict[str, str], cwd: str | os.PathLike | None = None,
          cores: set[int] | None = None, capture: bool = True,
          before_exec: Callable[[], None] | None = None) -> subprocess.Popen:
    """Start one child process the course's way: in its own session (its whole process group can
    be killed), no stdin, stdout and stderr merged into one pipe for :func:`supervise` (or
    discarded without ``capture``), pinned to ``cores`` when given. ``before_exec`` runs in the
    child before the program starts (a caller's control group, set before anything of it runs)."""
    def setup() -> None:
        if cores:
            os.sched_setaffinity(0, cores)
        if before_exec is not None:
            before_exec()

    return subprocess.Popen(list(argv), cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE if capture else subprocess.DEVNULL, stderr=subprocess.STDOUT,
                            start_new_session=True, preexec_fn=setup if cores or before_exec else None)


def descendants(pid: int) -> list[int]:
    """Every process ``pid`` started, and theirs, whatever session they run in."""
    import psutil

    try:
        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def kill_sessions(procs: Sequence[subprocess.Popen]) -> None:
    """Kill each process's whole session (horovodrun's workers with it) and every process it
    started in a session of its own (a grading job's nbgrader, a job's own :func:`start`)."""
    for p in procs:
        if p.poll() is None:
            started = descendants(p.pid)  # before the kill: orphans cannot be traced back
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                p.kill()
            for pid in started:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
    wait_for_exit(procs)


def wait_for_exit(procs: Sequence[subprocess.Popen]) -> None:
    """Wait (up to 10 s each) for killed processes to be gone."""
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - a process in uninterruptible sleep
            pass


class OutputReader:
    """One thread per pipe reads the processes' output in chunks into a queue of ``(index, line)``
    events (``line`` None: that pipe is at its end), counting the bytes and keeping the tail.
    Past ``max_output_bytes`` in all, ``exceeded`` is set and reading stops."""

    def __init__(self, procs: Sequence[subprocess.Popen], max_output_bytes: int | None) -> None:
        self.events: queue.Queue[tuple[int, str | None]] = queue.Queue()
        self.max_output_bytes = max_output_bytes
        self.bytes = 0
        self.exceeded = False
        self.lock = threading.Lock()
        self._tail = bytearray()
        self.threads = [threading.Thread(target=self.pump, args=(i, p.stdout), daemon=True)
                        for i, p in enumerate(procs) if p.stdout is not None]
        for t in self.threads:
            t.start()

    def count(self, chunk: bytes) -> None:
        with self.lock:
            self.bytes += len(chunk)
            self._tail.extend(chunk)
            if len(self._tail) > 2 * TAIL_BYTES:
                del self._tail[: len(self._tail) - TAIL_BYTES]
            if self.max_output_bytes is not None and self.bytes > self.max_output_bytes:
                self.exceeded = True

    def pump(self, i: int, stream: IO[bytes]) -> None:
        partial = b""
        for chunk in iter(lambda: stream.read1(65536), b""):  # type: ignore[attr-defined]
            self.count(chunk)
            *lines, partial = (partial + chunk).split(b"\n")
            if len(partial) > MAX_LINE_BYTES:
                lines, partial = [*lines, partial], b""
            for raw in lines:
                self.events.put((i, raw.decode(errors="replace")))
            if self.exceeded:
                return  # the job is being stopped: read no more
        if partial:
            self.events.put((i, partial.decode(errors="replace")))
        self.events.put((i, None))

    def join(self, take: Callable[[int, str], None]) -> None:
        """After the job: let the readers finish, then hand over the lines still queued (none once
        the output cap was passed)."""
        for t in self.threads:
            t.join(timeout=2)
        while not self.exceeded:
            try:
                i, line = self.events.get_nowait()
            except queue.Empty:
                break
            if line is not None:
                take(i, line)

    def tail(self) -> str:
        return bytes(self._tail[-TAIL_BYTES:]).decode(errors="replace")


class Transcript:
    """The job's output lines, each prefixed with its process's label when there are several,
    echoed live up to ``limit`` lines."""

    def __init__(self, labels: list[str], echo: bool, limit: int) -> None:
        self.labels, self.echo, self.limit = labels, echo, limit
        self.lines: list[str] = []
        self.printed = 0

    def take(self, i: int, line: str) -> None:
        text = f"[{self.labels[i]}] {line}" if len(self.labels) > 1 else line
        self.lines.append(text)
        if self.echo and self.printed < self.limit:
            print(text, flush=True)
            self.printed += 1
            if self.printed == self.limit:
                print(f"... more output than {self.limit} lines: the rest is not shown", flush=True)


@dataclass
class Watch:
    """The loop of :func:`supervise`: what it watches and when it stops."""

    procs: list[subprocess.Popen]
    reader: OutputReader
    transcript: Transcript
    stop: Callable[[], Any]
    timeout: float
    on_tick: Callable[[float], str] | None
    tick_s: float
    wait_for_output: bool
    began: float = field(default_factory=time.monotonic)
    timed_out: bool = False
    stopped: str = ""

    def run(self) -> None:
        """Until the job ends or a reason to stop it comes (which is then recorded)."""
        open_streams = len(self.reader.threads)
        first_failure: int | None = None
        failure_time = 0.0
        last_tick = self.began
        while True:
            now = time.monotonic()
            if now - self.began > self.timeout:
                self.timed_out = True
                return
            open_streams -= self.read_one()
            if self.reader.exceeded:
                return
            codes = [p.poll() for p in self.procs]
            if first_failure is None:
                bad = [i for i, c in enumerate(codes) if c not in (None, 0)]
                if bad:
                    first_failure, failure_time = bad[0], time.monotonic()
            if first_failure is not None and None in codes and time.monotonic() - failure_time > CRASH_GRACE_S:
                self.stop()
            if self.on_tick is not None and now - last_tick >= self.tick_s:
                last_tick = now
                self.stopped = self.on_tick(now - self.began) or ""
                if self.stopped:
                    return
            if None not in codes and (open_streams == 0 or first_failure is not None or not self.wait_for_output):
                return

    def read_one(self) -> int:
        """Take the next line within 50 ms, if one comes; 1 when a pipe reached its end, else 0."""
        try:
            i, line = self.reader.events.get(timeout=0.05)
        except queue.Empty:
            return 0
        if line is None:
            return 1
        self.transcript.take(i, line)
        return 0


def supervise(
    procs: list[subprocess.Popen],
    labels: list[str],
    timeout: float,
    echo: bool = True,
    what: str = "job",
    *,
    max_output_bytes: int | None = None,
    max_printed_lines: int | None = None,
    on_tick: Callable[[float], str] | None = None,
    tick_s: float = 0.2,
    kill: Callable[[], Any] | None = None,
    raise_on_timeout: bool = True,
    wait_for_output: bool = True,
) -> JobResult:
    """The one watcher of child processes: stream their output and stop them all when one of these comes first:
    - ``timeout`` seconds have passed (:class:`WorkerTimeout`, or ``timed_out`` in the result
      with ``raise_on_timeout=False``);
    - one exited with an error :data:`CRASH_GRACE_S` ago (its peers would wait for it forever in a collective);
    - together they wrote more than ``max_output_bytes`` (reading stops at once: ``output_exceeded``);
    - ``on_tick(elapsed_s)``, asked every ``tick_s``, returned a reason (kept as ``stopped``).

    Output is read in chunks (a line longer than :data:`MAX_LINE_BYTES` is cut), each line
    prefixed with its process's label when there are several, and echoed live up to
    ``max_printed_lines`` (default :data:`MAX_PRINTED_LINES`). Stopping calls ``kill()`` (default :func:`kill_sessions`); it is also
    called when the job ends by itself and on any exception (Ctrl-C in a notebook), so whatever
    the processes left running goes with them. The job has ended when every process has exited
    and, with ``wait_for_output``, their output has been read to its end; without it (untrusted
    code: a daemon it started may hold the pipe open) the exit alone ends it, and what the pipe
    still holds is read after the kill. MPICH's ``/dev/shm`` files the job left go too (:mod:`shmfiles`).
    """
    shm_before = shmfiles.present()
    reader = OutputReader(procs, max_output_bytes)
    transcript = Transcript(labels, echo, MAX_PRINTED_LINES if max_printed_lines is None else max_printed_lines)
    stop = kill or (lambda: kill_sessions(procs))
    watch = Watch(procs, reader, transcript, stop, timeout, on_tick, tick_s, wait_for_output)
    try:
        watch.run()
    except BaseException:
        stop()  # KeyboardInterrupt in a notebook must not leave orphans behind
        shmfiles.remove_left(shm_before)
        raise
    stop()
    wait_for_exit(procs)
    shmfiles.remove_left(shm_before)
    reader.join(transcript.take)
    with reader.lock:
        result = JobResult([p.returncode for p in procs], time.monotonic() - watch.began, transcript.lines,
                           timed_out=watch.timed_out, output_bytes=reader.bytes,
                           output_exceeded=reader.exceeded and not watch.timed_out,
                           stopped=watch.stopped, tail=reader.tail())
    if watch.timed_out and raise_on_timeout:
        running = [labels[i] for i, p in enumerate(procs) if p.returncode in (None, -signal.SIGKILL)]
        raise WorkerTimeout(
            f"{what} ran past its time limit of {timeout:.0f} s and was killed "
            f"(still running: {', '.join(running) or 'none'}). A worker may be waiting in a "
            f"collective that another never joined, or looping. Last output:\n" + "\n".join(transcript.lines[-20:])
        )
    return result
