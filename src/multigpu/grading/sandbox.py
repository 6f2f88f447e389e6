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
  Python, the venv and the package stay reachable for that account wherever they live: a folder on
  the way to them that it may not enter (pyenv under root's 700 HOME, HOME set elsewhere) is
  covered like a hidden one, and what they need is bound back through folders made open
  (:func:`closed_on_the_way`).

The time, output and memory bounds are the runner's (:mod:`multigpu.grading.runner`).
:func:`unavailable` says why the sandbox cannot start on this machine (None when it can), with
the cause it found: namespaces refused (:func:`namespaces_refused`) or Python out of the
account's reach (:func:`python_unreachable`);
``multigpu grade`` then still gives a verdict, marked unsandboxed, and certificates are refused.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import os
import pwd
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterable, Iterator
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


#: keyctl(2) and its arguments that find and empty a keyring (x86_64's system call numbers).
SYS_KEYCTL, KEYCTL_JOIN_SESSION_KEYRING, KEYCTL_CLEAR, KEYCTL_GET_PERSISTENT = 250, 1, 7, 22
KEY_SPEC_SESSION_KEYRING, KEY_SPEC_USER_KEYRING, KEY_SPEC_USER_SESSION_KEYRING = -3, -4, -5


def clear_keyrings(user: str | None = None) -> bool:
    """Empty the sandbox account's kernel keyrings (its persistent, user and user-session keyrings
    outlive every process of the account: a run could leave data there for the next grading to
    read; a kernel without persistent keyrings has only the other two).
    As root, in a child that becomes the account; whether both were emptied (False where this
    process is not root or the kernel has no keyrings)."""
    import ctypes

    account = run_as(user)
    if account is None or os.uname().machine != "x86_64":
        return False
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setgid(account.pw_gid)
            os.setuid(account.pw_uid)
            libc = ctypes.CDLL(None, use_errno=True)
            # a session keyring of its own, into which the persistent one is linked: possessed, it may be cleared
            libc.syscall(SYS_KEYCTL, KEYCTL_JOIN_SESSION_KEYRING, None)
            persistent = libc.syscall(SYS_KEYCTL, KEYCTL_GET_PERSISTENT, -1, KEY_SPEC_SESSION_KEYRING)
            ok = persistent < 0 or libc.syscall(SYS_KEYCTL, KEYCTL_CLEAR, persistent) == 0
            ok = all([ok, *(libc.syscall(SYS_KEYCTL, KEYCTL_CLEAR, ring) == 0
                            for ring in (KEY_SPEC_USER_KEYRING, KEY_SPEC_USER_SESSION_KEYRING))])
            os._exit(0 if ok else 1)
        except BaseException:
            os._exit(1)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


@contextlib.contextmanager
def fresh_keyrings(user: str | None = None) -> Iterator[None]:
    """Around a sandboxed run: the account's keyrings emptied before (nothing an earlier run left
    is this run's to read) and after (nor for a later one)."""
    clear_keyrings(user)
    try:
        yield
    finally:
        clear_keyrings(user)


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
        account = run_as()
    except KeyError as e:
        return f"the sandbox's account {e} does not exist: create it or set MULTIGPU_SANDBOX_USER"
    # first the namespaces alone, then the very command a grading uses (Python from the venv,
    # wherever the course lives): each failure has its own cause and fix
    empty = _probe(command([shutil.which("true") or "/bin/true"], workdir=Path("/"), writable=False), "")
    if empty is not None:
        return namespaces_refused(empty, account)
    socket = "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print('ok')"
    python = _probe(command([sys.executable, "-c", socket], workdir=Path("/"), writable=False), "ok")
    if python is not None:
        return python_unreachable(python, account)
    return None


def _probe(argv: list[str], expected: str) -> str | None:
    """None when ``argv`` exits 0 printing ``expected``; otherwise the last line it wrote."""
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return str(e)
    if out.returncode == 0 and out.stdout.strip() == expected:
        return None
    why = (out.stderr or out.stdout).strip().splitlines()
    return why[-1] if why else f"exit {out.returncode}"


def namespaces_refused(why: str, account: pwd.struct_passwd | None) -> str:
    """The cause and fix when bubblewrap cannot start even an empty command."""
    if account is None:
        return (f"bubblewrap cannot create its namespaces here ({why}): allow unprivileged user namespaces "
                "(sysctl kernel.unprivileged_userns_clone=1; on Ubuntu 24.04 also "
                "kernel.apparmor_restrict_unprivileged_userns=0) or grade as root")
    return (f"bubblewrap cannot create its namespaces here, even as root ({why}): the container or the kernel "
            "refuses mount and PID namespaces; run the grader where they are allowed (a container with "
            "CAP_SYS_ADMIN and a seccomp profile that permits unshare, or the host)")


def python_unreachable(why: str, account: pwd.struct_passwd | None) -> str:
    """The cause and fix when the sandbox starts but Python does not run in it."""
    who = f"the sandbox's account ({account.pw_name})" if account else "the sandbox"
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    # the folders above these are covered and opened (closed_on_the_way): what is left is inside
    for path in runtime_paths():
        for p in (path, path / "bin", path / "lib", path / "lib" / version, path / "lib" / version / "site-packages"):
            if account is not None and p.is_dir() and not readable_by(p, account):
                return (f"{who} cannot run Python ({why}): it may not read {p} "
                        f"(mode {stat.S_IMODE(p.stat().st_mode):o}, owner uid {p.stat().st_uid}); make Python, the venv "
                        f"and the course readable for it (chmod -R o+rX {p}) or set MULTIGPU_SANDBOX_USER to an "
                        "account that may read them")
    return (f"{who} cannot run Python ({why}): check that {sys.executable} runs from a clean environment "
            f"(env -i {sys.executable} -c 'import socket')")


def runtime_paths() -> list[Path]:
    """What a sandboxed run needs besides what the caller makes readable: Python, the venv, the package."""
    return [Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve(), layout.IMPORT_ROOT]


def traversable(folder: Path, account: pwd.struct_passwd) -> bool:
    """Whether ``account`` (with its own group only: the sandbox clears the others) may enter ``folder``."""
    st = folder.stat()
    if st.st_uid == account.pw_uid:
        return bool(st.st_mode & stat.S_IXUSR)
    if st.st_gid == account.pw_gid:
        return bool(st.st_mode & stat.S_IXGRP)
    return bool(st.st_mode & stat.S_IXOTH)


def readable_by(folder: Path, account: pwd.struct_passwd) -> bool:
    """Whether ``account`` may list and enter ``folder``."""
    st = folder.stat()
    bits = (stat.S_IRUSR | stat.S_IXUSR if st.st_uid == account.pw_uid else
            stat.S_IRGRP | stat.S_IXGRP if st.st_gid == account.pw_gid else stat.S_IROTH | stat.S_IXOTH)
    return st.st_mode & bits == bits


def closed_on_the_way(paths: Iterable[Path], account: pwd.struct_passwd | None) -> list[Path]:
    """The folders above ``paths`` that ``account`` may not enter (pyenv's Python under root's 700
    HOME, a venv under a private folder): the sandbox covers each and binds back what lies below
    through folders it makes open (none when the command runs as the caller, who reached them)."""
    if account is None:
        return []
    closed = {p for path in paths for p in path.parents if p.is_dir() and not traversable(p, account)}
    return sorted(closed)


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
    # what the submission needs to run (Python, the venv, the package), even under a hidden folder or
    # one the account may not enter (pyenv in ~, a course in /tmp): covered, then bound back
    needed = [*runtime_paths(), *(Path(p).resolve() for p in readable)]
    hide += closed_on_the_way([*needed, workdir], account)
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
