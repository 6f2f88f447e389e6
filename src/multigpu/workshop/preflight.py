"""``make hub-check`` (``multigpu workshop check --learners N``): what this box lacks for a room of N,
before the room arrives. Each check says OK, WARN (the hub runs, with less than it should) or FAIL
(fix it first), and what to do; the exit status is 1 when any check failed.

Room size (the README's formula): CPU from the labs' own measurements (``multigpu workshop
measure-labs``, docs/workshop.md): a pass over the labs at a day's own pace is 0.19 cores per
learner on average, :data:`LEARNERS_PER_CORE` learners per learner core; a room running the
4-worker labs in step needs a learner core per learner (fewer make every run slower in
proportion: a WARN). Memory: :data:`BASE_GB` for the system, the hub and one grading, plus each
learner's server with its kernel (:data:`IDLE_GB`, the room load test's idle PSS), plus the
largest lab's peak (:data:`LAB_PEAK_GB`, Lab 3) for the one learner in :data:`LEARNERS_PER_CORE`
who is running a job at any moment.
"""

from __future__ import annotations

import math
import os
import shutil
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

from multigpu.workshop import copies, limits, proxy, tls
from multigpu.workshop.layout import Hub

#: Learners per learner core at a day's own pace (0.19 cores each: docs/workshop.md, "What a room needs").
LEARNERS_PER_CORE = 5
#: A learner's server and kernel after Lab 0's check (torch and Horovod imported), PSS, rounded up
#: (the room load test, docs/workshop.md "Measured").
IDLE_GB = 0.2
#: The largest peak of a lab at its default parameters (Lab 3, 2.9 GiB: measure-labs).
LAB_PEAK_GB = 2.9
#: The system, the hub and one grading (an official grading runs 4 workers and a baseline).
BASE_GB = 4.0
#: Disk per learner: the generated data set (70 MB) and the labs' run records and checkpoints.
DISK_GB_PER_LEARNER = 1.0


def need_gb(learners: int) -> float:
    return BASE_GB + learners * IDLE_GB + math.ceil(learners / LEARNERS_PER_CORE) * LAB_PEAK_GB


@dataclass
class Check:
    name: str
    state: str  # OK, WARN or FAIL
    detail: str

    def line(self) -> str:
        return f"{self.state:4s}  {self.name:18s} {self.detail}"


def memory_gb() -> float:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 2**20
    return 0.0


def room(learners: int, learner_cores: list[int], grading_cores: list[int]) -> list[Check]:
    own_pace = learners / LEARNERS_PER_CORE
    shared = learner_cores == grading_cores
    have = len(learner_cores)
    where = f"{have} learner core(s){'' if shared else f', {len(grading_cores)} kept for grading'}"
    if have < own_pace:
        cores = Check("cores", "FAIL", f"{where}; {learners} learners need {own_pace:g} at a day's own pace "
                      f"({LEARNERS_PER_CORE} per core): a bigger box or fewer learners")
    elif have < learners and learners > 1:
        cores = Check("cores", "WARN", f"{where}: enough for {learners} at their own pace; a room led in step through "
                      f"the 4-worker labs runs each job {learners / have:.1f}x slower (stagger those parts)")
    else:
        cores = Check("cores", "OK", f"{where}: a core per learner, enough even for a room led in step")
    if shared and len(learner_cores) > 1:
        cores.detail += ("; grading shares the learners' cores (MULTIGPU_GRADING_CORES=0): throughput verdicts are "
                         "measured under the room's load")
        cores.state = "WARN" if cores.state == "OK" else cores.state
    gb, total = need_gb(learners), memory_gb()
    mem = Check("memory", "OK" if total >= gb else "FAIL",
                f"{total:.1f} GB; {learners} learners need {gb:.1f} GB ({BASE_GB:g} + {IDLE_GB:g} each + "
                f"{LAB_PEAK_GB:g} for each {LEARNERS_PER_CORE} running a lab)")
    return [cores, mem]


def isolation() -> list[Check]:
    from multigpu.grading import sandbox

    v = limits.version()
    cg = Check("cgroups", "OK" if v else "WARN",
               f"cgroup v{v}: each server gets its CPU share, memory limit and the learners' cores" if v else
               "no writable cgroup hierarchy: servers are pinned off the grading cores, but CPU time and memory are not "
               "bounded (run on a machine or container that lets root write /sys/fs/cgroup)")
    why = sandbox.unavailable()
    bw = Check("bubblewrap", "FAIL" if why else "OK", why or "the grading sandbox starts (user, PID and network namespaces)")
    return [cg, bw, learner_namespaces()]


def learner_namespaces() -> Check:
    """Whether root can give each learner's server its namespaces here (``namespaces``)."""
    from multigpu.workshop import namespaces

    pid = os.fork()
    if pid == 0:
        try:
            namespaces.unshare(namespaces.CLONE_NEWNS | namespaces.CLONE_NEWIPC | namespaces.CLONE_NEWNET
                              | namespaces.CLONE_NEWPID)
            os._exit(0)
        except BaseException:
            os._exit(1)
    if os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0:
        return Check("namespaces", "OK", "each learner's server gets PID, network, IPC and mount namespaces of its own")
    return Check("namespaces", "FAIL", "root cannot make PID, network, IPC and mount namespaces here (a container "
                 "without CAP_SYS_ADMIN?): learners' servers would not start; run the hub on the machine or a "
                 "privileged container")


def other_checkouts() -> list[Check]:
    """:func:`copies.open_copies`: hidden from learners by the hub, but a fault to fix all the same."""
    open_ = copies.open_copies()
    if open_:
        return [Check("other copies", "FAIL", "learners can read the solutions of the course copies at "
                      + ", ".join(map(str, open_)) + ": chmod 700 the copy (its solutions/ and its .git) or remove it")]
    return [Check("other copies", "OK", "no copy of the course with solutions learners can read under the homes, "
                  "/srv, /opt, the box's other top folders or MULTIGPU_EXTRA_CHECKOUTS")]


#: Services through which an account starts processes outside its server's namespaces.
OUTSIDE_DOORS = {"sshd": "sshd (DenyGroups multigpu-learners in sshd_config)",
                 "cron": "cron (the learners' logins in /etc/cron.deny)",
                 "atd": "atd (the learners' logins in /etc/at.deny)"}


def outside_doors(running: set[str] | None = None) -> list[Check]:
    """Learners' processes belong in their servers' namespaces: a login by ssh, or a cron or at job,
    runs outside them (the box's processes, loopback and shared memory in reach again)."""
    import psutil

    names = running if running is not None else {p.info["name"] for p in psutil.process_iter(["name"])}
    found = [why for name, why in OUTSIDE_DOORS.items() if name in names]
    if found:
        return [Check("outside doors", "WARN", "learners could start processes outside their namespaces through "
                      + ", ".join(found) + ": close them to the learners' group")]
    return [Check("outside doors", "OK", "no sshd, cron or atd runs: learners' processes start in their servers only")]


def hub_running(hub: Hub) -> bool:
    """Whether this hub's JupyterHub runs now (its pid file names a live jupyterhub)."""
    import psutil

    try:
        return "jupyterhub" in " ".join(psutil.Process(int((hub.state / "jupyterhub.pid").read_text())).cmdline())
    except (OSError, ValueError, psutil.Error):
        return False


def ports(hub: Hub, settings: proxy.Settings, grading_port: int) -> list[Check]:
    """Each of the hub's ports free, or held by this hub's own proxy or JupyterHub."""
    ours = {True: proxy.running_pid(hub) is not None, False: hub_running(hub)}
    out = []
    for what, port, proxies in (("hub port", settings.port, True), ("proxy API port", settings.api_port, True),
                                ("hub internal port", settings.hub_port, False), ("grading port", grading_port, False)):
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1" if what != "hub port" or settings.ip in ("", "0.0.0.0") else settings.ip, port))
                out.append(Check(what, "OK", f"{port} is free"))
            except OSError:
                if ours[proxies]:
                    out.append(Check(what, "OK", f"{port} is this hub's own {'proxy' if proxies else 'JupyterHub'}"))
                else:
                    out.append(Check(what, "FAIL", f"{port} is in use by another program: stop it or choose another "
                                     "port (make hub HUB_PORT=...; MULTIGPU_*_PORT)"))
    return out


def disk(hub: Hub, learners: int) -> list[Check]:
    out = []
    for what, path in (("disk (homes)", Path("/home")), ("disk (hub root)", hub.root)):
        where = path if path.exists() else next(p for p in path.parents if p.exists())
        free = shutil.disk_usage(where).free / 2**30
        need = learners * DISK_GB_PER_LEARNER if what == "disk (homes)" else 2.0
        out.append(Check(what, "OK" if free >= need else "FAIL", f"{free:.0f} GB free under {where}; needs {need:g} GB"))
    return out + [quotas(learners)]


def quotas(learners: int) -> Check:
    """Whether homes and the exchange get images of their own (``disks``), and what they would take full."""
    from multigpu.workshop import disks

    why = disks.unavailable()
    if why:
        return Check("disk quotas", "WARN", f"none: {why}; a learner who fills the disk stops the hub for everyone")
    most = (learners * disks.learner_mb() + disks.exchange_mb()) / 1024
    where = next(p for p in (disks.disks_dir(), *disks.disks_dir().parents) if p.exists())
    free = shutil.disk_usage(where).free / 2**30
    return Check("disk quotas", "OK" if most <= free else "WARN",
                 f"each home {disks.learner_mb()} MB, the exchange {disks.exchange_mb()} MB (MULTIGPU_LEARNER_DISK_MB, "
                 f"MULTIGPU_EXCHANGE_DISK_MB): {most:,.0f} GB if every one fills, {free:.0f} GB free"
                 + ("" if most <= free else ": the box's disk fills before the quotas do"))


def key_and_tls(key: Path, tls_files: tuple[str, str] | None, ip: str) -> list[Check]:
    public = key.with_name(key.name + ".pub")
    if not key.exists():
        k = Check("signing key", "WARN", f"none at {key}: make hub creates it; back it up and publish {public.name}")
    else:
        st = key.stat()
        k = (Check("signing key", "FAIL", f"{key} is readable by others (mode {st.st_mode & 0o777:o}): chmod 600 it")
             if st.st_mode & 0o077 else
             Check("signing key", "OK" if public.exists() else "WARN",
                   f"{key} (mode 600); public key {public}" + ("" if public.exists() else " is missing: re-create it")))
    if tls_files:
        why = tls.check(*tls_files)
        t = Check("HTTPS", "FAIL" if why else "OK", why or f"serving {tls_files[0]}")
    else:
        t = Check("HTTPS", "WARN" if ip not in ("127.0.0.1", "localhost") else "OK",
                  "plain HTTP on " + ip + (": passwords cross the network in clear; make hub TLS_CERT=... TLS_KEY=... "
                                           "(or make hub-tls for a self-signed pair)" if ip not in ("127.0.0.1", "localhost")
                                           else " (this machine only)"))
    return [k, t]


def software() -> list[Check]:
    missing = [what for what, ok in (("jupyterhub", shutil.which("jupyterhub", path=str(Path(sys.executable).parent))),
                                     ("configurable-http-proxy", shutil.which("configurable-http-proxy")),
                                     ("jupyterhub_idle_culler", _importable("jupyterhub_idle_culler"))) if not ok]
    return [Check("hub software", "FAIL" if missing else "OK",
                  f"missing {', '.join(missing)}: run make hub-deps" if missing else f"in {Path(sys.executable).parent}")]


def _importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def run(learners: int) -> list[Check]:
    from multigpu.credential import certificates
    from multigpu.workshop import hubconfig

    hub = Hub.default()
    learner_cores, grading_cores = hubconfig.cores()
    settings = hubconfig.proxy_settings()
    key = Path(os.environ.get("MULTIGPU_CERTIFICATE_KEY") or certificates.default_key_path())
    checks = [Check("root", "OK" if os.geteuid() == 0 else "FAIL",
                    "running as root" if os.geteuid() == 0 else "the hub makes accounts and cgroups: run it as root")]
    checks += software() + room(learners, learner_cores, grading_cores) + isolation() + other_checkouts()
    checks += outside_doors()
    checks += ports(hub, settings, hubconfig.internal_ports()["MULTIGPU_GRADING_PORT"]) + disk(hub, learners)
    checks += key_and_tls(key, hubconfig.tls_files(), settings.ip)
    return checks


def main(learners: int) -> int:
    try:
        checks = run(learners)
    except ValueError as e:  # a half-given TLS pair
        print(f"FAIL  {e}")
        return 1
    print(f"make hub-check: a room of {learners} on this box\n")
    print("\n".join(c.line() for c in checks))
    failed = [c for c in checks if c.state == "FAIL"]
    print(f"\n{len(failed)} check(s) failed" + (": fix them before the room arrives" if failed else
                                                 "; the hub can serve this room"))
    return 1 if failed else 0
