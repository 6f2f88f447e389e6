"""A learner's server in namespaces of its own: its processes, its network, its shared memory and
its System V IPC are the learner's alone, and all of it goes when the server stops.

    python -m multigpu.workshop.namespaces --user NAME --port PORT [--relay HUBPORT ...] [--shm-bytes N]
        [--exchange FOLDER --inbound FOLDER] [--hide FOLDER ...] -- CMD ...

The hub's spawner starts this as root, in the learner's control group. It makes, for ``CMD`` (the
learner's JupyterLab) and everything it starts (kernels, terminals, Horovod jobs):

- a PID namespace: ``/proc`` shows the learner's own processes only, so no other learner reads their
  command lines or kills their jobs; its first process reaps orphans and forwards the stop signal;
- a network namespace with its loopback alone: no other learner reaches a rendezvous or a server
  the learner's jobs open, and no job of theirs reaches anyone else's;
- an IPC namespace and a mount namespace with a ``/dev/shm`` of its own (a bounded tmpfs): a
  System V segment or a shared-memory file cannot outlive the server or fill another's memory;
- for a learner (``--exchange``), the exchange read-only and its inbound folder their own
  (:mod:`inbound`): their submissions land on their own disk, never on the room's.

Two things cross the namespace, relayed byte for byte by this process (root, outside it): the
proxy's connections to the server (``127.0.0.1:PORT`` outside, the same address inside) and the
server's connections to the hub's API (``127.0.0.1:HUBPORT`` inside, the hub's outside). The
server's processes run as the learner; nothing inside runs as root. When the server ends (or this
process is killed) the PID namespace's first process dies, and with it every process, the
namespaces and their memory.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import fcntl
import os
import pwd
import signal
import socket
import struct
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from multigpu.workshop import inbound as own_inbound
from multigpu.workshop import layout
from multigpu.workshop.serverlog import ServerLog

CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x08000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND = 1, 2, 4, 8, 32, 4096
MS_REC, MS_PRIVATE = 1 << 14, 1 << 18
PR_SET_PDEATHSIG = 1
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
#: A learner's /dev/shm, bytes (its pages count against the learner's memory limit as well).
SHM_BYTES = 1 << 30
#: The server's connections to the hub relayed at once (a learner opening thousands exhausts nothing of root's).
MAX_CONNECTIONS = 256
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def unshare(flags: int) -> None:
    _check(_libc.unshare(flags), "unshare")


def setns(fd: int, nstype: int) -> None:
    _check(_libc.setns(fd, nstype), "setns")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    def enc(text: str | None) -> bytes | None:
        return text.encode() if text is not None else None

    _check(_libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)), f"mount {target}")


def die_with_parent() -> None:
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def loopback_up() -> None:
    """Bring up this network namespace's loopback (it starts down)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        flags = struct.unpack("16sH", fcntl.ioctl(s, SIOCGIFFLAGS, struct.pack("16sH", b"lo", 0)))[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH", b"lo", flags | IFF_UP))


def become(user: pwd.struct_passwd) -> None:
    os.initgroups(user.pw_name, user.pw_gid)
    os.setgid(user.pw_gid)
    os.setuid(user.pw_uid)


def run_init(user: pwd.struct_passwd, cmd: Sequence[str]) -> NoReturn:
    """PID 1 of the learner's namespace: mount its /proc, start the server as the learner, reap
    orphans, forward the stop signals, and end with the server's status."""
    die_with_parent()
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    server = os.fork()
    if server == 0:
        become(user)
        os.chdir(user.pw_dir)
        os.execvpe(cmd[0], list(cmd), os.environ)
    become(user)
    die_with_parent()  # a change of credentials clears it: set it again, as the learner
    for sig in FORWARDED:
        signal.signal(sig, lambda s, _f: os.kill(server, s))
    while True:
        pid, status = os.waitpid(-1, 0)
        if pid == server:
            os._exit(os.waitstatus_to_exitcode(status) & 0xFF)


def private_folders(size_bytes: int) -> None:
    """The box's folders every account may write into, made the server's own (a bounded tmpfs
    each): shared memory, temporary files (a cache another account planted there would run as
    this one: torch.compile's, for one), and POSIX message queues (their own, in this IPC
    namespace)."""
    for folder in layout.PRIVATE_FOLDERS:
        if os.path.isdir(folder):
            mount("tmpfs", folder, "tmpfs", MS_NOSUID | MS_NODEV, f"size={size_bytes},mode=1777")
    if os.path.isdir("/dev/mqueue"):
        mount("mqueue", "/dev/mqueue", "mqueue", MS_NOSUID | MS_NODEV | MS_NOEXEC)


def learners_exchange(user: pwd.struct_passwd, exchange: str, inbound: str) -> None:
    """The learner's view of the exchange: its root a small tmpfs of their own (nbgrader wants it
    writable), the course's folder bound back read-only, its inbound folder the learner's own
    (:mod:`inbound`)."""
    course = os.path.dirname(inbound)
    if not os.path.isdir(inbound):  # no course in the exchange yet: nothing to submit to
        return
    held = os.open(course, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW)
    own = own_inbound.open_folder(user, own_inbound.folder_name(layout.Hub(Path(exchange).parent)), make=True)
    try:
        mount("tmpfs", exchange, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=1777")
        os.mkdir(course, 0o755)
        mount(f"/proc/self/fd/{held}", course, None, MS_BIND | MS_REC)
        mount(None, course, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
        mount(f"/proc/self/fd/{own}", inbound, None, MS_BIND)
        mount(None, inbound, None, MS_BIND | MS_REMOUNT | MS_NOSUID | MS_NODEV)
    finally:
        os.close(held)
        os.close(own)


def run_namespaces(user: pwd.struct_passwd, cmd: Sequence[str], shm_bytes: int, ready: int, go: int,
                   exchange: tuple[str, str] | None = None, hide: Sequence[str] = ()) -> NoReturn:
    """The child that makes the namespaces, waits until the relay listens in them (``go``), then
    starts their first process and waits for it."""
    code = 1
    try:
        die_with_parent()
        unshare(CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWNET)
        mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing mounted here reaches the box
        private_folders(shm_bytes)
        if exchange is not None:
            learners_exchange(user, *exchange)
        for folder in (f for f in hide if os.path.isdir(f)):  # an empty, read-only folder in its place
            mount("tmpfs", folder, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k,mode=0755")
        loopback_up()
        os.write(ready, b"namespaces\n")
        if os.read(go, 3) != b"go\n":
            raise RuntimeError("the relay did not start")
        os.close(go)
        unshare(CLONE_NEWPID)
        first = os.fork()
        if first == 0:
            os.close(ready)
            run_init(user, cmd)
        os.write(ready, f"{first}\n".encode())
        os.close(ready)
        for sig in FORWARDED:
            signal.signal(sig, lambda s, _f: os.kill(first, s))
        code = os.waitstatus_to_exitcode(os.waitpid(first, 0)[1])
    except BaseException as e:  # the namespaces could not be made: say why where the hub logs
        print(f"namespaces: {user.pw_name}'s namespaces: {e}", file=sys.stderr, flush=True)
    os._exit(code & 0xFF if code >= 0 else 128 - code)


def loopback_of(uid: int) -> str:
    """The loopback address a user's server reaches the hub from: one a user, never 127.0.0.1 (root's
    side: the proxy), so the hub tells the servers apart (``loginlimit`` bounds each one's logins)."""
    return f"127.{100 + (uid >> 16) % 100}.{(uid >> 8) & 255}.{uid & 255}"


class Relay:
    """Copies connections across the namespace: the proxy's in, the server's hub calls out (from
    ``source``, the user's :func:`loopback_of`)."""

    def __init__(self, inside: int, port: int, hub_ports: Sequence[int], source: str) -> None:
        self.inside = inside  # the learner's network namespace
        self.outside = os.open("/proc/self/ns/net", os.O_RDONLY)
        self.port, self.hub_ports, self.source = port, list(hub_ports), source
        self.open = {"in": 0, "out": 0}

    def socket_in(self, namespace: int) -> socket.socket:
        """A TCP socket of ``namespace`` (the socket stays there; this process returns)."""
        setns(namespace, CLONE_NEWNET)
        try:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        finally:
            setns(self.outside, CLONE_NEWNET)
        s.setblocking(False)
        return s

    def listener(self, namespace: int, port: int) -> socket.socket:
        s = self.socket_in(namespace)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen(128)
        return s

    async def serve(self, listener: socket.socket, target_ns: int, port: int, direction: str) -> None:
        """Accept for ever (an error waits and tries again: the relay never stops on its own). The
        proxy's connections in are not capped (the box's side is the proxy's: capping them would let
        anyone who reaches the hub lock the learner out); the learner's out are, at
        :data:`MAX_CONNECTIONS`."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                client, _ = await loop.sock_accept(listener)
            except OSError:
                await asyncio.sleep(0.1)
                continue
            if direction == "out" and self.open[direction] >= MAX_CONNECTIONS:
                client.close()
                continue
            self.open[direction] += 1  # counted before the task runs, so the cap holds
            loop.create_task(self.connect(client, target_ns, port, direction))

    async def connect(self, client: socket.socket, target_ns: int, port: int, direction: str) -> None:
        loop = asyncio.get_running_loop()
        try:
            server = self.socket_in(target_ns)
            try:
                if direction == "out":
                    server.bind((self.source, 0))
                await loop.sock_connect(server, ("127.0.0.1", port))
                await asyncio.gather(self.pump(client, server), self.pump(server, client))
            finally:
                server.close()
        except OSError:
            pass  # not listening yet, a side went away, or no descriptor left
        finally:
            client.close()
            self.open[direction] -= 1

    async def open_when_up(self, proxy_side: socket.socket) -> None:
        """Listen on the box's side once the server listens inside: until then a connection is
        refused, as it would be by a server still starting (the hub's spawn queue waits for that)."""
        loop = asyncio.get_running_loop()
        while True:
            probe = self.socket_in(self.inside)
            try:
                await loop.sock_connect(probe, ("127.0.0.1", self.port))
                break
            except OSError:
                await asyncio.sleep(0.2)
            finally:
                probe.close()
        proxy_side.listen(128)
        await self.serve(proxy_side, self.inside, self.port, "in")

    @staticmethod
    async def pump(source: socket.socket, sink: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while data := await loop.sock_recv(source, 1 << 16):
            await loop.sock_sendall(sink, data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)


async def relay_until(child: int, first: int, relay: Relay, proxy_side: socket.socket,
                      inside: Sequence[socket.socket], log: ServerLog) -> int:
    """Relay until the namespaces' child ends; forward the stop signals to their first process."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[int] = loop.create_future()

    def reaped() -> None:
        pid, status = os.waitpid(child, os.WNOHANG)
        if pid and not done.done():
            done.set_result(os.waitstatus_to_exitcode(status))

    loop.add_signal_handler(signal.SIGCHLD, reaped)
    loop.add_reader(log.fd, log.readable)
    for sig in FORWARDED:
        loop.add_signal_handler(sig, os.kill, first, sig)
    tasks = [loop.create_task(relay.open_when_up(proxy_side))]
    tasks += [loop.create_task(relay.serve(listener, relay.outside, p, "out"))
              for listener, p in zip(inside, relay.hub_ports)]
    reaped()  # it may have ended before the handler was set
    code = await done
    for t in tasks:
        t.cancel()
    return code


def failed(child: int, out: int) -> int:
    """The namespaces were not made: their child's status, and what it said, in the hub's log."""
    code = os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]) or 1
    sys.stderr.write(os.read(out, 1 << 16).decode("utf-8", "replace"))
    return code


def server_stdio(out: int) -> None:
    """The server's standard streams: no input, its output into ``out`` (a pipe this process logs),
    never the terminal the hub may run in (a learner's server would read what the operator types)."""
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(devnull)
    os.close(out)


def raise_open_files() -> None:
    """As many descriptors as the box allows this process: each relayed connection takes two."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--user", required=True)
    p.add_argument("--port", type=int, required=True, help="the server's port, inside and outside")
    p.add_argument("--relay", type=int, action="append", default=[], help="a hub port the server may reach")
    p.add_argument("--shm-bytes", type=int, default=SHM_BYTES)
    p.add_argument("--exchange", help="nbgrader's exchange, read-only for this learner")
    p.add_argument("--inbound", help="its inbound folder, this learner's own inside")
    p.add_argument("--hide", action="append", default=[], help="a folder seen empty inside (a course copy)")
    p.add_argument("cmd", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if os.geteuid() != 0 or not cmd:
        p.error("runs as root (the hub's spawner), with the server's command after --")
    user = pwd.getpwnam(args.user)
    proxy_side = socket.socket(socket.AF_INET, socket.SOCK_STREAM)  # the box's side, made before the namespaces
    proxy_side.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    proxy_side.bind(("127.0.0.1", args.port))  # it listens once the server does (Relay.open_when_up)
    proxy_side.setblocking(False)
    raise_open_files()
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    out_r, out_w = os.pipe()
    child = os.fork()
    if child == 0:
        for fd in (ready_r, go_w, out_r):
            os.close(fd)
        proxy_side.close()
        server_stdio(out_w)
        run_namespaces(user, cmd, args.shm_bytes, ready_w, go_r,
                       (args.exchange, args.inbound) if args.exchange and args.inbound else None, args.hide)
    for fd in (ready_w, go_r, out_w):
        os.close(fd)
    with os.fdopen(ready_r) as ready:
        if ready.readline().strip() != "namespaces":
            return failed(child, out_r)
        relay = Relay(os.open(f"/proc/{child}/ns/net", os.O_RDONLY), args.port, args.relay, loopback_of(user.pw_uid))
        inside = [relay.listener(relay.inside, port) for port in relay.hub_ports]  # before the server starts
        os.write(go_w, b"go\n")
        os.close(go_w)
        first = ready.readline().strip()
    if not first:
        return failed(child, out_r)
    code = asyncio.run(relay_until(child, int(first), relay, proxy_side, inside, ServerLog(out_r, args.user)))
    return code & 0xFF if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
