"""How a fork of the warm parent (:mod:`multigpu.running._zygote`) becomes the process its client
asked for: the client's session of its own, file descriptors, folder, umask, limits, signals,
environment, ``sys.path`` and standard streams; then the command runs as ``python`` runs it, and
the process exits the way ``python`` exits (non-daemon threads joined, ``atexit`` run, streams
flushed, the status of ``SystemExit`` or 1 after a traceback)."""

from __future__ import annotations

import atexit
import builtins
import contextlib
import ctypes
import fcntl
import importlib
import io
import os
import resource
import runpy
import signal
import site
import sys
import threading
import traceback
import types
from typing import Any, NoReturn

#: The warm parent's own start: its first ``sys.path`` entry and its PYTHONPATH's entries, which a
#: child replaces with its client's.
PARENT_PATH0 = sys.path[0] if sys.path else ""
PARENT_PYTHONPATH = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
PARENT_THREADS_ENV = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
FORWARDED_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")
PR_SET_PDEATHSIG = 1


def run(request: dict, fds: list[int]) -> NoReturn:
    code = 1
    try:
        take_process(request, fds)
        code = execute(request)
    except BaseException:  # the set-up itself failed: say so where the client reads
        with contextlib.suppress(Exception):
            traceback.print_exc()
    finish(code)


def take_process(request: dict, fds: list[int]) -> None:
    os.setsid()  # its own process group and session, as a job's processes have
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    install_fds(request["fds"], fds)
    reset_signals(request.get("ignored", []))
    os.chdir(request["cwd"])
    os.umask(request["umask"])
    for name, (soft, hard) in request.get("limits", {}).items():
        with contextlib.suppress(ValueError, OSError, AttributeError):
            if resource.getrlimit(getattr(resource, name)) != (soft, hard):
                resource.setrlimit(getattr(resource, name), (soft, hard))
    os.environ.clear()
    os.environ.update(request["env"])
    set_path(request)
    set_streams(request)
    for folder in site.getsitepackages():  # the .pth lines a fresh Python runs at start, with this environment
        if os.path.isdir(folder):
            site.addsitedir(folder)
    if "numpy" in sys.modules:  # a fresh process seeds NumPy's global generator from the OS
        sys.modules["numpy"].random.seed()
    threads = [os.environ.get(k) for k in PARENT_THREADS_ENV if os.environ.get(k) != PARENT_THREADS_ENV[k]]
    if threads and threads[0] and threads[0].isdigit():  # torch reads it when loaded: apply it now
        sys.modules["torch"].set_num_threads(int(threads[0]))


def install_fds(numbers: list[int], received: list[int]) -> None:
    """Give the client's descriptors their numbers and close every other one."""
    floor = max([*numbers, *received, 2]) + 1
    moved = [fcntl.fcntl(fd, fcntl.F_DUPFD, floor) for fd in received]
    for fd in received:
        os.close(fd)
    for number, fd in zip(numbers, moved):
        os.dup2(fd, number, inheritable=True)
        os.close(fd)
    keep = set(numbers)
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd not in keep:
            with contextlib.suppress(OSError):
                os.close(fd)


def reset_signals(ignored: list[str]) -> None:
    for name in (*FORWARDED_SIGNALS, "SIGCHLD", "SIGALRM"):
        signal.signal(getattr(signal, name), signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for name in ignored:  # ignored in the client, so ignored in a fresh Python too
        signal.signal(getattr(signal, name), signal.SIG_IGN)


def set_path(request: dict) -> None:
    """``sys.path`` as a fresh ``python`` with the client's PYTHONPATH would have it."""
    mode, target = request["mode"], request["target"]
    first = {"module": request["cwd"], "code": "", "script": os.path.dirname(os.path.realpath(target))}[mode]
    ours = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    rest = [p for p in sys.path[1:] if p not in PARENT_PYTHONPATH]
    sys.path[:] = [first, *ours, *rest]
    importlib.invalidate_caches()


def set_streams(request: dict) -> None:
    unbuffered = request.get("unbuffered", False) or bool(os.environ.get("PYTHONUNBUFFERED"))
    encoding, _, errors = (os.environ.get("PYTHONIOENCODING") or "utf-8").partition(":")

    def stream(fd: int, write: bool, errors: str, line: bool) -> io.TextIOWrapper | None:
        try:
            raw = io.FileIO(fd, "w" if write else "r", closefd=False)
        except OSError:
            return None  # closed in the client: None, as in a fresh Python
        buffer: Any = raw
        if not (write and unbuffered):
            buffer = io.BufferedWriter(raw) if write else io.BufferedReader(raw)
        return io.TextIOWrapper(buffer, encoding=encoding or "utf-8", errors=errors, line_buffering=line,
                                write_through=write and unbuffered)

    sys.stdin = sys.__stdin__ = stream(0, False, errors or "strict", False)  # type: ignore[misc]
    sys.stdout = sys.__stdout__ = stream(1, True, errors or "strict", os.isatty(1))  # type: ignore[misc]
    sys.stderr = sys.__stderr__ = stream(2, True, "backslashreplace", True)  # type: ignore[misc]


def execute(request: dict) -> int:
    """Run the command as ``python`` does; its exit status (negative: killed by that signal)."""
    mode, target, args = request["mode"], request["target"], request["args"]
    try:
        if mode == "module":
            sys.modules.pop(target, None)  # run afresh as __main__, as `python -m` runs it
            sys.argv = [target, *args]
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        elif mode == "script":
            sys.argv = [target, *args]
            runpy.run_path(target, run_name="__main__")
        else:
            sys.argv = ["-c", *args]
            main = types.ModuleType("__main__")
            main.__dict__["__builtins__"] = builtins
            sys.modules["__main__"] = main
            exec(compile(target, "<string>", "exec"), main.__dict__)
        return 0
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            return stop.code or 0
        print(stop.code, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        traceback.print_exc()
        return -signal.SIGINT
    except BaseException:
        sys.excepthook(*sys.exc_info())
        return 1


def finish(code: int) -> NoReturn:
    """Leave as the interpreter leaves: threads joined, ``atexit`` run, streams flushed."""
    with contextlib.suppress(BaseException):
        threading._shutdown()  # type: ignore[attr-defined]
    with contextlib.suppress(BaseException):
        atexit._run_exitfuncs()
    for s in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):
            if s is not None:
                s.flush()
    if code < 0:  # died of a signal, as a fresh Python would
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code & 0xFF)
