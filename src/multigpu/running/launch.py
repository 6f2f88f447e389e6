"""Start worker processes from a notebook, a test or the grader, and always get control back.

Every launcher here is bounded in time: a worker that crashes stops the whole job at once (its
peers would otherwise wait forever in a collective), a job that runs past ``timeout`` is killed
with its whole process group, and both raise an exception that says which rank failed and why.
Output is streamed live, each line prefixed with its rank, and capped so that a runaway loop
cannot flood a notebook.

- :func:`run` runs ``fn(rank, world_size, *args)`` in ``nprocs`` fresh Python processes with
  ``torch.distributed`` initialised (Gloo in CPU mode, NCCL in GPU mode). ``fn`` may be defined
  in a notebook: it travels by cloudpickle.
- :func:`horovodrun` runs a command under ``horovodrun -np N -H localhost:N``.
- :func:`run_horovod` runs ``fn(*args)`` under ``horovodrun`` in N processes (``fn`` calls
  ``hvd.init()`` itself) and returns each rank's return value.
- :func:`torchrun` runs a command under ``torchrun --standalone``; :func:`run_command` any one
  command (a plain ``python``) the same way; :func:`worker_errors` picks the failing worker's
  traceback out of ``horovodrun``'s output.
"""

from __future__ import annotations

import contextlib
import functools
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import cloudpickle

from multigpu.core import layout

#: Lines of output printed per job before the rest is dropped (the tail is still kept for errors).
MAX_PRINTED_LINES = 2000
#: Seconds the peers of a crashed worker get to exit on their own before they are killed.
CRASH_GRACE_S = 3.0
#: Bytes at the end of a job's output kept as :attr:`JobResult.tail`.
TAIL_BYTES = 32_000
#: A line longer than this is cut into pieces (output without newlines must not grow one line for ever).
MAX_LINE_BYTES = 64_000


class JobWrapper(Protocol):
    """What runs a whole job inside it: :class:`multigpu.labs.lab4.links.EmulatedLink` (a network namespace
    behind an emulated link) is one."""

    def why_unavailable(self) -> str | None:
        """None where the wrapper works on this machine, else why not and what to do."""

    def wrap(self, argv: Sequence[str]) -> list[str]:
        """The command that runs ``argv`` inside the wrapper."""


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


def free_port() -> int:
    """A TCP port on localhost that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def executable(name: str) -> str:
    """An executable of the running Python's environment (e.g. the venv's ``horovodrun``)."""
    candidate = Path(sys.executable).parent / name
    if candidate.exists():
        return str(candidate)
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"'{name}' not found next to {sys.executable} or on PATH: run 'make setup'")
    return found


@functools.lru_cache(maxsize=None)
def horovod_controller() -> str:
    """How the course runs Horovod on this machine: ``"mpi"`` where Horovod was built with MPI and
    the environment has ``mpirun`` (the venv's MPICH: the workers of one machine exchange
    gradients through shared memory), else ``"gloo"`` (TCP, loopback on one machine)."""
    try:
        mpirun = executable("mpirun")
        from horovod.common.util import mpi_built  # asks a child process: Horovod's own check
    except (FileNotFoundError, ImportError):
        return "gloo"
    return "mpi" if Path(mpirun).exists() and mpi_built() else "gloo"


#: Horovod's fusion buffer in CPU mode (bytes): gradients are all-reduced in 4 MB groups as
#: backward produces them instead of one 128 MB buffer (Horovod's default, tuned for GPUs). On 2
#: cores, 2 and 4 workers: 0.92 / 0.87 x ideal against 0.89 / 0.82 (``make bench``, levers;
#: README, Performance).
CPU_FUSION_THRESHOLD = 4 * 2**20


def horovod_defaults(cpu: bool | None = None) -> dict[str, str]:
    """The course's Horovod settings for CPU workers (``cpu``; default: this machine's mode), as
    environment variables (an environment that sets one already wins): :data:`CPU_FUSION_THRESHOLD`."""
    from multigpu.core import devices

    if cpu is None:
        cpu = devices.detect().mode == "cpu"
    return {"HOROVOD_FUSION_THRESHOLD": str(CPU_FUSION_THRESHOLD)} if cpu else {}


def job_env(workers: int, env: dict[str, str] | None = None, echo: bool = True) -> dict[str, str]:
    """``env`` for a job of ``workers`` workers, with ``MULTIGPU_FORCE_CPU=1`` where this GPU machine
    has fewer GPUs than workers (:func:`multigpu.core.devices.for_workers`; said on stdout with ``echo``)."""
    from multigpu.core import devices

    forced = devices.job_env(workers)
    if forced and echo:
        print(f"{workers} workers, {devices.detect().gpus} GPU(s): every worker runs on the CPU "
              f"({devices.FORCE_CPU}=1; see devices.for_workers)", flush=True)
    return {**forced, **(env or {})}


def horovodrun_command(np: int, hosts: str | None = None, horovod_args: Sequence[str] = ()) -> list[str]:
    """``horovodrun -np N -H hosts --mpi|--gloo [horovod_args]``: the controller of
    :func:`horovod_controller` unless ``horovod_args`` names one."""
    chosen = [] if {"--mpi", "--gloo"} & set(horovod_args) else [f"--{horovod_controller()}"]
    return [executable("horovodrun"), "-np", str(np), "-H", hosts or f"localhost:{np}", *chosen, *horovod_args]


@contextlib.contextmanager
def pickled_by_value(fn: Any) -> Iterator[None]:
    """Let ``fn`` travel to the workers by value when its module is not importable there (a
    test file, a script run from elsewhere), like functions defined in a notebook."""
    module = sys.modules.get(getattr(fn, "__module__", "") or "")
    by_value = (
        fn is not None
        and module is not None
        and module.__name__ != "__main__"
        and not module.__name__.startswith("multigpu")
        and "site-packages" not in (getattr(module, "__file__", "") or "site-packages")
    )
    if by_value:
        cloudpickle.register_pickle_by_value(module)
    try:
        yield
    finally:
        if by_value:
            cloudpickle.unregister_pickle_by_value(module)


def _dump_job(path: Path, fn: Callable[..., Any], args: Sequence[Any], backend: str | None) -> None:
    """Pickle the job (``fn`` by value when the workers could not import it)."""
    with pickled_by_value(fn), open(path, "wb") as f:
        cloudpickle.dump((fn, tuple(args), backend), f)


def worker_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for workers: :func:`horovod_defaults`, then ours, with this package
    importable, the venv's tools first on ``PATH`` (``horovodrun`` starts the venv's ``mpirun``)
    and output unbuffered. ``extra`` overrides variables; a ``PYTHONPATH`` in it goes after this
    package's folder and before the inherited one."""
    from multigpu.core import devices

    extra = {k: str(v) for k, v in (extra or {}).items()}
    env = {**horovod_defaults(True if devices.cpu_forced({**os.environ, **extra}) else None), **os.environ}
    paths = [str(layout.IMPORT_ROOT), extra.pop("PYTHONPATH", ""), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    env["PATH"] = os.pathsep.join(p for p in (str(Path(sys.executable).parent), env.get("PATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("MULTIGPU_PLAIN_PROGRESS", "1")
    env.update(extra)
    return env


def start(argv: Sequence[str], *, env: dict[str, str], cwd: str | os.PathLike | None = None,
          cores: set[int] | None = None, capture: bool = True) -> subprocess.Popen:
    """Start one child process the course's way: in its own session (its whole process group can
    be killed), no stdin, stdout and stderr merged into one pipe for :func:`supervise` (or
    discarded without ``capture``), pinned to ``cores`` when given."""
    pin = (lambda: os.sched_setaffinity(0, cores)) if cores else None
    return subprocess.Popen(list(argv), cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE if capture else subprocess.DEVNULL, stderr=subprocess.STDOUT,
                            start_new_session=True, preexec_fn=pin)


def kill_sessions(procs: Sequence[subprocess.Popen]) -> None:
    """Kill each process's whole session (its children too: horovodrun starts the workers)."""
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                p.kill()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - a process in uninterruptible sleep
            pass


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
    """The one watcher of child processes: stream their output and stop them all when one of
    these comes first:

    - ``timeout`` seconds have passed (:class:`WorkerTimeout`, or ``timed_out`` in the result
      with ``raise_on_timeout=False``);
    - one exited with an error :data:`CRASH_GRACE_S` ago (its peers would wait for it forever in
      a collective);
    - together they wrote more than ``max_output_bytes`` (reading stops at once: ``output_exceeded``);
    - ``on_tick(elapsed_s)``, asked every ``tick_s``, returned a reason (kept as ``stopped``).

    Output is read in chunks (a line longer than :data:`MAX_LINE_BYTES` is cut), each line
    prefixed with its process's label when there are several, and echoed live up to
    ``max_printed_lines`` (default :data:`MAX_PRINTED_LINES`). Stopping calls ``kill()`` (default :func:`kill_sessions`); it is also
    called when the job ends by itself and on any exception (Ctrl-C in a notebook), so whatever
    the processes left running goes with them. The job has ended when every process has exited
    and, with ``wait_for_output``, their output has been read to its end; without it (untrusted
    code: a daemon it started may hold the pipe open) the exit alone ends it, and what the pipe
    still holds is read after the kill.
    """
    events: queue.Queue[tuple[int, str | None]] = queue.Queue()
    lock = threading.Lock()
    counted = {"bytes": 0, "exceeded": False}
    tail = bytearray()

    def pump(i: int, stream) -> None:
        partial = b""
        for chunk in iter(lambda: stream.read1(65536), b""):
            with lock:
                counted["bytes"] += len(chunk)
                tail.extend(chunk)
                if len(tail) > 2 * TAIL_BYTES:
                    del tail[: len(tail) - TAIL_BYTES]
                if max_output_bytes is not None and counted["bytes"] > max_output_bytes:
                    counted["exceeded"] = True
            *lines, partial = (partial + chunk).split(b"\n")
            if len(partial) > MAX_LINE_BYTES:
                lines, partial = [*lines, partial], b""
            for raw in lines:
                events.put((i, raw.decode(errors="replace")))
            if counted["exceeded"]:
                return  # the job is being stopped: read no more
        if partial:
            events.put((i, partial.decode(errors="replace")))
        events.put((i, None))

    readers = [threading.Thread(target=pump, args=(i, p.stdout), daemon=True) for i, p in enumerate(procs)
               if p.stdout is not None]
    for t in readers:
        t.start()
    stop = kill or (lambda: kill_sessions(procs))
    began = last_tick = time.monotonic()
    output: list[str] = []
    printed = 0
    limit = MAX_PRINTED_LINES if max_printed_lines is None else max_printed_lines

    def take(i: int, line: str) -> None:
        nonlocal printed
        text = f"[{labels[i]}] {line}" if len(procs) > 1 else line
        output.append(text)
        if echo and printed < limit:
            print(text, flush=True)
            printed += 1
            if printed == limit:
                print(f"... more output than {limit} lines: the rest is not shown", flush=True)

    open_streams = len(readers)
    first_failure: int | None = None
    failure_time = 0.0
    timed_out, stopped = False, ""
    try:
        while True:
            now = time.monotonic()
            if now - began > timeout:
                timed_out = True
                break
            try:
                i, line = events.get(timeout=0.05)
                if line is None:
                    open_streams -= 1
                else:
                    take(i, line)
            except queue.Empty:
                pass
            if counted["exceeded"]:
                break
            codes = [p.poll() for p in procs]
            if first_failure is None:
                bad = [i for i, c in enumerate(codes) if c not in (None, 0)]
                if bad:
                    first_failure, failure_time = bad[0], time.monotonic()
            if first_failure is not None and None in codes and time.monotonic() - failure_time > CRASH_GRACE_S:
                stop()
            if on_tick is not None and now - last_tick >= tick_s:
                last_tick = now
                stopped = on_tick(now - began) or ""
                if stopped:
                    break
            if None not in codes and (open_streams == 0 or first_failure is not None or not wait_for_output):
                break
    except BaseException:
        stop()  # KeyboardInterrupt in a notebook must not leave orphans behind
        raise
    stop()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - a process in uninterruptible sleep
            pass
    for t in readers:
        t.join(timeout=2)
    while not counted["exceeded"]:  # lines still queued when the job ended
        try:
            i, line = events.get_nowait()
        except queue.Empty:
            break
        if line is not None:
            take(i, line)
    with lock:
        result = JobResult([p.returncode for p in procs], time.monotonic() - began, output, timed_out=timed_out,
                           output_bytes=counted["bytes"], output_exceeded=bool(counted["exceeded"]) and not timed_out,
                           stopped=stopped, tail=bytes(tail[-TAIL_BYTES:]).decode(errors="replace"))
    if timed_out and raise_on_timeout:
        running = [labels[i] for i, p in enumerate(procs) if p.returncode in (None, -signal.SIGKILL)]
        raise WorkerTimeout(
            f"{what} ran past its time limit of {timeout:.0f} s and was killed "
            f"(still running: {', '.join(running) or 'none'}). A worker may be waiting in a "
            f"collective that another never joined, or looping. Last output:\n" + "\n".join(output[-20:])
        )
    return result


def _read_values(outdir: Path, n: int, labels: list[str], result: JobResult, what: str) -> list[Any]:
    """Collect each rank's ``(status, payload)`` record; raise on the first rank that failed."""
    records: list[tuple[str, Any] | None] = []
    for rank in range(n):
        path = outdir / f"rank{rank}.pkl"
        try:
            with open(path, "rb") as f:
                records.append(cloudpickle.load(f))
        except (OSError, EOFError, Exception):  # a killed worker leaves no or half a file
            records.append(None)
    # The rank that failed first is the cause; its peers then only report a lost connection.
    def written(rank: int) -> int:
        try:
            return (outdir / f"rank{rank}.pkl").stat().st_mtime_ns
        except OSError:
            return 1 << 62

    order = sorted(range(n), key=written)
    for rank in order:
        rec = records[rank]
        if rec is not None and rec[0] == "error":
            raise WorkerError(f"{what}: rank {rank} raised an exception:\n{rec[1]}")
    for rank, rec in enumerate(records):
        if rec is None:
            code = result.returncodes[rank] if rank < len(result.returncodes) else None
            tail = "\n".join(result.output[-20:])
            raise WorkerError(
                f"{what}: rank {rank} ended without a result (exit code {code}; "
                f"killed after a peer failed, or crashed hard). Last output:\n{tail}"
            )
    return [rec[1] for rec in records]  # type: ignore[index]


def run(
    fn: Callable[..., Any],
    nprocs: int,
    *,
    args: Sequence[Any] = (),
    timeout: float = 120.0,
    backend: str | None = "auto",
    env: dict[str, str] | None = None,
    threads: int | None = None,
    echo: bool = True,
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` in ``nprocs`` worker processes; return their values.

    ``backend``: ``"auto"`` (NCCL in GPU mode, Gloo in CPU mode), ``"gloo"``, ``"nccl"``, or
    ``None`` for no process group. ``threads``: torch threads per worker (default: the cores
    shared fairly, one each when workers outnumber cores). Raises :class:`WorkerError` when a
    worker raises or crashes and :class:`WorkerTimeout` after ``timeout`` seconds; in both cases
    every worker has been killed.
    """
    from multigpu.core import devices

    if nprocs < 1:
        raise ValueError(f"nprocs must be >= 1, got {nprocs}")
    info = devices.for_workers(nprocs)
    env = job_env(nprocs, env, echo)
    if backend == "auto":
        backend = info.backend
    threads = threads or devices.threads_per_worker(nprocs, info)
    with tempfile.TemporaryDirectory(prefix="multigpu-job-") as tmp:
        outdir = Path(tmp)
        job = outdir / "job.pkl"
        _dump_job(job, fn, args, backend)
        port = str(free_port())
        procs = []
        for rank in range(nprocs):
            rank_env = worker_env(env)
            rank_env.update(
                RANK=str(rank),
                WORLD_SIZE=str(nprocs),
                LOCAL_RANK=str(rank),
                LOCAL_WORLD_SIZE=str(nprocs),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=port,
                MULTIGPU_THREADS=str(threads),
                MULTIGPU_TIMEOUT=str(int(timeout)),
            )
            procs.append(start([sys.executable, "-m", "multigpu.running._worker", "run", str(job), str(outdir)], env=rank_env))
        labels = [f"rank {r}" for r in range(nprocs)]
        what = f"job of {nprocs} worker(s)"
        result = supervise(procs, labels, timeout, echo, what)
        return _read_values(outdir, nprocs, labels, result, what)


def horovodrun(
    argv: Sequence[str],
    np: int,
    *,
    timeout: float = 300.0,
    env: dict[str, str] | None = None,
    hosts: str | None = None,
    horovod_args: Sequence[str] = (),
    echo: bool = True,
    check: bool = True,
    link: JobWrapper | None = None,
) -> JobResult:
    """Run ``horovodrun -np N -H localhost:N [horovod_args] argv`` (see :func:`horovodrun_command`)
    with live output and a time limit.

    ``hosts`` defaults to ``localhost:N``; several nodes look like ``"server1:4,server2:4"``.
    With ``check`` (default) a non-zero exit raises :class:`WorkerError` with the output tail.
    ``link``: the whole job in a network namespace of its own behind an emulated link
    (:mod:`multigpu.labs.lab4.links`; one machine only, over Gloo).
    """
    if link is not None:
        why = link.why_unavailable()
        if why:
            raise RuntimeError(f"no emulated link on this machine: {why}")
        if hosts or "--mpi" in horovod_args:
            raise ValueError("an emulated link carries one machine's job over Gloo (TCP on its loopback): "
                             "no hosts, no --mpi (MPI workers on one machine share memory, not the link)")
        horovod_args = ["--gloo", *[a for a in horovod_args if a != "--gloo"]]
    cmd = [*horovodrun_command(np, hosts, horovod_args), *argv]
    if link is not None:
        cmd = link.wrap(cmd)
    # the workers of one node: each host's slots ("server1:4,server2:4": 4 on each)
    per_node = max(int(h.split(":")[1]) if ":" in h else 1 for h in hosts.split(",")) if hosts else np
    return run_command(cmd, label="horovodrun", what=f"horovodrun -np {np}", timeout=timeout,
                       env=job_env(per_node, env, echo), echo=echo, check=check)


def run_command(
    argv: Sequence[str],
    *,
    label: str,
    what: str,
    timeout: float,
    env: dict[str, str] | None = None,
    echo: bool = True,
    check: bool = True,
) -> JobResult:
    """Run one command (a launcher such as ``horovodrun`` or ``torchrun``, or a plain ``python``)
    in its own session with :func:`worker_env`, supervised like :func:`run`'s workers: live
    output prefixed with nothing, the time limit, the whole session killed at the end. With
    ``check`` a non-zero exit raises :class:`WorkerError` with the output tail."""
    result = supervise([start(argv, env=worker_env(env))], [label], timeout, echo, what)
    if check and result.returncodes[0] != 0:
        raise WorkerError(exit_message(what, result.returncodes[0], result.output))
    return result


def exit_message(what: str, code: int | None, output: Sequence[str]) -> str:
    """The one wording of "a process failed": what, its exit code, and the failing worker's
    traceback when horovodrun's output holds one (:func:`worker_errors`), else the last lines."""
    return f"{what} exited with code {code}. " + worker_errors(output, limit=30)


def run_horovod(
    fn: Callable[..., Any],
    np: int,
    *,
    args: Sequence[Any] = (),
    timeout: float = 300.0,
    env: dict[str, str] | None = None,
    echo: bool = True,
    link: JobWrapper | None = None,
    hosts: str | None = None,
    horovod_args: Sequence[str] = (),
) -> list[Any]:
    """Run ``fn(*args)`` in ``np`` processes under ``horovodrun``; return each rank's value.

    ``fn`` calls ``hvd.init()`` itself, exactly as a training script would. ``link``, ``hosts``,
    ``horovod_args``: see :func:`horovodrun`.
    """
    with tempfile.TemporaryDirectory(prefix="multigpu-hvd-") as tmp:
        outdir = Path(tmp)
        job = outdir / "job.pkl"
        _dump_job(job, fn, args, None)
        result = horovodrun(
            [sys.executable, "-m", "multigpu.running._worker", "horovod", str(job), str(outdir)],
            np,
            timeout=timeout,
            env=env,
            echo=echo,
            check=False,
            link=link,
            hosts=hosts,
            horovod_args=horovod_args,
        )
        values = _read_values(outdir, np, [f"rank {r}" for r in range(np)], result, f"horovodrun -np {np}")
        if result.returncodes[0] != 0:
            raise WorkerError(exit_message(f"horovodrun -np {np}", result.returncodes[0], result.output))
        return values


def torchrun(
    argv: Sequence[str],
    nproc: int,
    *,
    timeout: float = 300.0,
    env: dict[str, str] | None = None,
    echo: bool = True,
) -> Any:
    """Run ``torchrun --standalone --nproc-per-node=N argv`` bounded in time (like :func:`horovodrun`).

    ``argv`` starts with the script (``["-m", "pkg.mod", ...]`` or ``["train.py", ...]``).
    """
    cmd = [executable("torchrun"), "--standalone", f"--nproc-per-node={nproc}", *argv]
    return run_command(cmd, label="torchrun", what=f"torchrun --nproc-per-node={nproc}", timeout=timeout,
                       env=job_env(nproc, {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), **(env or {})},
                                   echo), echo=echo)


def worker_errors(output: Sequence[str], limit: int = 25) -> str:
    """The workers' own traceback lines from ``horovodrun`` output (over Gloo ``[R]<stderr>:...``,
    over MPICH ``[R] ...``), without horovodrun's traceback of itself, so the learner sees what went
    wrong in the script."""
    pattern = re.compile(r"^(?:\[horovodrun\] )?\[(\d+)\](?:<stderr>:| )(.*)$")
    first: str | None = None
    picked: list[str] = []
    for line in output:
        m = pattern.match(line)
        if not m:
            continue
        rank, text = m.groups()
        if first is None and text.startswith("Traceback"):
            first = rank
        if first == rank:
            picked.append(text)
    if not picked:
        return "Last output:\n" + "\n".join(output[-limit:])
    errors = [t for t in picked if re.match(r"^[A-Za-z_.]*(Error|Exception|Interrupt|Exit)\b", t)]
    summary = f"Rank {first} failed with: {errors[-1]}\n" if errors else ""
    return summary + f"Traceback of rank {first}:\n" + "\n".join(picked[-limit:])
