"""The warm parent of worker processes, started by :mod:`multigpu.running.warm` (not for direct use).

    python -m multigpu.running._zygote SOCKET

It imports torch, Horovod and the course's worker code once, prints ``ready`` and then serves
the socket. Each connection, from :mod:`multigpu.running._warm_client`, asks for one Python
process: the client sends its command line (``-m module``, ``-c code`` or a script), its
environment, folder, umask, limits and open file descriptors; this process forks, and the child
takes all of these on and runs the command as ``python`` would. A fork of a process that has run
nothing gives every job fresh processes: nothing one job changes reaches the next.

The parent answers each client with the child's pid, then its exit status. When a client goes
away first (killed with its job), the child and everything it started are killed. When this
process's standard input closes (the process that started it ended), it kills its children and
exits. Nothing here may run torch code or start a thread: a fork after torch has started its
thread pools is not safe.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import struct
import sys

#: What every worker imports before it does anything: loaded once, here.
PRELOAD = (
    "torch", "torch.distributed", "torch.nn.functional", "torch.utils.data", "numpy", "cloudpickle", "psutil",
    "PIL.Image", "horovod.torch", "horovod.runner.launch",
    "multigpu.core.data", "multigpu.core.devices", "multigpu.core.models", "multigpu.core.training",
    "multigpu.running.launch", "multigpu.running.warm_child", "multigpu.running.hvdtools", "multigpu.running.run_records",
)

#: Variables read when a library is loaded, not when it is used: a client whose value differs from
#: this process's is started afresh (the libraries here were loaded under this process's value).
READ_AT_LOAD = ("LD_PRELOAD", "LD_LIBRARY_PATH", "PYTHONHOME", "PYTHONWARNINGS", "PYTHONOPTIMIZE",
                "PYTHONHASHSEED", "PYTHONMALLOC", "MALLOC_ARENA_MAX", "KMP_AFFINITY", "GOMP_CPU_AFFINITY",
                "OMP_PROC_BIND", "OMP_PLACES", "OMP_WAIT_POLICY")

HEADER = struct.Struct("!I")
MAX_FDS = 64


def preload() -> None:
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)


def receive(conn: socket.socket) -> tuple[dict, list[int]]:
    """One request: a length-prefixed JSON object, the client's file descriptors beside it."""
    data, fds, _, _ = socket.recv_fds(conn, 1 << 16, MAX_FDS)
    while len(data) < HEADER.size or len(data) < HEADER.size + HEADER.unpack_from(data)[0]:
        more = conn.recv(1 << 16)
        if not more:
            raise ConnectionError("the client left in the middle of its request")
        data += more
    return json.loads(data[HEADER.size:HEADER.size + HEADER.unpack_from(data)[0]]), fds


def tell(conn: socket.socket, message: dict) -> None:
    try:
        conn.sendall(json.dumps(message).encode() + b"\n")
    except OSError:
        pass  # the client is gone: its child is killed when the parent reads its end


def why_cold(request: dict) -> str | None:
    """Why this request must start a fresh Python instead, or None."""
    env = request["env"]
    changed = [k for k in READ_AT_LOAD if env.get(k) != os.environ.get(k)]
    if changed:
        return f"{', '.join(changed)} differ(s) from the warm parent's"
    return None


class Parent:
    """The serving loop: one selector over the socket, the clients, the children's exits and stdin.

    The ranks of one MPI job on this machine (the clients an ``mpirun`` proxy started: same
    parent, ``PMI_SIZE`` set) hear of a clean exit together, once every rank of the job has
    exited: MPICH's proxy takes the end of one rank's process for the end of the job and kills
    the others, which must then already be gone, as fresh processes would be. A failure is
    reported at once."""

    def __init__(self, listener: socket.socket) -> None:
        self.listener = listener
        self.selector = selectors.DefaultSelector()
        self.clients: dict[int, socket.socket] = {}  # child pid -> its client's connection
        self.watched: set[int] = set()  # the children whose client's end is watched for its closing
        self.group_of: dict[int, str] = {}  # child pid -> its MPI job
        self.running: dict[str, set[int]] = {}  # MPI job -> its ranks still running
        self.held: dict[str, list[tuple[int, int]]] = {}  # MPI job -> (pid, 0) of ranks that ended cleanly
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self.selector.register(listener, selectors.EVENT_READ, self.accept)
        self.selector.register(self.wake_r, selectors.EVENT_READ, self.reap)
        self.selector.register(0, selectors.EVENT_READ, self.starter_gone)

    def serve(self) -> None:
        while True:
            for key, _ in self.selector.select():
                key.data(key.fileobj)

    def accept(self, listener: socket.socket) -> None:
        conn, _ = listener.accept()
        uid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[1]
        if uid != os.getuid():  # only this account's processes (the folder is 700 too)
            conn.close()
            return
        conn.settimeout(30)
        fds: list[int] = []
        try:
            request, fds = receive(conn)
            cold = why_cold(request)
            if cold:
                tell(conn, {"cold": cold})
                conn.close()
                return
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                self.become(request, fds, conn)
        except (OSError, ValueError, KeyError) as e:
            tell(conn, {"cold": f"the warm parent could not read the request ({e})"})
            conn.close()
            return
        finally:
            for fd in fds:
                os.close(fd)
        conn.settimeout(None)
        self.clients[pid] = conn
        self.watched.add(pid)
        self.selector.register(conn, selectors.EVENT_READ, lambda c, pid=pid: self.client_gone(pid, c))
        if request.get("group"):
            self.group_of[pid] = request["group"]
            self.running.setdefault(request["group"], set()).add(pid)
        tell(conn, {"pid": pid})

    def become(self, request: dict, fds: list[int], conn: socket.socket) -> None:
        """In the child: drop the parent's state, take on the client's, run, exit (never returns)."""
        from multigpu.running import warm_child

        self.selector.close()
        self.listener.close()
        for other in self.clients.values():
            other.close()
        conn.close()
        signal.set_wakeup_fd(-1)
        os.close(self.wake_r)
        os.close(self.wake_w)
        warm_child.run(request, fds)

    def reap(self, _: int) -> None:
        try:
            while os.read(self.wake_r, 512):
                pass
        except BlockingIOError:
            pass
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.ended(pid, os.waitstatus_to_exitcode(status))

    def ended(self, pid: int, code: int) -> None:
        group = self.group_of.pop(pid, None)
        if group is None:
            self.report(pid, code)
            return
        running = self.running[group]
        running.discard(pid)
        held = self.held.setdefault(group, [])
        held.append((pid, code))
        if code == 0 and running:
            return  # a clean end waits for the job's other ranks
        for done, done_code in held:
            self.report(done, done_code)
        del self.held[group]
        if not running:
            del self.running[group]

    def report(self, pid: int, code: int) -> None:
        conn = self.clients.pop(pid, None)
        if conn is None:
            return
        tell(conn, {"exit": code})
        if pid in self.watched:
            self.watched.discard(pid)
            self.selector.unregister(conn)
        conn.close()

    def client_gone(self, pid: int, conn: socket.socket) -> None:
        """The client closed its end (killed with its job): kill the child with all it started."""
        try:
            if conn.recv(1 << 12):
                return  # clients send nothing after the request; ignore it
        except OSError:
            pass
        if pid in self.watched:
            self.watched.discard(pid)
            self.selector.unregister(conn)
        kill_tree(pid)

    def starter_gone(self, _: int) -> None:
        if os.read(0, 1 << 12):
            return
        for pid in list(self.clients):
            kill_tree(pid)
        os._exit(0)


def kill_tree(pid: int) -> None:
    """Kill ``pid``'s process group and every process it started, whatever their session."""
    import psutil

    try:
        started = [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        started = []
    for target, kill in ((pid, os.killpg), (pid, os.kill), *((p, os.kill) for p in started)):
        try:
            kill(target, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def main(argv: list[str]) -> int:
    (path,) = argv
    preload()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    os.chmod(path, 0o600)
    listener.listen(128)
    parent = Parent(listener)
    print("ready", flush=True)
    os.dup2(2, 1)  # the starter reads one line; anything later goes where errors go
    parent.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
