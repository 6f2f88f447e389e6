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
  else of the grader's;
- an unprivileged account when the grader runs as root (the workshop hub's grading service, an
  instructor's ``make autograde`` as root): bubblewrap sets the sandbox up as root, then the
  submission runs as :data:`SANDBOX_USER` (``$MULTIGPU_SANDBOX_USER``) with no capability, so it
  reads only what every account may read (not ``/etc/shadow``, not a signing key kept outside
  HOME); ``/run`` (root's sockets) and the course checkout's ``solutions/`` are hidden as well.

The time, output and memory bounds are the runner's (:mod:`multigpu.grading.runner`).
:func:`unavailable` says why the sandbox cannot start on this machine (None when it can);
``multigpu grade`` then still gives a verdict, marked unsandboxed, and certificates are refused.
"""

from __future__ import annotations

import functools
import glob
import os
import pwd
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

from multigpu.core import layout

#: HOME inside the sandbox (on its private /tmp).
HOME = "/tmp/home"
#: The account a submission runs as when the grader is root (``$MULTIGPU_SANDBOX_USER`` names another).
SANDBOX_USER = "nobody"
#: Variables of the grader's environment a submission may see (everything else is dropped).
PASSED_VARS = ("LANG", "LC_ALL", "TZ", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_CORETYPE",
               "OPENBLAS_L2_SIZE", "MULTIGPU_QUICK", "MULTIGPU_FORCE_CPU", "CUDA_VISIBLE_DEVICES")


def bwrap() -> str | None:
    return shutil.which("bwrap")


def run_as(user: str | None = None) -> pwd.struct_passwd | None:
    """The account a sandboxed command runs as: ``user``, else :data:`SANDBOX_USER` when this
    process is root; None when it runs as the caller (not root: bubblewrap's user namespace)."""
    if os.geteuid() != 0:
        if user is not None:
            raise PermissionError(f"running a sandboxed command as {user} needs root")
        return None
    return pwd.getpwnam(user or os.environ.get("MULTIGPU_SANDBOX_USER") or SANDBOX_USER)


def give_workdir(workdir: Path, user: str | None = None) -> None:
    """Make ``workdir`` and the folders the grader made in it before the run (the observers'
    checkpoint folder) the sandboxed account's, so the run can write its checkpoints there."""
    account = run_as(user)
    if account is None:
        return
    os.chown(workdir, account.pw_uid, account.pw_gid)
    with os.scandir(workdir) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                os.chown(entry.path, account.pw_uid, account.pw_gid, follow_symlinks=False)


def always_hidden() -> list[Path]:
    """What no sandboxed command sees, whoever calls: ``/tmp`` (a private one instead), the
    caller's HOME, ``/run`` and the course checkout's ``solutions/``."""
    hidden = [Path("/tmp"), Path.home().resolve(), Path("/run")]
    try:
        hidden.append(layout.course_root() / layout.SOLUTIONS)
    except FileNotFoundError:  # the package without its checkout: no solutions on this machine
        pass
    return hidden


@functools.lru_cache(maxsize=1)
def unavailable() -> str | None:
    """None when the sandbox starts here; otherwise why not (in words an operator can act on)."""
    exe = bwrap()
    if exe is None:
        return ("bubblewrap (bwrap) is not installed: 'make setup' installs it as root "
                "(apt-get install bubblewrap); without it grading is not sandboxed")
    if os.geteuid() == 0 and not shutil.which("setpriv"):
        return "setpriv (util-linux) is not installed: as root, the sandbox needs it to drop to an unprivileged account"
    try:
        run_as()
    except KeyError as e:
        return f"the sandbox's account {e} does not exist: create it or set MULTIGPU_SANDBOX_USER"
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


def _cover(h: Path) -> list[str]:
    """An empty tmpfs over a hidden folder (``/tmp`` writable by all), /dev/null over a hidden file."""
    perms = ["--perms", "1777"] if h == Path("/tmp") else []
    return [*perms, "--tmpfs", str(h)] if h.is_dir() else ["--ro-bind", "/dev/null", str(h)] if h.exists() else []


def _way_in(path: Path, hide: list[Path], made: set[Path]) -> list[str]:
    """The folders between a hidden folder and ``path`` bound back inside it, made traversable for
    the unprivileged account (bubblewrap makes them 700, root's); each once (``made``)."""
    args: list[str] = []
    for p in reversed(path.parents):
        if p not in made and any(h in p.parents for h in hide):
            made.add(p)
            args += ["--perms", "0755", "--dir", str(p)]
    return args


def command(
    argv: list[str],
    *,
    workdir: Path,
    readable: Iterable[os.PathLike | str] = (),
    hidden: Iterable[os.PathLike | str] = (),
    writable: bool = True,
    user: str | None = None,
) -> list[str]:
    """``argv`` wrapped in bubblewrap with the rules of the module doc.

    ``workdir`` is the one writable folder (and the working directory); ``readable`` are paths
    that must stay visible read-only even where they lie under a hidden folder (the training
    set under the hidden data cache); ``hidden`` are folders replaced by an empty tmpfs (the key's
    folder, ``grading/``, the held-out set, ...), besides :func:`always_hidden`. As root, ``argv``
    runs as ``user`` (default :data:`SANDBOX_USER`, :func:`run_as`), which must own ``workdir``
    to write there (:func:`give_workdir`).
    """
    exe = bwrap()
    if exe is None:
        raise RuntimeError("bubblewrap (bwrap) is not installed")
    workdir = Path(workdir).resolve()
    account = run_as(user)
    hide = [*always_hidden(), *(Path(h).resolve() for h in hidden)]
    # what the submission needs to run, even where it lies under a hidden folder (pyenv in ~, the
    # course and its venv checked out in ~ or in /tmp): Python, the venv, the package
    needed = [Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve(), layout.IMPORT_ROOT]
    needed += [Path(p).resolve() for p in readable]
    args = [exe, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--perms", "1777", "--tmpfs", "/dev/shm"]
    # GPU mode: the new /dev has no GPU; bind the NVIDIA device nodes back (written without a
    # GPU to test on: the gpu profile is marked UNMEASURED until someone grades on one)
    for node in sorted(glob.glob("/dev/nvidia*")):
        args += ["--dev-bind", node, node]
    for h in sorted(set(hide), key=lambda p: (len(p.parts), str(p))):  # outer folders first
        if not any(o in h.parents for o in hide):  # one inside another hidden folder is covered with it
            args += _cover(h)
    # what the submission needs comes back read-only where a hidden folder covered it
    back = [n for n in dict.fromkeys(needed) if n.exists() and any(h in n.parents for h in hide)]
    made: set[Path] = set()
    for n in sorted(back, key=lambda p: len(p.parts)):
        args += [*_way_in(n, hide, made), "--ro-bind", str(n), str(n)]
    # and what is hidden inside those is hidden again (grading/ of a course checked out in ~, a
    # file of a venv in /tmp), folders and files alike
    for h in hide:
        if any(n in h.parents for n in back):
            args += _cover(h)
    args += ["--perms", "1777", "--dir", HOME]  # the only account inside may write it
    if writable:
        args += [*_way_in(workdir, hide, made), "--bind", str(workdir), str(workdir)]
    args += ["--unshare-net", "--unshare-pid", "--unshare-ipc",  # (a new host name does not resolve: Gloo crashes)
             "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    if account is None:
        return [*args, "--chdir", str(workdir), "--", *argv]
    # root sets the sandbox up; the command runs as the account: setpriv needs these two
    # capabilities to change to it (a change of every uid from root clears them all), and it
    # enters workdir as the account (root without capabilities may not enter the account's folder)
    return [*args, "--chdir", "/", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--",
            shutil.which("setpriv") or "setpriv", f"--reuid={account.pw_uid}", f"--regid={account.pw_gid}",
            "--clear-groups", "--inh-caps=-all", "--", shutil.which("env") or "env", f"--chdir={workdir}", *argv]


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
