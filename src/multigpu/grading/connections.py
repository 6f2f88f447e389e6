"""Who talked to whom: the TCP connections between a job's processes, seen from outside the sandbox.

The sandbox has its own network namespace with nothing in it but loopback, so every TCP connection
a submission opens joins two of its own processes. While the run goes on, the grader reads the
namespace's socket table (``/proc/<pid>/net/tcp`` and ``tcp6`` of a process inside it) and which
process holds each socket (the ``socket:[inode]`` links of ``/proc/<pid>/fd``), every
:data:`EVERY_S`, and names each process by what the launcher gave it: rank ``r`` (the rank
variable ``mpirun`` or ``horovodrun --gloo`` set in its environment, inherited by anything it
starts) or the launcher itself (``horovodrun``, ``mpirun``, MPICH's proxy). Nothing the
submission writes is read.

What Horovod and its launcher open (measured with Horovod 0.28.1 on the course's runs, sandboxed,
4 workers; docs/certificates.md):

- over MPI (the course's controller where Horovod has it: :func:`launch.horovod_controller`),
  the ranks of one machine exchange data through shared memory and hold NO TCP connection to one
  another; each holds one to the launcher (MPICH's process manager);
- over Gloo, Horovod's controller connects every pair of ranks :data:`GLOO_LINKS_PER_PAIR` times
  (its rendezvous with the launcher's server is over by the first look), and only in processes
  that loaded Horovod's library (``/proc/<pid>/maps``: :data:`HOROVOD_LIBRARY`).

:func:`extra_links` is what a run held beyond that: rank-to-rank connections Horovod did not
open (torch.distributed's Gloo group, a socket of the script's own). A run that holds any is
held for review with the connections listed.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

#: How often the socket table is read (seconds): connections between ranks last the whole run.
EVERY_S = 1.0
#: TCP state ESTABLISHED in /proc/net/tcp
ESTABLISHED = "01"
#: Environment variables in which the launchers give a worker its rank (mpirun: MPICH's PMI_RANK;
#: horovodrun --gloo: HOROVOD_RANK; Open MPI: OMPI_COMM_WORLD_RANK)
RANK_VARS = ("HOROVOD_RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK")
#: Connections Horovod's Gloo controller opens between two ranks of one machine (measured: 24
#: between 4 ranks, 4 for each of the 6 pairs; see the module doc).
GLOO_LINKS_PER_PAIR = 4
#: The file a process maps once it has loaded Horovod's PyTorch extension.
HOROVOD_LIBRARY = b"horovod/torch/mpi_lib"
#: Horovod's connections between ranks per pair, by controller.
HOROVOD_LINKS_PER_PAIR = {"mpi": 0, "gloo": GLOO_LINKS_PER_PAIR}


def role(pid: int) -> str:
    """``rank R`` for a worker (or a process it started), else ``launcher (name)``; "" when the
    process is gone."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
        with open(f"/proc/{pid}/comm") as f:
            name = f.read().strip()
    except OSError:
        return ""
    for var in RANK_VARS:
        value = env.get(var.encode())
        if value is not None and value.isdigit():
            return f"rank {int(value)}"
    return f"launcher ({name})"


def socket_inodes(pid: int) -> set[int]:
    """The inodes of the sockets ``pid`` holds open."""
    found: set[int] = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return found
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            found.add(int(target[8:-1]))
    return found


@dataclass(frozen=True)
class Socket:
    local: str  # "address:port" as the table writes it (hex)
    remote: str
    inode: int


def tcp_table(pid: int) -> list[Socket]:
    """The ESTABLISHED TCP sockets of the network namespace ``pid`` lives in."""
    out = []
    for name in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{name}") as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if len(cols) > 9 and cols[3] == ESTABLISHED:
                out.append(Socket(cols[1], cols[2], int(cols[9])))
    return out


def _netns(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return ""


def _port(endpoint: str) -> int:
    return int(endpoint.rsplit(":", 1)[1], 16)


@dataclass(frozen=True)
class Link:
    """One TCP connection between two processes of the job (ends sorted by role)."""

    a: str
    b: str
    a_port: int
    b_port: int
    #: seconds after the run's start when the grader first saw it
    first_s: float

    @property
    def between_ranks(self) -> bool:
        return self.a.startswith("rank") and self.b.startswith("rank") and self.a != self.b

    def describe(self) -> str:
        return f"{self.a} (port {self.a_port}) <-> {self.b} (port {self.b_port}), from {self.first_s:.0f} s"


@dataclass
class Talk:
    """The connections the grader saw during one run."""

    links: list[Link] = field(default_factory=list)
    snapshots: int = 0
    #: the ranks with a process that had loaded Horovod's library
    horovod_ranks: list[str] = field(default_factory=list)


def loaded_horovod(pid: int) -> bool:
    """Whether ``pid`` has mapped Horovod's PyTorch extension."""
    try:
        with open(f"/proc/{pid}/maps", "rb") as f:
            return HOROVOD_LIBRARY in f.read()
    except OSError:
        return False


def snapshot(pids: Iterable[int]) -> list[tuple[str, int, str, int]]:
    """The job's connections now: ``(role, port, role, port)`` for each pair of ends both held by
    processes in ``pids`` (a connection to anything else has one end only and is left out)."""
    owner: dict[int, int] = {}
    pids = sorted(pids)
    for pid in pids:
        for inode in socket_inodes(pid):
            owner.setdefault(inode, pid)
    inside = [p for p in pids if _netns(p) not in ("", _netns(os.getpid()))]
    table = tcp_table((inside or pids or [os.getpid()])[0])  # the sandbox's namespace, else ours
    ends = {(s.local, s.remote): s for s in table if s.inode in owner}
    found = []
    for (local, remote), s in ends.items():
        peer = ends.get((remote, local))
        if peer is None or (local, remote) > (remote, local):
            continue  # one end outside the job, or the pair's other half
        here, there = role(owner[s.inode]), role(owner[peer.inode])
        if here and there:
            found.append((here, _port(local), there, _port(remote)))
    return found


class TalkWatch:
    """An observer of :func:`multigpu.grading.runner.run_untrusted`: the job's connections, read
    every :data:`EVERY_S` from the runner's tick."""

    def __init__(self, every: float = EVERY_S):
        self.every = every
        self.last = -every
        self.seen: dict[tuple[str, int, str, int], float] = {}
        self.snapshots = 0
        self.start = time.monotonic()
        self.horovod: set[str] = set()

    def started(self, start: float) -> None:
        self.start = start

    def tick(self, pids: set[int], elapsed: float) -> None:
        if elapsed - self.last < self.every:
            return
        self.last = elapsed
        for here, hp, there, tp in snapshot(pids):
            a, b = sorted([(here, hp), (there, tp)])
            self.seen.setdefault((a[0], a[1], b[0], b[1]), elapsed)
        for pid in pids:
            who = role(pid)
            if who.startswith("rank") and who not in self.horovod and loaded_horovod(pid):
                self.horovod.add(who)
        self.snapshots += 1

    def stopped(self) -> Talk:
        links = [Link(a, b, ap, bp, t) for (a, ap, b, bp), t in sorted(self.seen.items(), key=lambda kv: kv[1])]
        return Talk(links, self.snapshots, sorted(self.horovod))


def extra_links(talk: Talk, controller: str) -> list[Link]:
    """The connections between ranks beyond what Horovod's ``controller`` opens: all of them over
    MPI; over Gloo, those of a rank that never loaded Horovod and those past
    :data:`GLOO_LINKS_PER_PAIR` for a pair (the later ones)."""
    allowed = HOROVOD_LINKS_PER_PAIR.get(controller, 0)
    per_pair: dict[tuple[str, str], int] = {}
    extra = []
    for link in talk.links:
        if not link.between_ranks:
            continue
        if not {link.a, link.b} <= set(talk.horovod_ranks):
            extra.append(link)
            continue
        pair = (link.a, link.b)
        per_pair[pair] = per_pair.get(pair, 0) + 1
        if per_pair[pair] > allowed:
            extra.append(link)
    return extra
