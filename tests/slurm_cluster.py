"""A real two-node Slurm cluster on one box, for the cluster tests (``make test-cluster``).

Each daemon runs in a network namespace this module makes: the controller (``munged`` and
``slurmctld``) in ``mgt-ctl``, one ``slurmd`` per "node" in ``mgt-n1`` and ``mgt-n2``, their
``eth0`` joined by veth pairs to a bridge that lives in ``mgt-br``. The addresses (10.251.0.0/24)
exist only inside those namespaces: nothing is added to the root namespace's interfaces or routes.
munged has its own key and socket, each slurmd (``slurmd -N mgn1``) its own spool folder, pid
file and log, all under one temporary folder. The clients (``sbatch``, ``srun``, ``squeue``,
``scontrol``, ``scancel``) run in the controller's namespace: :attr:`SlurmCluster.prefix` and
:attr:`SlurmCluster.env` are what :mod:`multigpu.running.slurm` takes for that.

:meth:`SlurmCluster.stop` kills every process in the namespaces (daemons, job steps, tasks),
deletes the namespaces and the folder; :meth:`SlurmCluster.start` first does the same to what an
earlier, killed run left under the same names.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

CONTROLLER_NS = "mgt-ctl"
BRIDGE_NS = "mgt-br"
SUBNET = "10.251.0"
CONTROLLER_ADDR = f"{SUBNET}.1"
CONTROLLER_NAME = "mgctl"
#: node name -> (namespace, address)
NODES = {"mgn1": ("mgt-n1", f"{SUBNET}.11"), "mgn2": ("mgt-n2", f"{SUBNET}.12")}
NAMESPACES = (CONTROLLER_NS, *(ns for ns, _ in NODES.values()), BRIDGE_NS)
CPUS_PER_NODE = 2
TMP_PREFIX = "multigpu-slurm-test-"
DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "squeue", "scontrol", "scancel", "sinfo", "nsenter", "unshare")
HOW = "run `make cluster-deps` as root, then `make test-cluster`"


def why_unavailable() -> str | None:
    """None where this box can run the test cluster, else why not and what to do."""
    if os.geteuid() != 0:
        return f"the test cluster needs root (network namespaces, slurmd): {HOW}"
    missing = [b for b in (*DAEMONS, *CLIENTS, "ip") if shutil.which(b) is None]
    if missing:
        return f"{', '.join(missing)} not installed: {HOW}"
    probe = "mgt-probe"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    if made.returncode != 0:
        return f"`ip netns add` is not permitted here ({made.stderr.strip()}): the test cluster needs network namespaces"
    return None


def ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {done.stderr.strip()}")


def namespace_pids(ns: str) -> list[int]:
    done = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
    return [int(p) for p in done.stdout.split()] if done.returncode == 0 else []


def kill_namespace(ns: str, grace_s: float = 3.0) -> None:
    """Every process in ``ns`` terminated (killed after ``grace_s``), then ``ns`` deleted."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = namespace_pids(ns)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace_s
        while namespace_pids(ns) and time.monotonic() < deadline:
            time.sleep(0.1)
    subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def remove_leftovers() -> None:
    """What an earlier, killed run left: its namespaces (and their processes) and its folders
    whose owner process is gone."""
    existing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    for ns in NAMESPACES:
        if ns in existing:
            kill_namespace(ns)
    for folder in Path(tempfile.gettempdir()).glob(f"{TMP_PREFIX}*"):
        try:
            owner = int((folder / "owner").read_text())
            os.kill(owner, 0)
        except (OSError, ValueError):
            shutil.rmtree(folder, ignore_errors=True)


def hosts_file() -> str:
    """/etc/hosts of every machine of the cluster."""
    machines = [(CONTROLLER_ADDR, CONTROLLER_NAME), *((addr, name) for name, (_, addr) in NODES.items())]
    return "127.0.0.1 localhost\n" + "".join(f"{addr} {name}\n" for addr, name in machines)


def slurm_conf(root: Path) -> str:
    """The cluster's slurm.conf: two nodes of CPUS_PER_NODE, everything local to ``root``; the
    partition ``test`` (the default) and ``grading`` (the grading service's, on the same nodes)."""
    nodes = "\n".join(f"NodeName={name} NodeAddr={addr} CPUs={CPUS_PER_NODE} State=UNKNOWN"
                      for name, (_, addr) in NODES.items())
    return f"""\
ClusterName=multigpu-test
SlurmctldHost={CONTROLLER_NAME}({CONTROLLER_ADDR})
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket={root}/munge/munge.socket
CredType=cred/munge
StateSaveLocation={root}/ctld
SlurmctldPidFile={root}/ctld/slurmctld.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdSpoolDir={root}/spool/%n
SlurmdPidFile={root}/spool/%n.pid
SlurmdLogFile={root}/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc={root}/log/jobcomp.txt
ReturnToService=2
SlurmdTimeout=10
SlurmctldTimeout=10
InactiveLimit=0
KillWait=2
OverTimeLimit=0
MinJobAge=300
MessageTimeout=10
{nodes}
PartitionName=test Nodes={','.join(NODES)} Default=YES MaxTime=INFINITE State=UP
PartitionName=grading Nodes={','.join(NODES)} MaxTime=INFINITE State=UP
"""


class SlurmCluster:
    """The cluster's daemons, folders and namespaces; :meth:`start` and :meth:`stop` (also as a
    context manager)."""

    def __init__(self, ready_timeout_s: float = 60.0) -> None:
        self.ready_timeout_s = ready_timeout_s
        self.root = Path()
        self.procs: dict[str, subprocess.Popen] = {}  # by daemon (slurmd-mgn1, ...)

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def prefix(self) -> list[str]:
        """What runs a Slurm client in the controller's namespace."""
        return ["nsenter", f"--net=/run/netns/{CONTROLLER_NS}"]

    @property
    def env(self) -> dict[str, str]:
        """The clients' environment: this cluster's slurm.conf."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def client(self, *argv: str, timeout: float = 30.0) -> subprocess.CompletedProcess:
        """A Slurm client's answer (``client("sinfo", "-N")``), run in the controller's namespace."""
        return subprocess.run([*self.prefix, *argv], env=self.env, capture_output=True, text=True, timeout=timeout)

    def __enter__(self) -> SlurmCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        remove_leftovers()
        self.root = Path(tempfile.mkdtemp(prefix=TMP_PREFIX))
        try:
            (self.root / "owner").write_text(str(os.getpid()))
            for sub in ("ctld", "spool", "log", *(f"spool/{name}" for name in NODES)):
                (self.root / sub).mkdir(mode=0o700)
            (self.root / "munge").mkdir(mode=0o755)  # the clients reach munged's socket in it
            self.conf.write_text(slurm_conf(self.root))
            (self.root / "hosts").write_text(hosts_file())
            self.network()
            self.daemons()
            self.wait_idle()
        except BaseException:
            self.stop()
            raise

    def network(self) -> None:
        """The namespaces, the bridge in its own namespace, one veth pair per namespace to it."""
        for ns in NAMESPACES:
            ip("netns", "add", ns)
            ip("-n", ns, "link", "set", "lo", "up")
        ip("-n", BRIDGE_NS, "link", "add", "br0", "type", "bridge")
        ip("-n", BRIDGE_NS, "link", "set", "br0", "up")
        ends = [(CONTROLLER_NS, CONTROLLER_ADDR), *NODES.values()]
        for i, (ns, addr) in enumerate(ends):
            # made inside the bridge's namespace, its peer straight into ns: never in the root namespace
            ip("-n", BRIDGE_NS, "link", "add", f"v{i}", "type", "veth", "peer", "name", "eth0", "netns", ns)
            ip("-n", BRIDGE_NS, "link", "set", f"v{i}", "master", "br0", "up")
            ip("-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
            ip("-n", ns, "link", "set", "eth0", "up")

    def spawn(self, ns: str, hostname: str, argv: list[str], log: str) -> None:
        """A daemon in the foreground in ``ns``, its output in log/``log``, on a "machine" of its
        own: its own host name (a UTS namespace) that the cluster's hosts file, bind-mounted over
        /etc/hosts in a mount namespace of its own, resolves to its address, as on a real node.
        Horovod 0.28.1 needs that: the Gloo device of its process sets is made from the host name,
        not from HOROVOD_GLOO_IFACE, and this box's name resolves to 127.0.0.1. ``nsenter --net``
        joins only the network namespace: ``ip netns exec`` would also mount a fresh /sys, without
        the /sys/fs/cgroup that slurmd 22.05 looks for even with proctrack/linuxproc and task/none."""
        machine = ["unshare", "--mount", "--uts", "--propagation", "private", "sh", "-c",
                   'mount --bind "$0" /etc/hosts && hostname "$1" && shift && exec "$@"', str(self.root / "hosts"), hostname]
        with open(self.root / "log" / log, "ab") as out:
            self.procs[log.removesuffix(".out")] = subprocess.Popen(
                ["nsenter", f"--net=/run/netns/{ns}", *machine, *argv], stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, env=self.env)

    def daemons(self) -> None:
        munge = self.root / "munge"
        key = munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self.spawn(CONTROLLER_NS, CONTROLLER_NAME, ["munged", "-F", "--force", f"--key-file={key}", f"--socket={munge}/munge.socket",
                                   f"--pid-file={munge}/munged.pid", f"--seed-file={munge}/munged.seed",
                                   f"--log-file={self.root}/log/munged.log"], "munged.out")
        deadline = time.monotonic() + 10
        while not (munge / "munge.socket").exists():
            if time.monotonic() > deadline:
                raise RuntimeError("munged did not open its socket within 10 s:\n" + self.logs())
            time.sleep(0.05)
        self.start_slurmctld()
        for name in NODES:
            self.start_slurmd(name)

    def start_slurmctld(self) -> None:
        """slurmctld, which reads the jobs it had from its state folder (a restart loses none)."""
        self.spawn(CONTROLLER_NS, CONTROLLER_NAME, ["slurmctld", "-D", "-i", "-f", str(self.conf)], "slurmctld.out")

    def start_slurmd(self, name: str) -> None:
        self.spawn(NODES[name][0], name, ["slurmd", "-D", "-N", name, "-f", str(self.conf)], f"slurmd-{name}.out")

    def kill(self, daemon: str, sig: int = signal.SIGKILL) -> int:
        """Send ``sig`` to a daemon (``slurmctld``, ``slurmd-mgn1``) and wait for its end; its pid.
        The job steps a killed slurmd started (slurmstepd and their tasks) run on, as on a node
        whose slurmd crashed."""
        proc = self.procs.pop(daemon)
        proc.send_signal(sig)
        proc.wait(timeout=30)
        return proc.pid

    def node_states(self) -> dict[str, str]:
        done = self.client("sinfo", "-h", "-N", "-o", "%N %T", timeout=15)
        return dict(line.split()[:2] for line in done.stdout.splitlines() if len(line.split()) >= 2)

    def wait_idle(self, timeout_s: float | None = None) -> None:
        """Until both nodes are idle; after ``timeout_s`` (ready_timeout_s) a RuntimeError with the
        daemons' logs."""
        deadline = time.monotonic() + (timeout_s or self.ready_timeout_s)
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            dead = [name for name, p in self.procs.items() if p.poll() is not None]
            if dead:
                raise RuntimeError(f"{', '.join(dead)} exited while the cluster came up:\n" + self.logs())
            with contextlib.suppress(subprocess.TimeoutExpired):
                states = self.node_states()
            if set(states) == set(NODES) and all(s == "idle" for s in states.values()):
                return
            time.sleep(0.3)
        raise RuntimeError(f"the test cluster's nodes were not idle within {self.ready_timeout_s:.0f} s "
                           f"(sinfo: {states or 'no answer'}):\n" + self.logs())

    def logs(self, lines: int = 25) -> str:
        """The last lines of each daemon's log, for error messages."""
        parts = []
        for path in sorted((self.root / "log").glob("*")):
            text = path.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {path.name} ---\n" + "\n".join(text))
        return "\n".join(parts)

    def stop(self) -> None:
        """Every process in the namespaces killed (daemons, job steps, tasks), the namespaces and
        the folder removed. Safe to call after a failed or partial start."""
        for ns in NAMESPACES:
            kill_namespace(ns)
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        self.procs.clear()
        if self.root != Path() and self.root.name.startswith(TMP_PREFIX):
            shutil.rmtree(self.root, ignore_errors=True)


def command_of(pid: int) -> str:
    """The command line of ``pid``; "" once it is gone."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def running() -> Iterator[SlurmCluster]:
    """The cluster for a test module (``cluster = pytest.fixture(scope="module")(slurm_cluster.running)``):
    skipped with the reason where this box cannot run it; once the module is done, stopped, and
    checked gone: no daemon, no namespace, no folder."""
    import pytest

    why = why_unavailable()
    if why:
        pytest.skip(why)
    began = time.monotonic()
    with SlurmCluster() as up:
        print(f"test cluster up in {time.monotonic() - began:.1f} s")
        root = up.root
        yield up
        daemons = [p.pid for p in up.procs.values()]
    assert not [pid for pid in daemons if command_of(pid)], "a daemon of the test cluster outlived it"
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not [ns for ns in NAMESPACES if ns in names.split()] and not root.exists()
