"""What a worker process starts with: its environment (:func:`worker_env`, :func:`job_env`), the
course's Horovod settings (:func:`horovod_controller`, :func:`horovod_defaults`), the command that
starts Horovod's workers (:func:`horovodrun_command`) and the venv's executables.

The launchers of :mod:`multigpu.running.launch` start every job with these; the names are
importable from there as well.
"""

from __future__ import annotations

import functools
import os
import shutil
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

from multigpu.core import layout


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


#: What a job's workers never get from the process that starts them: a JupyterHub server's token,
#: OAuth client and cookie settings (``horovodrun --gloo`` writes its workers' whole environment on
#: a command line; no worker needs to speak for the learner to the hub).
SECRET_PREFIXES = ("JUPYTERHUB_", "JPY_")


def without_secrets(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if not k.startswith(SECRET_PREFIXES)}


def worker_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for workers: :func:`horovod_defaults`, then ours without the hub's secrets
    (:data:`SECRET_PREFIXES`), with this package importable, the venv's tools first on ``PATH``
    (``horovodrun`` starts the venv's ``mpirun``) and output unbuffered. ``extra`` overrides
    variables; a ``PYTHONPATH`` in it goes after this package's folder and before the inherited one."""
    from multigpu.core import devices

    extra = {k: str(v) for k, v in (extra or {}).items()}
    env = {**horovod_defaults(True if devices.cpu_forced({**os.environ, **extra}) else None),
           **without_secrets(dict(os.environ))}
    paths = [str(layout.IMPORT_ROOT), extra.pop("PYTHONPATH", ""), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    env["PATH"] = os.pathsep.join(p for p in (str(Path(sys.executable).parent), env.get("PATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("MULTIGPU_PLAIN_PROGRESS", "1")
    env.update(extra)
    return env
