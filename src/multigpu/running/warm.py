"""Warm workers: start a job's Python processes as forks of one that has already imported torch
and Horovod, instead of fresh interpreters that each spend seconds importing them.

The first job of a process (a notebook's kernel, a test session) starts the warm parent
(:mod:`multigpu.running._zygote`); every later worker is a fork of it that takes on the command,
environment, folder and file descriptors of the process that asked (:mod:`._warm_client`). So
each job still gets fresh processes (nothing a job changes reaches the next), and everything
around them is what it always was: ``horovodrun`` and ``mpirun`` start the workers, the rendezvous
is Horovod's or torch.distributed's, and :func:`multigpu.running.supervisor.supervise` bounds them
with the same limits and kills them the same way (killing a worker's stand-in kills the worker).

:func:`python` is the command that starts such a Python (``[sys.executable]`` where warm workers
are off); :func:`warm_argv` rewrites a command that starts ``sys.executable``. Warm workers are
off with ``MULTIGPU_WARM=0``, and where the warm parent cannot start (no ``fork``, or it failed):
then every worker starts afresh, as before, and one line says so. Only the course's own jobs use
them; the grader's run of a learner's script never does (it starts in a sandbox, from nothing).
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import select
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path

#: Set to 0 to start every worker as a fresh Python.
ENV = "MULTIGPU_WARM"
#: Seconds the warm parent may take to import what it preloads.
START_TIMEOUT_S = 120.0
CLIENT = Path(__file__).with_name("_warm_client.py")


class WarmParent:
    """The warm parent of this process's workers, started on first use, kept until this process
    ends (it exits when its standard input, a pipe from here, closes)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.proc: subprocess.Popen | None = None
        self.folder: str | None = None
        self.unavailable: str | None = None
        self.told = False

    @property
    def socket(self) -> str:
        assert self.folder is not None
        return os.path.join(self.folder, "parent.sock")

    def ready(self) -> str | None:
        """The warm parent's socket, starting the parent if needed; None where there is none or
        ``MULTIGPU_WARM=0`` is set now (a parent already started waits for the next warm job)."""
        with self.lock:
            why = self.why_off()
            if why is None:
                if self.proc is not None and self.proc.poll() is None:
                    return self.socket
                if self.proc is not None:  # it died (killed, or crashed): start another
                    self.stop()
                why = self.start()
            if why:
                self.unavailable = why
                if not self.told:
                    self.told = True
                    print(f"warm workers unavailable ({why}): each worker starts a fresh Python", flush=True)
                return None
            return self.socket

    @staticmethod
    def why_off() -> str | None:
        if os.environ.get(ENV, "1") == "0":
            return f"{ENV}=0"
        if "fork" not in multiprocessing.get_all_start_methods() or not Path("/proc/self/fd").is_dir():
            return "this system has no fork start method"
        return None

    def start(self) -> str | None:
        """Start the parent and wait for its "ready"; why it failed, or None."""
        from multigpu.running.environment import worker_env

        self.folder = tempfile.mkdtemp(prefix="multigpu-warm-")  # mode 700: this account only
        python = os.environ.get("MULTIGPU_WARM_PYTHON", sys.executable)
        try:
            self.proc = subprocess.Popen([python, "-m", "multigpu.running._zygote", self.socket], env=worker_env(),
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=self.folder,
                                         start_new_session=True)
        except OSError as e:
            self.stop()
            return f"the warm parent did not start: {e}"
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], START_TIMEOUT_S)
        line = self.proc.stdout.readline() if ready else b""
        if line.strip() == b"ready":
            return None
        self.stop()
        return "the warm parent did not start" + (": it timed out" if not ready else f" (exit code {self.proc.poll()})")

    def stop(self) -> None:
        """End the parent (its workers with it) and remove its folder."""
        if self.proc is not None:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            if self.proc.stdout is not None:
                self.proc.stdout.close()
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
        self.proc = self.folder = None


PARENT = WarmParent()
atexit.register(PARENT.stop)


def python() -> list[str]:
    """The command that starts a Python for a job's worker: a warm one where it can."""
    sock = PARENT.ready()
    if sock is None:
        return [sys.executable]
    return [sys.executable, "-I", "-S", str(CLIENT), sock]


def warm_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` with a leading ``sys.executable`` (or the venv's ``horovodrun``, itself a Python
    script) started warm; any other command unchanged."""
    argv = list(argv)
    if not argv:
        return argv
    from multigpu.running.environment import executable

    if argv[0] == sys.executable:
        return [*python(), *argv[1:]]
    try:
        horovodrun = executable("horovodrun")
    except FileNotFoundError:
        return argv
    if argv[0] == horovodrun:
        return [*python(), *argv]
    return argv


def stop() -> None:
    """End the warm parent now (the next job starts another)."""
    PARENT.stop()
