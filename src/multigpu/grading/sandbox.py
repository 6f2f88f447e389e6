"""The sandbox every untrusted grading run goes through: bubblewrap (``bwrap``).

What a submission sees inside (:func:`command`):

- the whole file system READ-ONLY (``--ro-bind / /``): the course package, the venv, Python and
  the training data can be read and run, never changed;
- an empty, private HOME and ``/tmp`` (tmpfs): the grader's HOME, with the course's signing key,
  the data cache and the held-out set, is not there; neither is the course's ``grading/``
  folder (gradebook, other learners' submissions) nor any path the caller names as hidden;
- ONE writable folder, its own run folder (where its checkpoints go);
- no network but its own loopback (``--unshare-net``), its own PID namespace (it cannot see or
  signal the grader or anyone else; when the sandbox ends, every process in it dies), its own
  IPC namespace, no capabilities (``--cap-drop ALL``), no controlling terminal;
- a clean environment: PATH, HOME, the locale and the variables the grader passes, nothing
  else of the grader's.

The time, output and memory bounds are the runner's (:mod:`multigpu.grading.runner`).
:func:`unavailable` says why the sandbox cannot start on this machine (None when it can);
``multigpu grade`` then still gives a verdict, marked unsandboxed, and certificates are refused.
"""

from __future__ import annotations

import functools
import glob
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

from multigpu.core import layout

#: HOME inside the sandbox (on its private /tmp).
HOME = "/tmp/home"
#: Variables of the grader's environment a submission may see (everything else is dropped).
PASSED_VARS = ("LANG", "LC_ALL", "TZ", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_CORETYPE",
               "OPENBLAS_L2_SIZE", "MULTIGPU_QUICK", "MULTIGPU_FORCE_CPU", "CUDA_VISIBLE_DEVICES")


def bwrap() -> str | None:
    return shutil.which("bwrap")


@functools.lru_cache(maxsize=1)
def unavailable() -> str | None:
    """None when the sandbox starts here; otherwise why not (in words an operator can act on)."""
    exe = bwrap()
    if exe is None:
        return ("bubblewrap (bwrap) is not installed: 'make setup' installs it as root "
                "(apt-get install bubblewrap); without it grading is not sandboxed")
    # the very command a grading uses (Python from the venv, wherever the course lives)
    probe = command([sys.executable, "-c", "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print('ok')"],
                    workdir=Path("/"), writable=False)
    try:
        out = subprocess.run(probe, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"bubblewrap did not start: {e}"
    if out.returncode != 0 or out.stdout.strip() != "ok":
        why = (out.stderr or out.stdout).strip().splitlines()
        return ("bubblewrap cannot create its namespaces here (" + (why[-1] if why else f"exit {out.returncode}")
                + "): allow unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1) "
                "or grade as root")
    return None


def command(
    argv: list[str],
    *,
    workdir: Path,
    readable: Iterable[os.PathLike | str] = (),
    hidden: Iterable[os.PathLike | str] = (),
    writable: bool = True,
) -> list[str]:
    """``argv`` wrapped in bubblewrap with the rules of the module doc.

    ``workdir`` is the one writable folder (and the working directory); ``readable`` are paths
    that must stay visible read-only even where they lie under a hidden folder (the training
    set under the hidden data cache); ``hidden`` are folders replaced by an empty tmpfs (the key's
    folder, ``grading/``, the held-out set, ...). The grader's HOME and ``/tmp`` are always hidden.
    """
    exe = bwrap()
    if exe is None:
        raise RuntimeError("bubblewrap (bwrap) is not installed")
    workdir = Path(workdir).resolve()
    home = Path.home().resolve()
    hide = [Path("/tmp"), home, *(Path(h).resolve() for h in hidden)]
    # what the submission needs to run, even where it lies under a hidden folder (pyenv in ~, the
    # course and its venv checked out in ~ or in /tmp): Python, the venv, the package
    needed = [Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve(), layout.IMPORT_ROOT]
    needed += [Path(p).resolve() for p in readable]
    args = [exe, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    # GPU mode: the new /dev has no GPU; bind the NVIDIA device nodes back (written without a
    # GPU to test on: the gpu profile is marked UNMEASURED until someone grades on one)
    for node in sorted(glob.glob("/dev/nvidia*")):
        args += ["--dev-bind", node, node]
    def cover(h: Path) -> list[str]:
        """An empty tmpfs over a hidden folder, /dev/null over a hidden file."""
        return ["--tmpfs", str(h)] if h.is_dir() else ["--ro-bind", "/dev/null", str(h)] if h.exists() else []

    for h in sorted(set(hide), key=lambda p: len(p.parts)):  # outer folders first
        args += cover(h)
    # what the submission needs comes back read-only where a hidden folder covered it
    back = [n for n in dict.fromkeys(needed) if n.exists() and any(h in n.parents for h in hide)]
    for n in sorted(back, key=lambda p: len(p.parts)):
        args += ["--ro-bind", str(n), str(n)]
    # and what is hidden inside those is hidden again (grading/ of a course checked out in ~, a
    # file of a venv in /tmp), folders and files alike
    for h in hide:
        if any(n in h.parents for n in back):
            args += cover(h)
    args += ["--dir", HOME]
    if writable:
        args += ["--bind", str(workdir), str(workdir)]
    args += ["--chdir", str(workdir),
             "--unshare-net", "--unshare-pid", "--unshare-ipc",  # (a new host name does not resolve: Gloo crashes)
             "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--"]
    return args + list(argv)


def environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a sandboxed run: a clean PATH with the venv first, HOME inside the
    sandbox, the package importable, the course's Horovod settings (``launch.horovod_defaults``:
    the same for every submission), the few variables of :data:`PASSED_VARS`, and ``extra``."""
    from multigpu.core import devices
    from multigpu.running import launch

    venv_bin = str(Path(sys.executable).parent)
    env = launch.horovod_defaults(True if devices.cpu_forced({**os.environ, **(extra or {})}) else None)
    env.update({k: os.environ[k] for k in PASSED_VARS if k in os.environ})
    env.update({
        "PATH": f"{venv_bin}:/usr/local/bin:/usr/bin:/bin",
        "HOME": HOME,
        "TMPDIR": "/tmp",
        "PYTHONPATH": str(layout.IMPORT_ROOT),
        "PYTHONUNBUFFERED": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "MULTIGPU_PLAIN_PROGRESS": "1",
        "MPLCONFIGDIR": f"{HOME}/.matplotlib",
    })
    if extra:
        env.update({k: str(v) for k, v in extra.items()})
    return env
