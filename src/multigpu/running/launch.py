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

Each waits with :func:`multigpu.running.supervisor.supervise` and starts its processes with
:mod:`multigpu.running.environment`'s settings; the names callers use from those two (``supervise``,
``JobResult``, ``WorkerError``, ``worker_env``, ``horovod_controller``, ...) are importable from here too.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import cloudpickle

from multigpu.running import warm

# the watcher's names and the workers' environment, importable from here too
from multigpu.running.environment import CPU_FUSION_THRESHOLD as CPU_FUSION_THRESHOLD
from multigpu.running.environment import executable, horovodrun_command, job_env, worker_env
from multigpu.running.environment import free_port as free_port
from multigpu.running.environment import horovod_controller as horovod_controller
from multigpu.running.environment import horovod_defaults as horovod_defaults
from multigpu.running.supervisor import CRASH_GRACE_S as CRASH_GRACE_S
from multigpu.running.supervisor import MAX_LINE_BYTES as MAX_LINE_BYTES
from multigpu.running.supervisor import MAX_PRINTED_LINES as MAX_PRINTED_LINES
from multigpu.running.supervisor import TAIL_BYTES as TAIL_BYTES
from multigpu.running.supervisor import JobResult, WorkerError, start, supervise
from multigpu.running.supervisor import WorkerTimeout as WorkerTimeout
from multigpu.running.supervisor import kill_sessions as kill_sessions


class JobWrapper(Protocol):
    """What runs a whole job inside it: :class:`multigpu.labs.lab4.links.EmulatedLink` (a network namespace
    behind an emulated link) is one."""

    def why_unavailable(self) -> str | None:
        """None where the wrapper works on this machine, else why not and what to do."""

    def wrap(self, argv: Sequence[str]) -> list[str]:
        """The command that runs ``argv`` inside the wrapper."""


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
        python = warm.python()
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
            procs.append(start([*python, "-m", "multigpu.running._worker", "run", str(job), str(outdir)], env=rank_env))
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
    # a job behind an emulated link runs in the link's namespaces, where no warm parent lives
    started = warm.warm_argv if link is None else list
    cmd = started([*horovodrun_command(np, hosts, horovod_args), *started(argv)])
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
