"""What runs inside a Slurm job of the course: Horovod or torch.distributed wired from Slurm's variables.

``horovodrun`` cannot start workers on a cluster: it reaches the other nodes over SSH, which
clusters do not allow. This module does what ``horovodrun --gloo`` does internally
(``horovod/runner/gloo_run.py``), with Slurm starting the processes instead:

- ``python -m multigpu.running.slurm_job launch --form horovod -- srun ...`` runs in the batch step
  (on the job's first node). It reads the job's nodes (``scontrol show hostnames
  $SLURM_JOB_NODELIST``) and tasks per node (``SLURM_TASKS_PER_NODE``), starts Horovod's own
  rendezvous server (``RendezvousServer``, initialised with the plan ``horovodrun`` would make for
  those hosts) and runs the ``srun`` line with ``HOROVOD_GLOO_RENDEZVOUS_ADDR``/``PORT`` (the first
  node's address) exported. ``--form torch`` exports ``MASTER_ADDR``/``MASTER_PORT`` instead: rank
  0's TCP store on the first node is the rendezvous.
- ``python -m multigpu.running.slurm_job task --form horovod -- python train.py`` runs in each task
  ``srun`` starts: it maps ``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURM_NODEID`` and the node
  name to ``HOROVOD_RANK``, ``HOROVOD_LOCAL_RANK``, ``HOROVOD_CROSS_RANK``, ``HOROVOD_HOSTNAME`` ...
  (or ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE`` ...), names the network interface that reaches the
  rendezvous (``HOROVOD_GLOO_IFACE``, ``GLOO_SOCKET_IFNAME``), then becomes the program, whose
  ``hvd.init()`` (or ``init_process_group("gloo")``) reads them.
- ``python -m multigpu.running.slurm_job check --form horovod`` is a program for such a job: every
  rank all-reduces rank + 1 and prints one line (:data:`CHECK_TAG` and JSON) saying where it ran.

:mod:`multigpu.running.slurm` writes the batch script that uses these.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence

FORMS = ("horovod", "torch")
#: Exported by the batch step: the job's ``host:tasks,...`` in Slurm's order, so tasks need no scontrol.
HOSTS_VAR = "MULTIGPU_SLURM_HOSTS"
#: The start of each line ``check`` prints.
CHECK_TAG = "MULTIGPU_SLURM_CHECK "
#: torch.distributed's port on the first node when the batch script names none: 29500 + job id % 1000.
TORCH_BASE_PORT = 29500


class SlurmJobError(RuntimeError):
    """The job's environment is not what a Slurm task of the course expects; the message says why."""


def tasks_per_node(value: str) -> list[int]:
    """``SLURM_TASKS_PER_NODE`` expanded: ``"4(x2),3"`` -> ``[4, 4, 3]``."""
    counts = []
    for part in value.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not m:
            raise SlurmJobError(f"SLURM_TASKS_PER_NODE={value!r} is not of the form '4(x2),3'")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts


def scontrol(*args: str) -> str:
    done = subprocess.run(["scontrol", *args], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise SlurmJobError(f"scontrol {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout


def job_hosts(environ: Mapping[str, str]) -> list[tuple[str, int]]:
    """``[(node, tasks), ...]`` of this job, in Slurm's order (the batch step: asks scontrol)."""
    for name in ("SLURM_JOB_NODELIST", "SLURM_TASKS_PER_NODE"):
        if name not in environ:
            raise SlurmJobError(f"{name} is not set: run this inside a Slurm job (sbatch or salloc)")
    names = scontrol("show", "hostnames", environ["SLURM_JOB_NODELIST"]).split()
    counts = tasks_per_node(environ["SLURM_TASKS_PER_NODE"])
    if len(names) != len(counts):
        raise SlurmJobError(f"{len(names)} nodes ({' '.join(names)}) but tasks for {len(counts)} "
                            f"(SLURM_TASKS_PER_NODE={environ['SLURM_TASKS_PER_NODE']})")
    return list(zip(names, counts))


def node_address(node: str) -> str:
    """The address Slurm reaches ``node`` at (its ``NodeAddr``; the name itself where none is set)."""
    m = re.search(r"\bNodeAddr=(\S+)", scontrol("show", "node", "-o", node))
    return m.group(1) if m else node


def interface_to(address: str) -> str:
    """The name of this machine's network interface whose address routes to ``address``."""
    import psutil

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((socket.gethostbyname(address), 9))  # UDP: no packet is sent, the route is chosen
        mine = s.getsockname()[0]
    for nic, addrs in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == mine for a in addrs):
            return nic
    raise SlurmJobError(f"no interface holds {mine}, the address that routes to {address}: name one (--iface)")


def hosts_string(hosts: Sequence[tuple[str, int]]) -> str:
    return ",".join(f"{h}:{n}" for h, n in hosts)


def parse_hosts_string(value: str) -> list[tuple[str, int]]:
    return [(h, int(n)) for h, _, n in (item.rpartition(":") for item in value.split(","))]


def horovod_plan(hosts: Sequence[tuple[str, int]]) -> list:
    """Horovod's own slot plan (``SlotInfo`` per rank) for these hosts: what ``horovodrun -H`` makes."""
    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts

    return get_host_assignments(parse_hosts(hosts_string(hosts)), sum(n for _, n in hosts))


def horovod_env(environ: Mapping[str, str], iface: str) -> dict[str, str]:
    """The variables ``hvd.init()`` reads, for the Slurm task whose variables are ``environ``.
    Raises :class:`SlurmJobError` where Slurm placed the task elsewhere than Horovod's plan would
    (a cyclic distribution: ``--distribution=block`` is what Horovod expects)."""
    node, local = environ["SLURMD_NODENAME"], int(environ["SLURM_LOCALID"])
    rank = int(environ["SLURM_PROCID"])
    slots = [s for s in horovod_plan(parse_hosts_string(environ[HOSTS_VAR])) if s.hostname == node and s.local_rank == local]
    if not slots or slots[0].rank != rank:
        raise SlurmJobError(f"Slurm placed rank {rank} as local task {local} of {node}, where Horovod's plan has "
                            f"{'rank ' + str(slots[0].rank) if slots else 'no slot'}: submit with --distribution=block")
    slot = slots[0]
    return {
        "HOROVOD_HOSTNAME": node, "HOROVOD_RANK": str(slot.rank), "HOROVOD_SIZE": str(slot.size),
        "HOROVOD_LOCAL_RANK": str(slot.local_rank), "HOROVOD_LOCAL_SIZE": str(slot.local_size),
        "HOROVOD_CROSS_RANK": str(slot.cross_rank), "HOROVOD_CROSS_SIZE": str(slot.cross_size),
        "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo", "HOROVOD_GLOO_IFACE": iface,
    }


def torch_env(environ: Mapping[str, str], iface: str) -> dict[str, str]:
    """The variables ``init_process_group(init_method="env://")`` and torchrun-style scripts read."""
    counts = tasks_per_node(environ["SLURM_TASKS_PER_NODE"])
    return {
        "RANK": environ["SLURM_PROCID"], "WORLD_SIZE": environ["SLURM_NTASKS"],
        "LOCAL_RANK": environ["SLURM_LOCALID"], "LOCAL_WORLD_SIZE": str(counts[int(environ["SLURM_NODEID"])]),
        "GROUP_RANK": environ["SLURM_NODEID"], "GLOO_SOCKET_IFNAME": iface,
    }


def launch(form: str, argv: Sequence[str], port: int | None) -> int:
    """The batch step: the rendezvous for ``form``, then ``argv`` (the srun line); its exit code."""
    env = dict(os.environ)
    hosts = job_hosts(env)
    env[HOSTS_VAR] = hosts_string(hosts)
    address = node_address(hosts[0][0])
    server = None
    if form == "horovod":
        from horovod.runner.http.http_server import RendezvousServer

        server = RendezvousServer()
        env["HOROVOD_GLOO_RENDEZVOUS_PORT"] = str(server.start())  # listens on every address of this node
        server.init(horovod_plan(hosts))
        env["HOROVOD_GLOO_RENDEZVOUS_ADDR"] = address
    else:
        env["MASTER_ADDR"] = address
        env["MASTER_PORT"] = str(port or TORCH_BASE_PORT + int(env.get("SLURM_JOB_ID", "0")) % 1000)
    try:
        return subprocess.run(list(argv), env=env).returncode
    finally:
        if server is not None:
            server.stop()


def task(form: str, argv: Sequence[str], iface: str | None) -> None:
    """One task: Slurm's variables mapped to ``form``'s, then this process becomes ``argv``."""
    env = dict(os.environ)
    if HOSTS_VAR not in env:
        raise SlurmJobError(f"{HOSTS_VAR} is not set: start the tasks from the batch step's "
                            "`python -m multigpu.running.slurm_job launch -- srun ...`")
    rendezvous = env["HOROVOD_GLOO_RENDEZVOUS_ADDR" if form == "horovod" else "MASTER_ADDR"]
    iface = iface or interface_to(rendezvous)
    env.update(horovod_env(env, iface) if form == "horovod" else torch_env(env, iface))
    os.execvpe(argv[0], list(argv), env)


def check(form: str) -> dict[str, object]:
    """In each task: all-reduce rank + 1 across the job; print and return where this rank ran."""
    import torch

    torch.set_num_threads(1)
    if form == "horovod":
        import horovod.torch as hvd

        hvd.init()
        rank, size, local_rank = hvd.rank(), hvd.size(), hvd.local_rank()
        total = hvd.allreduce(torch.tensor([rank + 1.0]), op=hvd.Sum, name="slurm.check").item()
        hvd.shutdown()
    else:
        import torch.distributed as dist

        dist.init_process_group("gloo")
        rank, size, local_rank = dist.get_rank(), dist.get_world_size(), int(os.environ["LOCAL_RANK"])
        value = torch.tensor([rank + 1.0])
        dist.all_reduce(value)
        total = value.item()
        dist.destroy_process_group()
    seen = {"form": form, "rank": rank, "size": size, "local_rank": local_rank, "sum": total,
            "slurm_node": os.environ.get("SLURMD_NODENAME"), "slurm_procid": int(os.environ["SLURM_PROCID"]),
            "horovod_hostname": os.environ.get("HOROVOD_HOSTNAME"),
            "iface": os.environ.get("HOROVOD_GLOO_IFACE") or os.environ.get("GLOO_SOCKET_IFNAME")}
    print(CHECK_TAG + json.dumps(seen), flush=True)
    return seen


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m multigpu.running.slurm_job", description=__doc__.split("\n\n")[0])
    parser.add_argument("step", choices=("launch", "task", "check"))
    parser.add_argument("--form", choices=FORMS, default="horovod")
    parser.add_argument("--iface", help="the network interface the nodes share (default: the one that routes "
                                        "to the first node)")
    parser.add_argument("--port", type=int, help="torch form: MASTER_PORT (default 29500 + job id %% 1000)")
    parser.epilog = "after --: the srun line (launch) or the program (task)"
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)  # everything after the first -- is the command
    args, command = parser.parse_args(argv[:cut]), argv[cut + 1:]
    try:
        if args.step == "check":
            check(args.form)
            return 0
        if not command:
            parser.error(f"{args.step}: give the command after --")
        if args.step == "launch":
            return launch(args.form, command, args.port)
        task(args.form, command, args.iface)
    except SlurmJobError as e:
        print(f"multigpu.running.slurm_job {args.step}: {e}", file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
