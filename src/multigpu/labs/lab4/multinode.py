"""Lab 4: the multi-node command, checked before a cluster is rented.

Going from one machine to several is "the same command with more hosts": ``horovodrun`` starts
every worker over SSH on the hosts it is given and the workers find each other over the network.
What goes wrong is nearly always the command: a slot count that is not the GPU count, ``-np``
that does not match the slots, ``localhost`` in a list of several machines (every machine
resolves it to itself), no network interface named (Horovod then probes every interface the
hosts share, docker bridges included), or no hierarchical all-reduce on machines with fast links
inside and a slower network between them (02b, section 2.3).

:func:`check_command` reads a learner's command with Horovod's own argument parser
(``horovod.runner.launch.parse_args``, so what it accepts is what ``horovodrun`` accepts) and
returns what is wrong with it for a given cluster shape, in words a learner can act on: an empty
list for a command that would start the job. :func:`parse_hostfile` reads a host file
(``<host> slots=<n>`` per line, the format ``horovodrun --hostfile`` and ``mpirun`` read).

The same command runs on one machine when the "hosts" are two names for it: ``localhost`` and
``127.0.0.1`` are both local addresses, so ``horovodrun -H localhost:2,127.0.0.1:2`` starts 2
workers under each name without SSH and Horovod sees 2 hosts of 2 workers (local and cross
ranks as on a real cluster; the traffic between "hosts" is loopback).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
import sys
from dataclasses import dataclass

#: Host names that mean "this machine" on every machine: wrong in a list of several nodes.
LOCAL_NAMES = {"localhost", "127.0.0.1", "::1", "0.0.0.0"}
#: The one machine's two names the course uses for a 2-host job on one box.
ONE_BOX_HOSTS = ("localhost", "127.0.0.1")
#: Interfaces that never reach another machine.
LOOPBACK_NICS = {"lo", "lo0"}


class CommandError(ValueError):
    """A command or host file that cannot be read at all; the message says why."""


@dataclass
class Command:
    """What a ``horovodrun`` command asks for."""

    np: int
    hosts: dict[str, int]  #: host -> slots, in order; empty when none is named
    nics: set[str]
    hierarchical_allreduce: bool
    program: list[str]  #: what every worker runs


def parse_hostfile(text: str) -> dict[str, int]:
    """``{host: slots}`` from a host file: ``<host> slots=<n>`` per line; blank lines and ``#``
    comments are skipped. Raises :class:`CommandError` on a line of another form or a host named twice."""
    hosts: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"(\S+)\s+slots\s*=\s*(\d+)", line)
        if not m:
            raise CommandError(f"host file line {number} ({raw.strip()!r}): write '<host> slots=<GPUs on it>', "
                               "e.g. 'node1 slots=4'")
        host, slots = m.group(1), int(m.group(2))
        if host in hosts:
            raise CommandError(f"host file line {number}: {host} is named twice")
        hosts[host] = slots
    return hosts


def _parse_hosts_option(value: str) -> dict[str, int]:
    """``-H``'s value read by Horovod's own reader, a host named twice refused."""
    from horovod.runner.common.util.hosts import parse_hosts_and_slots

    try:
        names, slots = parse_hosts_and_slots(value)
    except ValueError:
        raise CommandError(f"-H {value}: each host is '<name>:<slots>', comma-separated, e.g. -H node1:4,node2:4") from None
    twice = sorted({h for h in names if names.count(h) > 1})
    if twice:
        raise CommandError(f"-H {value}: {', '.join(twice)} is named twice")
    return {h: slots[h] for h in names}


def parse_command(command: str, hostfile: str | None = None) -> Command:
    """Read a ``horovodrun`` command line with Horovod's own parser. ``hostfile``: the text of the
    file that ``--hostfile`` names (the path itself is not read). Raises :class:`CommandError`."""
    try:
        argv = shlex.split(command)
    except ValueError as e:
        raise CommandError(f"the command cannot be split into words: {e}") from None
    env = {}
    while argv and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", argv[0]):  # VAR=value prefixes
        name, _, value = argv.pop(0).partition("=")
        env[name] = value
    if not argv or argv[0].rsplit("/", 1)[-1] != "horovodrun":
        raise CommandError("start the command with horovodrun")
    from horovod.runner import launch as hvd_launch

    saved, errors = sys.argv, io.StringIO()
    sys.argv = argv
    try:
        with contextlib.redirect_stderr(errors), contextlib.redirect_stdout(io.StringIO()):
            args: argparse.Namespace = hvd_launch.parse_args()
    except SystemExit:
        last = [line for line in errors.getvalue().splitlines() if line.strip()]
        raise CommandError("horovodrun would refuse it: " + (last[-1] if last else "invalid options")) from None
    finally:
        sys.argv = saved
    if args.hosts:
        hosts = _parse_hosts_option(args.hosts)
    elif args.hostfile:
        if hostfile is None:
            raise CommandError(f"the command reads the host file {args.hostfile}: give its text too")
        hosts = parse_hostfile(hostfile)
    else:
        hosts = {}
    hierarchical = bool(args.hierarchical_allreduce) or env.get("HOROVOD_HIERARCHICAL_ALLREDUCE") == "1"
    return Command(args.num_proc, hosts, set(args.nics or ()), hierarchical, list(args.command))


def check_command(command: str, *, nodes: int, gpus_per_node: int, hostfile: str | None = None,
                  one_box: bool = False) -> list[str]:
    """What is wrong with ``command`` for a job on ``nodes`` machines with ``gpus_per_node`` GPUs
    each, one worker per GPU (an empty list: nothing). ``one_box``: the course's rehearsal on one
    machine, whose hosts are :data:`ONE_BOX_HOSTS` and whose only network is the loopback."""
    try:
        cmd = parse_command(command, hostfile)
    except CommandError as e:
        return [str(e)]
    problems = []
    total = nodes * gpus_per_node
    if not cmd.hosts:
        problems.append(f"name the {nodes} hosts (-H node1:{gpus_per_node},node2:{gpus_per_node} or --hostfile FILE): "
                        "without them horovodrun starts every worker on this machine")
    else:
        if len(cmd.hosts) != nodes:
            problems.append(f"name {nodes} hosts, one per machine: {len(cmd.hosts)} named ({', '.join(cmd.hosts)})")
        wrong = [f"{h}:{s}" for h, s in cmd.hosts.items() if s != gpus_per_node]
        if wrong:
            problems.append(f"give each host as many slots as it has GPUs ({gpus_per_node}), one worker per GPU: "
                            f"{', '.join(wrong)}")
        local = [h for h in cmd.hosts if h in LOCAL_NAMES]
        if one_box:
            if set(cmd.hosts) != set(ONE_BOX_HOSTS):
                problems.append(f"name the one machine twice, as {' and '.join(ONE_BOX_HOSTS)}: both are local, "
                                "so no SSH is needed")
        elif local and len(cmd.hosts) > 1:
            problems.append(f"use the nodes' names or addresses: {' and '.join(local)} "
                            f"{'means' if len(local) == 1 else 'mean'} a different machine on every node")
    if cmd.np != total:
        problems.append(f"set -np {total}, not {cmd.np}: {nodes} nodes x {gpus_per_node} GPUs is {total} workers")
    if one_box:
        if cmd.nics - LOOPBACK_NICS:
            problems.append("name no interface, or lo: on one machine the workers talk over the loopback")
    elif not cmd.nics:
        problems.append("name the network interface the nodes share (--network-interface eth0, say, or ib0 for "
                        "InfiniBand): otherwise Horovod probes every interface, docker bridges included")
    elif cmd.nics & LOOPBACK_NICS:
        problems.append(f"name the interface the nodes share: --network-interface "
                        f"{', '.join(sorted(cmd.nics & LOOPBACK_NICS))} never reaches another machine")
    if nodes > 1 and not cmd.hierarchical_allreduce:
        problems.append("add --hierarchical-allreduce: reduce inside each node over its fast links first, then "
                        "across nodes through one worker per node (02b, section 2.3)")
    if not cmd.program:
        problems.append("end the command with what every worker runs, e.g. python train.py")
    elif not re.search(r"python", cmd.program[0]):
        problems.append(f"run the training script with python: every worker would run {cmd.program[0]!r}")
    return problems


def where_am_i() -> tuple[int, int, int, int, int, int]:
    """Run in each worker of a Horovod job: ``(rank, size, local_rank, local_size, cross_rank,
    sum of all ranks)``, the sum by an all-reduce across every host (Lab 4's one-box rehearsal)."""
    import horovod.torch as hvd
    import torch

    hvd.init()
    total = hvd.allreduce(torch.tensor([float(hvd.rank())]), op=hvd.Sum).item()
    return hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), hvd.cross_rank(), int(total)
