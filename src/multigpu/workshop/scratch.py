"""A whole workshop hub in a temporary root, for tests and for the room load test
(``multigpu workshop load``): its own accounts (an instructor and learners, tagged so that
several scratch hubs can share a machine), its own free ports, its own signing key; everything
it made (accounts, servers, the proxy, cgroups, folders) is removed at the end.

    with scratch_hub("mgt123", ["mgt123a", "mgt123b"], python=HUB_PY) as hub:
        hub.base                 # http(s)://127.0.0.1:PORT, the address learners open
        hub.learners["mgt123a"]  # the one-time password from the sheet
        hub.restart()            # the hub process only: proxy, servers and kernels keep running
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from multigpu.workshop import accounts, disks, limits, netns, serverlog
from multigpu.workshop.layout import Hub

#: Where scratch hubs' roots go: not /tmp, which each learner's server sees as its own.
SCRATCH_PARENT = Path("/srv/multigpu-scratch")

#: Seconds a hub may take to answer after its start on a busy 2-core machine.
START_S = 180
#: The operator's settings a scratch hub takes from the caller's environment (``make hub-load``'s).
PASSED = ("MULTIGPU_SPAWN_LIMIT", "MULTIGPU_GRADING_CORES", "MULTIGPU_LEARNER_CPUS", "MULTIGPU_LEARNER_MEM_GB",
          "MULTIGPU_CULL_TIMEOUT", "MULTIGPU_CULL_EVERY", "MULTIGPU_ACTIVITY_INTERVAL", "MULTIGPU_BUSY_INTERVAL",
          "MULTIGPU_GRADING_TIMEOUT", "MULTIGPU_LEARNER_PIDS", "MULTIGPU_GRADING_PIDS", "MULTIGPU_GRADING_MEM_GB",
          "MULTIGPU_SANDBOX_USER")


def sheet_passwords(text: str) -> dict[str, str]:
    """``{login: password}`` from the sheet ``multigpu workshop add-learners`` prints."""
    return dict(re.findall(r"^(\S+)\s+([a-z2-9]{4}-[a-z2-9]{4}-[a-z2-9]{4})$", text, re.M))


@dataclass
class ScratchHub:
    root: Path
    env: dict[str, str]
    base: str
    instructor: str
    python: str
    learners: dict[str, str] = field(default_factory=dict)  # login -> password
    instructor_password: str = ""
    proc: Any = None
    #: the certificate a client checks the hub's TLS against (None: plain HTTP)
    verify: str | None = None
    #: the network namespace the hub and its proxy run in ("": the box's own; ``netns``)
    netns: str = ""

    @property
    def hub(self) -> Hub:
        return Hub(self.root)

    @property
    def log(self) -> Path:
        return self.root / "hub.log"

    def cli(self, *args: str, timeout: float = 300) -> str:
        out = subprocess.run([self.python, "-m", "multigpu.cli", "workshop", *args], env=self.env,
                             capture_output=True, text=True, timeout=timeout)
        if out.returncode != 0:
            raise RuntimeError(f"multigpu workshop {' '.join(args)} failed:\n{out.stdout}\n{out.stderr}")
        return out.stdout

    def start(self, timeout: float = START_S) -> None:
        """Start the hub (``multigpu workshop hub``) and wait until its API answers."""
        import requests

        from multigpu.running import launch

        os.close(os.open(self.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))  # root's alone: it logs xsrf values
        os.chmod(self.log, 0o600)
        inside = netns.prefix(self.netns) if self.netns else []
        self.proc = launch.start([*inside, "sh", "-c", f'exec "$0" -m multigpu.cli workshop hub --instructor {self.instructor} '
                                  f'>>"{self.log}" 2>&1', self.python], env=self.env, capture=False)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the hub exited ({self.proc.returncode}):\n{self.tail()}")
            try:
                if self.call(requests.get, self.base + "/hub/api", timeout=5, verify=self.verify or True).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"the hub did not answer within {timeout:.0f} s:\n{self.tail()}")

    def call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` where the hub's address is reachable (inside its namespace, if any)."""
        return netns.call_in(self.netns, fn, *args, **kwargs) if self.netns else fn(*args, **kwargs)

    def stop(self) -> None:
        """Stop the hub process (SIGTERM, as Ctrl-C would); what it leaves running stays."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)

    def restart(self) -> None:
        self.stop()
        self.start()

    def tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else "(no hub log)"

    def as_user(self, user: str, *argv: str, cwd: Path | None = None, check: bool = True,
                timeout: float = 300) -> subprocess.CompletedProcess:
        """Run ``argv`` as ``user`` the way their server would: their uid and groups, their home,
        the hub's environment and, for learners, the learners' Jupyter config."""
        import pwd

        pw = pwd.getpwnam(user)
        env = {"HOME": pw.pw_dir, "USER": user, "PATH": self.env["PATH"], "MULTIGPU_QUICK": "1"}
        if user != self.instructor:
            env["JUPYTER_CONFIG_PATH"] = str(self.hub.learner_config)
        out = subprocess.run(["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--init-groups", "--", *argv],
                             cwd=cwd or pw.pw_dir, env=env, capture_output=True, text=True, timeout=timeout)
        if check and out.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} as {user} failed:\n{out.stdout}\n{out.stderr}")
        return out

    def nbgrader(self, user: str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
        return self.as_user(user, str(Path(self.python).parent / "nbgrader"), *args, cwd=cwd)

    def release(self, assignment: str) -> None:
        """What the formgrader's Generate and Release buttons run, as the instructor (``make hub-release``)."""
        self.cli("release", assignment, "--instructor", self.instructor)

    def proxy_pid(self) -> int | None:
        try:
            return int((self.hub.state / "proxy.pid").read_text().strip())
        except (OSError, ValueError):
            return None


def hub_env(root: Path, python: str, instructor: str, key: Path, **extra: str) -> dict[str, str]:
    """The environment ``make hub`` would give a hub in ``root``, on free ports."""
    from multigpu.running import launch

    ports = [launch.free_port() for _ in range(4)]
    return {"MULTIGPU_HUB_ROOT": str(root), "MULTIGPU_CERTIFICATE_KEY": str(key),
            "MULTIGPU_HUB_PORT": str(ports[0]), "MULTIGPU_HUB_INTERNAL_PORT": str(ports[1]),
            "MULTIGPU_PROXY_API_PORT": str(ports[2]), "MULTIGPU_GRADING_PORT": str(ports[3]),
            "MULTIGPU_HUB_INSTRUCTORS": instructor, "MULTIGPU_QUICK": "1",
            "PATH": f"{Path(python).parent}:/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8",
            **{k: v for k, v in os.environ.items() if k in PASSED}, **extra}


@contextlib.contextmanager
def scratch_hub(tag: str, learners: list[str], *, python: str = sys.executable, profile: str = "quick",
                tls: bool = False, start: bool = True, namespace: str = "", **extra_env: str) -> Iterator[ScratchHub]:
    """A hub in a temporary root with the instructor ``<tag>i`` and ``learners`` (see the module doc).
    ``tls``: a self-signed pair made by ``multigpu workshop tls``, served over HTTPS. ``namespace``:
    the hub and its proxy run in that network namespace (``ScratchHub.call`` reaches them)."""
    SCRATCH_PARENT.mkdir(mode=0o755, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix=f"multigpu-hub-{tag}-", dir=SCRATCH_PARENT))
    os.chmod(root, 0o755)
    keys = Path(tempfile.mkdtemp(prefix="multigpu-hub-key-"))
    instructor = f"{tag}i"
    env = hub_env(root, python, instructor, keys / "course-key.pem", MULTIGPU_GRADING_PROFILE=profile, **extra_env)
    scheme = "https" if tls else "http"
    h = ScratchHub(root, env, f"{scheme}://127.0.0.1:{env['MULTIGPU_HUB_PORT']}", instructor, python, netns=namespace)
    stopped = terminate_by_exception()
    try:
        if tls:
            cert, key = root / "tls" / "hub.crt", root / "tls" / "hub.key"
            h.cli("tls", "--cert", str(cert), "--key", str(key), "--host", "127.0.0.1")
            env.update(MULTIGPU_HUB_TLS_CERT=str(cert), MULTIGPU_HUB_TLS_KEY=str(key))
            h.verify = str(cert)
        said = h.cli("setup", "--instructor", instructor)
        assert not sheet_passwords(said), "the instructor's password was printed"
        h.instructor_password = dict(line.split(",") for line in Hub(root).instructor_sheet.read_text().split()[1:])[instructor]
        names = root / "room.csv"
        names.write_text("login\n" + "".join(f"{n}\n" for n in learners))
        h.learners = sheet_passwords(h.cli("add-learners", "--csv", str(names), timeout=60 + 10 * len(learners)))
        if sorted(h.learners) != sorted(learners):
            raise RuntimeError(f"the sheet lists {sorted(h.learners)}, not {sorted(learners)}")
        if start:
            h.start()
        yield h
    finally:
        h.stop()
        run = [python, "-m", "multigpu.cli", "workshop"]
        subprocess.run([*run, "stop"], env=env, capture_output=True, timeout=120)
        subprocess.run([*run, "remove-learners", *learners], env=env, capture_output=True, timeout=120 + 5 * len(learners))
        with open("/etc/passwd") as f:
            if any(line.startswith(instructor + ":") for line in f):
                accounts.stop_processes(instructor)
                subprocess.run([shutil.which("userdel", path=accounts.SYSTEM_PATH) or "/usr/sbin/userdel", "--remove",
                                instructor], capture_output=True)
        for name in [*learners, instructor]:
            limits.release(f"user-{name}")
        (serverlog.BUDGETS / instructor).unlink(missing_ok=True)  # the learners' went with their accounts
        disks.detach_exchange(Hub(root))
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(keys, ignore_errors=True)
        if stopped is not None:
            signal.signal(signal.SIGTERM, stopped)


def terminate_by_exception() -> signal.Handlers | None:
    """A SIGTERM (``timeout``, a CI runner stopping the job) raised as SystemExit in the main
    thread, so a scratch hub's teardown runs (its accounts, mounts and processes removed); the
    handler it replaced, or None where it could not (not the main thread, a handler already set)."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        return None

    def stop(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    return signal.SIG_DFL
