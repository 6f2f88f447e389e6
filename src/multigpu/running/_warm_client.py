"""Start one Python process as a fork of the warm parent instead of a fresh interpreter.

    python -I -S _warm_client.py SOCKET [python arguments: -u, -B, then -m MODULE | -c CODE | SCRIPT] ARGS...

Run as a file (it imports nothing of the course), this is what :mod:`multigpu.running.warm` puts
where a command would start ``python``: ``horovodrun`` and ``mpirun`` start it like any worker.
It hands the warm parent (:mod:`multigpu.running._zygote`) its command, environment, folder, umask,
limits and open file descriptors; the parent's fork becomes the worker and writes straight into
this process's stdout and stderr. This process stays as the worker's stand-in: signals sent to it
go to the worker, it exits with the worker's status, and when it is killed the parent kills the
worker. Where the parent cannot take the command (no parent, an option this does not know, a
variable read when libraries load), it becomes a fresh ``python`` with the same arguments.
"""

import json
import os
import resource
import signal
import socket
import struct
import sys

FLAGS = {"-u", "-B"}
FORWARDED = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")
LIMITS = ("RLIMIT_AS", "RLIMIT_CORE", "RLIMIT_CPU", "RLIMIT_DATA", "RLIMIT_FSIZE", "RLIMIT_NOFILE",
          "RLIMIT_NPROC", "RLIMIT_STACK", "RLIMIT_MEMLOCK")


def cold(args):
    """Become a fresh Python with the same arguments."""
    os.execv(sys.executable, [sys.executable, *args])


def parse(args):
    """The request for ``python args``, or None where only a fresh Python can run them."""
    flags, i = set(), 0
    while i < len(args) and args[i] in FLAGS:
        flags.add(args[i])
        i += 1
    if i >= len(args):
        return None
    if args[i] in ("-m", "-c"):
        if i + 1 >= len(args):
            return None
        mode = "module" if args[i] == "-m" else "code"
        target, rest = args[i + 1], args[i + 2:]
    elif args[i].startswith("-"):
        return None
    else:
        mode, target, rest = "script", os.path.abspath(args[i]), args[i + 1:]
    return {"mode": mode, "target": target, "args": rest, "unbuffered": "-u" in flags}


def open_fds(skip):
    fds = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd == skip:
            continue
        try:
            if not os.get_inheritable(fd):
                continue  # opened by this process (the listing itself): not the worker's
        except OSError:
            continue
        fds.append(fd)
    return sorted(fds)


def describe(request, conn):
    request["env"] = dict(os.environ)
    request["cwd"] = os.getcwd()
    request["umask"] = os.umask(0o22)
    os.umask(request["umask"])
    request["limits"] = {n: resource.getrlimit(getattr(resource, n)) for n in LIMITS if hasattr(resource, n)}
    request["ignored"] = [n for n in FORWARDED if signal.getsignal(getattr(signal, n)) == signal.SIG_IGN]
    request["fds"] = open_fds(conn.fileno())
    if "PMI_SIZE" in os.environ:  # a rank of an MPI job: its proxy started every rank here
        request["group"] = f"{os.getppid()}:{os.environ['PMI_SIZE']}"
    return request


def wait(conn, fds):
    """Forward signals to the worker until the parent reports its exit status; return it."""
    lines = conn.makefile("r")
    answer = json.loads(lines.readline() or "null")
    if answer is None or "pid" not in answer:
        return answer
    pid = answer["pid"]
    # The worker's output ends when the worker ends, as a launcher expects: only the worker holds
    # stdout and stderr now. Under an MPI launcher (it kills the ranks still open once one rank has
    # gone, and reads the end of a rank's PMI socket as the end of that rank) this stand-in keeps
    # the PMI socket alone, until it exits, and drops every other descriptor it was given (some are
    # other ranks' output pipes the launcher let it inherit); elsewhere it keeps them.
    errors = None
    if "PMI_FD" in os.environ:
        for fd in fds:
            if fd > 2 and str(fd) != os.environ["PMI_FD"]:
                os.close(fd)
    elif "PMI_SIZE" not in os.environ:
        errors = os.dup(2)  # to say why, should the warm parent die
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)

    def forward(signum, _frame):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    for name in FORWARDED:
        if signal.getsignal(getattr(signal, name)) != signal.SIG_IGN:
            signal.signal(getattr(signal, name), forward)
    line = lines.readline()
    if not line:  # the parent died: its fork dies with it (PR_SET_PDEATHSIG), say why
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if errors is not None:
            os.write(errors, b"warm worker: the warm parent process ended while this worker ran\n")
        return {"exit": 1}
    return json.loads(line)


def main(argv):
    path, args = argv[0], argv[1:]
    request = parse(args)
    if request is None:
        cold(args)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
    except OSError:
        cold(args)
    payload = json.dumps(describe(request, conn)).encode()
    data = struct.pack("!I", len(payload)) + payload
    fds = request["fds"]
    sent = socket.send_fds(conn, [data], fds)
    if sent < len(data):
        conn.sendall(data[sent:])
    answer = wait(conn, fds)
    if answer is None or "cold" in answer:
        conn.close()
        cold(args)
    code = answer["exit"]
    if code < 0:  # killed by a signal: die of the same one, so a launcher sees what it would have
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.stdout.flush()
    os._exit(code & 0xFF)


if __name__ == "__main__":
    main(sys.argv[1:])
