"""Run an untrusted training script with hard bounds, and watch its checkpoints from outside.

:func:`run_untrusted` starts ``python script`` (or ``horovodrun -np N -H localhost:N python script``)
in its own session, watched by :func:`multigpu.running.launch.supervise` (the course's one supervisor; the
checks below are its per-tick callback and its kill), and guarantees, whatever the script does:

- it is killed at ``timeout`` seconds (``timed_out``);
- it is killed once it has printed ``max_output_bytes`` (``output_exceeded``); only the last
  ``launch.TAIL_BYTES`` are kept, for the error message;
- no process it started outlives it: its process tree is tracked while it runs, and every
  process that carries the job's token in its environment (even one that left the session with
  ``setsid``) is killed when the job ends;
- it is killed once its processes together hold more than ``max_memory_bytes`` of memory
  (``memory_exceeded``);
- the moment each checkpoint file ``rank-<R>-epoch-<E>.pt`` appears is recorded by the grader's
  clock (``epoch_times``), so throughput never depends on what the script claims;
- with ``sandbox=...`` it runs inside bubblewrap (:mod:`multigpu.grading.sandbox`: read-only
  system, private HOME and network namespace, its own PID namespace, an unprivileged account
  when the grader is root, which is given the run's folder);
- ``observers`` watch it from outside while it runs (:class:`Observer`: what it read, who talked
  to whom); each one's :meth:`Observer.stopped` answer is kept in ``observed``.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import psutil

#: Lines echoed live at most (the rest is counted, not shown).
MAX_ECHO_LINES = 400
#: How often the checkpoint folder is polled (seconds).
POLL_S = 0.2
#: Environment variable that marks every process of one job.
TOKEN_VAR = "MULTIGPU_GRADING_JOB"

CHECKPOINT = re.compile(r"^rank-(\d+)-epoch-(\d+)\.pt$")


@dataclass
class RunRecord:
    """What one bounded run left behind, measured from outside."""

    command: list[str]
    returncode: int | None
    wall_s: float
    timed_out: bool = False
    output_exceeded: bool = False
    output_bytes: int = 0
    tail: str = ""
    #: (rank, epoch) -> seconds after the start when the checkpoint file was first seen
    checkpoint_times: dict[tuple[int, int], float] = field(default_factory=dict)
    #: epoch -> seconds after the start when the last rank's checkpoint of it was first seen
    epoch_times: dict[int, float] = field(default_factory=dict)
    memory_exceeded: bool = False
    peak_memory_bytes: int = 0
    #: ran inside the sandbox
    sandboxed: bool = False
    #: why the watcher's ``stop_if`` rule stopped the run before it ended ("" when it did not)
    stopped_early: str = ""
    #: the wall clock (seconds since the epoch) when the run was started: ties what the run wrote
    #: with its own clock (a Horovod timeline) to the grader's (0.0: not recorded)
    started_at: float = 0.0
    #: observer name -> what it saw (:meth:`Observer.stopped`)
    observed: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return (self.returncode == 0 and not self.timed_out and not self.output_exceeded and not self.memory_exceeded
                and not self.stopped_early)


#: ``rule(checkpoints_seen, elapsed_s) -> reason``: why to stop a run now ("" to let it go on).
StopRule = Callable[[dict[tuple[int, int], float], float], str]


class Observer(Protocol):
    """Watches a run from outside: told the run's start (the runner's monotonic clock), given the
    job's processes on every tick, asked for what it saw when the run has ended."""

    def started(self, start: float) -> None: ...

    def tick(self, pids: set[int], elapsed: float) -> None: ...

    def stopped(self) -> Any: ...


def _python_env(extra: dict[str, str] | None, token: str) -> dict[str, str]:
    """The workers' environment of :mod:`multigpu.running.launch`, marked with the job's token."""
    from multigpu.running import launch

    env = launch.worker_env(extra)
    env[TOKEN_VAR] = token
    return env


def _memory(pids: set[int]) -> int:
    total = 0
    for pid in pids:
        try:
            total += psutil.Process(pid).memory_info().rss
        except psutil.Error:
            pass
    return total


def _descendants(pid: int) -> set[int]:
    try:
        return {c.pid for c in psutil.Process(pid).children(recursive=True)}
    except psutil.Error:
        return set()


def _carries_token(proc: psutil.Process, token: str) -> bool:
    try:
        return proc.environ().get(TOKEN_VAR) == token
    except (psutil.Error, OSError):
        return False


def kill_job(root_pid: int, token: str, known: AbstractSet[int] = frozenset()) -> int:
    """Kill the job's session, its known descendants and every process carrying ``token``.
    Returns how many processes were signalled."""
    victims: set[int] = set(known) | _descendants(root_pid)
    try:
        os.killpg(root_pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    me = os.getpid()
    for p in psutil.process_iter():
        if p.pid != me and p.pid not in victims and _carries_token(p, token):
            victims.add(p.pid)
    killed = 0
    for pid in victims:
        try:
            os.kill(pid, signal.SIGKILL)
            killed += 1
        except (ProcessLookupError, PermissionError):
            pass
    return killed


def _scan(folder: Path | None, start: float, seen: dict[tuple[int, int], float]) -> None:
    if folder is None or not folder.is_dir():
        return
    now = time.monotonic() - start
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        m = CHECKPOINT.match(name)
        if m:
            seen.setdefault((int(m.group(1)), int(m.group(2))), now)


class _Watch:
    """What :func:`run_untrusted` checks every POLL_S: the job's memory, the checkpoints written so
    far (``seen``: ``(rank, epoch) -> seconds after start``), the stop rule; ``known``: every
    process of the job seen so far (killed with it)."""

    def __init__(self, pid: int, ckpt: Path | None, start: float, max_memory_bytes: int | None,
                 stop_if: StopRule | None, observers: dict[str, Observer] | None = None):
        self.pid, self.ckpt, self.start, self.max_memory_bytes, self.stop_if = pid, ckpt, start, max_memory_bytes, stop_if
        self.observers = observers or {}
        for o in self.observers.values():
            o.started(start)
        self.seen: dict[tuple[int, int], float] = {}
        self.known: set[int] = set()
        self.peak = 0
        self.memory_exceeded = False

    def tick(self, elapsed: float) -> str:
        alive = _descendants(self.pid)
        self.known.update(alive)
        used = _memory(alive | {self.pid})
        self.peak = max(self.peak, used)
        if self.max_memory_bytes is not None and used > self.max_memory_bytes:
            self.memory_exceeded = True
            return "too much memory"
        _scan(self.ckpt, self.start, self.seen)
        for o in self.observers.values():
            o.tick(alive, elapsed)
        if self.stop_if is None:
            return ""
        return self.stop_if(dict(self.seen), elapsed) or ""

    def observed(self) -> dict[str, Any]:
        """What each observer saw, once the run has ended."""
        return {name: o.stopped() for name, o in self.observers.items()}


def run_untrusted(
    script: str | os.PathLike,
    workdir: str | os.PathLike,
    *,
    workers: int | None,
    timeout: float,
    max_output_bytes: int,
    args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    checkpoint_dir: str | os.PathLike | None = None,
    echo: bool = False,
    log: Callable[[str], None] | None = None,
    max_memory_bytes: int | None = None,
    sandbox: dict[str, Sequence[str | os.PathLike]] | None = None,
    stop_if: StopRule | None = None,
    observers: dict[str, Observer] | None = None,
) -> RunRecord:
    """Run ``script`` in ``workdir`` (created) with the bounds above.

    ``workers=None`` runs one plain ``python script``; ``workers=N`` runs it under
    ``horovodrun -np N -H localhost:N``. ``echo`` prints the output live (capped);
    ``log`` receives one line when the run ends. ``sandbox`` (``{"readable": [...], "hidden":
    [...]}``, see :func:`sandbox.command`) runs it in bubblewrap with ``workdir`` its only
    writable folder; the script must then lie inside ``workdir``. ``stop_if(checkpoints, elapsed)``
    is asked on every poll with the checkpoints seen so far (``(rank, epoch) -> seconds``): a
    non-empty answer stops the run at once and is kept as ``stopped_early``. ``observers`` (name ->
    :class:`Observer`) watch the run; what each saw is in the record's ``observed``.
    """
    from multigpu.running import launch

    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, str(Path(script).resolve()), *map(str, args)]
    if workers is not None:
        command = [*launch.horovodrun_command(workers), *command]
    token = uuid.uuid4().hex
    argv, popen_env = _wrapped(command, workdir, env, token, sandbox)
    ckpt = Path(checkpoint_dir) if checkpoint_dir is not None else None
    started_at = time.time()
    start = time.monotonic()
    with _keyrings_emptied(sandbox is not None):
        proc = launch.start(argv, env=popen_env, cwd=workdir)
        watch = _Watch(proc.pid, ckpt, start, max_memory_bytes, stop_if, observers)
        job = launch.supervise([proc], ["run"], timeout, echo, " ".join(command[:5]), max_output_bytes=max_output_bytes,
                               max_printed_lines=MAX_ECHO_LINES, on_tick=watch.tick, tick_s=POLL_S,
                               kill=lambda: kill_job(proc.pid, token, watch.known), raise_on_timeout=False,
                               wait_for_output=False)  # a daemon the script left may hold the pipe open
    _scan(ckpt, start, watch.seen)
    wall = time.monotonic() - start
    record = RunRecord(command=command, returncode=proc.returncode, wall_s=wall, timed_out=job.timed_out,
                       output_exceeded=job.output_exceeded, output_bytes=job.output_bytes, tail=job.tail,
                       checkpoint_times=dict(watch.seen), epoch_times=_epoch_times(watch.seen),
                       memory_exceeded=watch.memory_exceeded, peak_memory_bytes=watch.peak,
                       sandboxed=sandbox is not None, stopped_early="" if watch.memory_exceeded else job.stopped,
                       started_at=started_at, observed=watch.observed())
    if log is not None:
        log(f"{' '.join(command[:5])} ...: {_how_it_ended(record)} after {wall:.1f} s")
    return record


def _keyrings_emptied(sandboxed: bool) -> contextlib.AbstractContextManager[None]:
    """The sandbox account's keyrings emptied around a sandboxed run (``sandbox.fresh_keyrings``)."""
    from multigpu.grading import sandbox as sb

    return sb.fresh_keyrings() if sandboxed else contextlib.nullcontext()


def _wrapped(command: list[str], workdir: Path, env: dict[str, str] | None, token: str,
             sandbox: dict[str, Sequence[str | os.PathLike]] | None) -> tuple[list[str], dict[str, str]]:
    """The argv and environment that start ``command``: inside the sandbox (``workdir`` its only
    writable folder) or plainly; either way the environment carries the job's ``token``."""
    from multigpu.grading import sandbox as sb

    if sandbox is None:
        return command, _python_env(env, token)
    sb.give_workdir(workdir)
    argv = sb.command(command, workdir=workdir, readable=sandbox.get("readable", ()), hidden=sandbox.get("hidden", ()))
    return argv, sb.environment({**(env or {}), TOKEN_VAR: token})


def _epoch_times(seen: dict[tuple[int, int], float]) -> dict[int, float]:
    """Epoch -> when its last rank's checkpoint appeared (seconds after the start)."""
    epoch_times: dict[int, float] = {}
    for (_, epoch), t in seen.items():
        epoch_times[epoch] = max(t, epoch_times.get(epoch, 0.0))
    return epoch_times


def _how_it_ended(record: RunRecord) -> str:
    return ("timed out" if record.timed_out else "stopped: too much output" if record.output_exceeded
            else "stopped: too much memory" if record.memory_exceeded
            else "stopped early" if record.stopped_early else f"exit code {record.returncode}")
