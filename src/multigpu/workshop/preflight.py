"""``make hub-check`` (``multigpu workshop check --learners N``): what this box lacks for a room of N,
before the room arrives. Each check says OK, WARN (the hub runs, with less than it should) or FAIL
(fix it first), and what to do; the exit status is 1 when any check failed.

Room size comes from the room load test (``make hub-load``, docs/workshop.md "Measured"):
:data:`LEARNERS_PER_CORE` learners per core of the learners' cores and :data:`GB_PER_LEARNER`
of memory each, on top of :data:`BASE_GB` for the system, the hub and one grading.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

from multigpu.workshop import limits, proxy, tls
from multigpu.workshop.layout import Hub

#: Learners per learner core for the labs at their default parameters, a room led in step
#: (docs/workshop.md, "What a room needs": a 4-worker run in the same minute halves on 1 core per learner).
LEARNERS_PER_CORE = 1.0
#: Memory per learner: a server with a kernel that imported torch (idle, measured by make hub-load)
#: plus the largest lab's peak (Lab 3, 2.9 GiB, measure-labs), rounded up; one in four running it at once.
GB_PER_LEARNER = 1.2
#: The system, the hub and one grading (an official grading runs 4 workers and a baseline).
BASE_GB = 4.0
#: Disk per learner: the generated data set (70 MB) and the labs' run records and checkpoints.
DISK_GB_PER_LEARNER = 1.0


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
    need_cores = learners / LEARNERS_PER_CORE
    shared = learner_cores == grading_cores
    cores = Check("cores", "OK" if len(learner_cores) >= need_cores else "FAIL",
                  f"{len(learner_cores)} learner core(s){'' if shared else f', {len(grading_cores)} kept for grading'}; "
                  f"{learners} learners need {need_cores:g} at {LEARNERS_PER_CORE:g} learner(s) per core")
    if cores.state == "FAIL":
        cores.detail += ": a bigger box, fewer learners, or stagger the 4-worker parts of Labs 3 and 4"
    if shared and len(learner_cores) > 1:
        cores.state, cores.detail = "WARN", cores.detail + "; grading shares the learners' cores (MULTIGPU_GRADING_CORES=0): " \
                                                          "throughput verdicts are measured under the room's load"
    need_gb = BASE_GB + learners * GB_PER_LEARNER
    have = memory_gb()
    mem = Check("memory", "OK" if have >= need_gb else "FAIL",
                f"{have:.1f} GB; {learners} learners need {need_gb:.1f} GB ({BASE_GB:g} + {GB_PER_LEARNER:g} each)")
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
    return [cg, bw]


def ports(hub: Hub, settings: proxy.Settings, grading_port: int) -> list[Check]:
    ours = proxy.running_pid(hub) is not None
    out = []
    for what, port, proxies in (("hub port", settings.port, True), ("proxy API port", settings.api_port, True),
                                ("hub internal port", settings.hub_port, False), ("grading port", grading_port, False)):
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1" if what != "hub port" or settings.ip in ("", "0.0.0.0") else settings.ip, port))
                out.append(Check(what, "OK", f"{port} is free"))
            except OSError:
                if proxies and ours:
                    out.append(Check(what, "OK", f"{port} is this hub's running proxy"))
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
    return out


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
    from multigpu.grading import certificates
    from multigpu.workshop import hubconfig

    hub = Hub.default()
    learner_cores, grading_cores = hubconfig.cores()
    settings = hubconfig.proxy_settings()
    key = Path(os.environ.get("MULTIGPU_CERTIFICATE_KEY") or certificates.default_key_path())
    checks = [Check("root", "OK" if os.geteuid() == 0 else "FAIL",
                    "running as root" if os.geteuid() == 0 else "the hub makes accounts and cgroups: run it as root")]
    checks += software() + room(learners, learner_cores, grading_cores) + isolation()
    checks += ports(hub, settings, hubconfig.env_int("MULTIGPU_GRADING_PORT", 8010)) + disk(hub, learners)
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
