"""Lab 4: elastic Horovod on one machine: a worker dies, training goes on, and no sample is lost.

:func:`run` starts :mod:`multigpu.running.scripts.train_elastic` under ``horovodrun`` in elastic mode
(``--min-np``/``--max-np`` and a host discovery script) and can kill a worker mid-epoch: the
course's supervisor (:func:`multigpu.running.launch.supervise`) watches the job and, at the chosen commit,
sends SIGKILL to one worker, as a lost machine would. Horovod treats a worker's death as its
host's: the host is blacklisted and every worker on it leaves; ``cooldown_s`` lets the host back
after a while, and the job grows again at its next commit.

One machine, several hosts: Horovod starts a worker without SSH when the host's name resolves to
an address of this machine, so ``localhost`` and ``127.0.0.1`` are two hosts for it (see
:mod:`multigpu.labs.lab4.multinode`).

Two timeouts decide whether a run survives a busy machine: ``gloo_timeout_s``, how long a worker
waits for a peer in a collective before it gives the peer up for lost (short: the survivors notice
a dead worker sooner), and ``rendezvous_timeout_s``, how long workers wait for each other when the
ring is formed, the survivors included when the lost host comes back: a joining worker starts
Python and imports torch first. On the 2-core machine the survivors waited 5 s for the joiners
with little other work running and 11-23 s beside one busy process per core, so a 5 s Gloo timeout
for both made the kill run fail on a busy machine. Item 6 of the project's Horovod patch keeps the
two apart (unpatched Horovod waits ``gloo_timeout_s`` for both). A job that fails anyway raises
:class:`ElasticJobFailed`, which says what happened and what to do.

The ledger the script writes (one JSON-lines file per worker process) is read by
:func:`read_ledger`; :func:`account` checks that the committed samples cover every sample of every
epoch exactly once: nothing lost, nothing trained twice past the last commit.
"""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from multigpu.labs.lab4.multinode import ONE_BOX_HOSTS
from multigpu.running import launch

SCRIPT_MODULE = "multigpu.running.scripts.train_elastic"


class ElasticJobFailed(launch.WorkerError):
    """The elastic job ended with an error; the message says why and what to do (see
    :func:`explain_failure`). :attr:`run` holds what the job left (its ledger included)."""

    def __init__(self, message: str, run: ElasticRun):
        super().__init__(message)
        self.run = run


@dataclass
class Entry:
    """One line of a worker's ledger, with the process that wrote it."""

    pid: int
    event: str  #: "start", "step" (rank 0 only), "commit", "reset" or "end"
    data: dict


@dataclass
class Accounting:
    """What the ledger says about a run (see :func:`account`)."""

    dataset_size: int
    epochs: int
    sizes: list[int]  #: the number of workers, at the start and after each reset
    resets: int
    lost_samples: int  #: uncommitted samples the surviving workers threw away at resets
    missing: dict[int, list[int]] = field(default_factory=dict)  #: epoch -> samples never committed
    repeated: dict[int, list[int]] = field(default_factory=dict)  #: epoch -> samples committed twice or more

    @property
    def exact(self) -> bool:
        return not any(self.missing.values()) and not any(self.repeated.values())

    def report(self) -> str:
        lines = [(f"workers over the run: {' -> '.join(map(str, self.sizes))} ({self.resets} reset(s)); "
                  f"uncommitted samples thrown away by the survivors: {self.lost_samples}")]
        for epoch in range(self.epochs):
            missing, repeated = self.missing.get(epoch, []), self.repeated.get(epoch, [])
            lines.append(f"epoch {epoch + 1}: {self.dataset_size - len(missing)} of {self.dataset_size} samples "
                         f"committed, {len(missing)} missing, {len(repeated)} more than once"
                         + (f" (e.g. {(missing or repeated)[:5]})" if missing or repeated else ""))
        return "\n".join(lines)


@dataclass
class ElasticRun:
    """What :func:`run` returns."""

    result: launch.JobResult
    accounting: Accounting
    entries: list[Entry]
    killed: list[tuple[float, int]]  #: (when, as ``time.time()``, pid) of each worker killed


def write_discovery(folder: Path, hosts: dict[str, int]) -> Path:
    """A host discovery script in ``folder`` that prints the hosts of ``folder/hosts.txt``, and
    that file with ``hosts``; :func:`set_hosts` changes them while the job runs."""
    folder.mkdir(parents=True, exist_ok=True)
    set_hosts(folder, hosts)
    script = folder / "discover.sh"
    script.write_text(f"#!/bin/sh\ncat '{folder / 'hosts.txt'}'\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return script


def set_hosts(folder: Path, hosts: dict[str, int]) -> None:
    """What the discovery script reports from now on (``{host: slots}``), written atomically."""
    tmp = folder / "hosts.txt.tmp"
    tmp.write_text("".join(f"{host}:{slots}\n" for host, slots in hosts.items()))
    os.replace(tmp, folder / "hosts.txt")


def read_ledger(folder: Path) -> list[Entry]:
    """Every ledger line under ``folder`` in time order."""
    entries = []
    for path in Path(folder).glob("*.jsonl"):
        for line in path.read_text().splitlines():
            if line.strip():
                d = json.loads(line)
                entries.append(Entry(int(path.stem), d["event"], d))
    return sorted(entries, key=lambda e: e.data["time"])


def account(entries: list[Entry], dataset_size: int, epochs: int) -> Accounting:
    """Count each sample's commits per epoch; with the run's worker counts and resets."""
    counts: dict[int, Counter] = {e: Counter() for e in range(epochs)}
    sizes: list[int] = []
    resets, lost = 0, 0
    for entry in entries:
        if entry.event == "commit":
            counts[entry.data["epoch"]].update(entry.data["indices"])
        elif entry.event == "start" and not sizes:
            sizes.append(entry.data["size"])
        elif entry.event == "reset":
            lost += entry.data.get("lost", 0)
            if entry.data["rank"] == 0:  # one line per reset for the run
                resets += 1
                sizes.append(entry.data["size"])
    result = Accounting(dataset_size, epochs, sizes, resets, lost)
    for epoch, c in counts.items():
        result.missing[epoch] = [i for i in range(dataset_size) if c[i] == 0]
        result.repeated[epoch] = sorted(i for i, n in c.items() if n > 1)
    return result


def worker_pids(entries: list[Entry], host: str | None = None) -> list[int]:
    """The worker processes of a ledger that are still alive (on ``host`` only, if given)."""
    pids = []
    for entry in entries:
        if entry.event == "start" and (host is None or entry.data.get("host") == host):
            try:
                os.kill(entry.pid, 0)
            except ProcessLookupError:
                continue
            pids.append(entry.pid)
    return pids


#: What the output of a failed job says (a regular expression), and what it means for the learner
#: (first match wins; ``{0}`` is the expression's first group).
FAILURE_CAUSES = (
    (r"Wait timeout after (\d+) seconds for key",
     ("workers waited {0} s for a peer to join the ring and gave up: a worker that starts (or rejoins "
      "after its host came back) imports torch first, and this machine was too busy to do that in time. "
      "Stop other work on the machine, or pass a longer rendezvous_timeout_s, and run the cell again.")),
    (r"has exceeded limit",
     "the job changed its set of workers more often than Horovod's reset limit allows."),
    (r"blacklisted slots count ==",
     "every host of the job failed and was blacklisted: no host was left to go on."),
    (r"failure count ==",
     "every worker exited with an error (below), so no survivor was left to go on."),
)


#: Lines of a job's output that say what went wrong (a worker's C++ exception, the driver's verdict).
ERROR_MARKS = ("what():", "ERROR", "Error", "exit with status code", "Exit code")


def explain_failure(result: launch.JobResult) -> str:
    """Why a failed elastic job failed, for a person: the first of :data:`FAILURE_CAUSES` its
    output shows, then its last :data:`ERROR_MARKS` lines."""
    found = ((re.search(pattern, result.text), meaning) for pattern, meaning in FAILURE_CAUSES)
    why = next((meaning.format(*match.groups()) for match, meaning in found if match),
               f"horovodrun exited with {result.returncodes}.")
    errors = [line for line in result.output if any(mark in line for mark in ERROR_MARKS)]
    return why + "\nWhat the job said:\n" + "\n".join(errors[-12:] or result.output[-12:])


def run(
    out: str | os.PathLike,
    *,
    hosts: dict[str, int] | None = None,
    min_np: int = 2,
    kill_at_commit: int | None = None,
    kill_after_steps: int = 0,
    kill_host: str = ONE_BOX_HOSTS[0],
    cooldown_s: tuple[int, int] | None = None,
    gloo_timeout_s: int = 10,
    rendezvous_timeout_s: int = 120,
    script_args: list[str] | tuple[str, ...] = (),
    timeout: float = 300.0,
    echo: bool = True,
) -> ElasticRun:
    """Run the elastic script on ``hosts`` (default: 2 slots on each of
    :data:`multigpu.labs.lab4.multinode.ONE_BOX_HOSTS`); with
    ``kill_at_commit=K``, SIGKILL one worker on ``kill_host`` once rank 0 has made
    ``kill_after_steps`` steps past the run's K-th commit (steps that every worker has trained and
    no commit holds: the survivors throw them away).
    ``cooldown_s``: Horovod's blacklist cool-down range, after which the lost host may rejoin.
    ``gloo_timeout_s``: how long a worker waits in a collective before it gives a peer up for lost
    (Horovod's default, 30 s, is most of the recovery time on one machine).
    ``rendezvous_timeout_s``: how long workers wait for each other to form the ring, at the start
    and when workers join (Horovod's ``HOROVOD_GLOO_RENDEZVOUS_TIMEOUT_SECONDS``, item 6 of the
    project's patch; never shorter than ``gloo_timeout_s``).
    ``script_args``: options of :mod:`multigpu.running.scripts.train_elastic`.
    Raises :class:`ElasticJobFailed` when the job fails."""
    out = Path(out)
    ledger = out / "ledger"
    ledger.mkdir(parents=True, exist_ok=True)
    for old in ledger.glob("*.jsonl"):
        old.unlink()
    hosts = hosts or {h: 2 for h in ONE_BOX_HOSTS}
    script = write_discovery(out / "discovery", hosts)
    cmd = _elastic_command(sum(hosts.values()), min_np, script, gloo_timeout_s, cooldown_s, ledger, script_args)
    killer = _Killer(ledger, kill_at_commit, kill_after_steps, kill_host, echo)
    env = launch.worker_env({"HOROVOD_LOG_LEVEL": "warning", "HOROVOD_GLOO_RENDEZVOUS_TIMEOUT_SECONDS": str(rendezvous_timeout_s)})
    proc = launch.start(cmd, env=env, cwd=out)
    result = launch.supervise([proc], ["horovodrun"], timeout, echo=echo, what="elastic horovodrun",
                              on_tick=killer.tick, tick_s=0.2)
    from multigpu.running.scripts import train_elastic

    options = train_elastic.parse_args(list(script_args))
    entries = read_ledger(ledger)
    done = ElasticRun(result, account(entries, options.synthetic, options.epochs), entries, killer.killed)
    if result.returncodes != [0]:
        raise ElasticJobFailed(f"the elastic job failed: {explain_failure(result)}", done)
    return done


def _elastic_command(total: int, min_np: int, discovery: Path, gloo_timeout_s: int, cooldown_s: tuple[int, int] | None,
                     ledger: Path, script_args: Sequence[str]) -> list[str]:
    """``horovodrun`` of :data:`SCRIPT_MODULE` elastic: ``min_np`` to ``total`` workers on the
    hosts ``discovery`` lists, over Gloo."""
    cmd = [launch.executable("horovodrun"), "--gloo", "-np", str(total), "--min-np", str(min_np),
           "--max-np", str(total), "--host-discovery-script", str(discovery), "--gloo-timeout-seconds", str(gloo_timeout_s)]
    if cooldown_s:
        cmd += ["--blacklist-cooldown-range", str(cooldown_s[0]), str(cooldown_s[1])]
    return [*cmd, sys.executable, "-m", SCRIPT_MODULE, "--ledger", str(ledger), *script_args]


@dataclass
class _Killer:
    """:func:`run`'s ``on_tick``: SIGKILL one worker on ``kill_host`` once rank 0 has made
    ``kill_after_steps`` steps past the ``kill_at_commit``-th commit of the ledger (never with
    ``kill_at_commit`` None); ``killed`` holds when and whom."""

    ledger: Path
    kill_at_commit: int | None
    kill_after_steps: int
    kill_host: str
    echo: bool
    killed: list[tuple[float, int]] = field(default_factory=list)

    def tick(self, elapsed: float) -> str:
        if self.kill_at_commit is None or self.killed:
            return ""
        entries = read_ledger(self.ledger)
        commits = [e for e in entries if e.event == "commit" and e.data["rank"] == 0]
        if len(commits) < self.kill_at_commit:
            return ""
        since = commits[self.kill_at_commit - 1].data["time"]
        if sum(1 for e in entries if e.event == "step" and e.data["time"] > since) >= self.kill_after_steps:
            victims = worker_pids(entries, self.kill_host)
            if victims:
                os.kill(victims[0], signal.SIGKILL)
                self.killed.append((time.time(), victims[0]))
                if self.echo:
                    print(f"[elastic] {elapsed:.1f} s: killed worker pid {victims[0]} on {self.kill_host}, "
                          f"{self.kill_after_steps} step(s) after commit {self.kill_at_commit}", flush=True)
        return ""


def plot_run(run: ElasticRun, ax: Any = None) -> Any:
    """The run over time: the number of workers at each of rank 0's steps, its commits, and the kill."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(9, 3.2))
    t0 = min(e.data["time"] for e in run.entries)
    steps = [(e.data["time"] - t0, e.data["size"]) for e in run.entries if e.event == "step"]
    commits = [e.data["time"] - t0 for e in run.entries if e.event == "commit" and e.data["rank"] == 0]
    resets = [e.data["time"] - t0 for e in run.entries if e.event == "reset" and e.data["rank"] == 0]
    ax.plot([t for t, _ in steps], [n for _, n in steps], ".", color="C0", label="a step of rank 0 (workers then)")
    for i, t in enumerate(commits):
        ax.axvline(t, color="C2", lw=0.6, alpha=0.6, label="commit" if i == 0 else None)
    for i, t in enumerate(resets):
        ax.axvline(t, color="C1", lw=1.5, ls="--", label="reset: workers left or joined" if i == 0 else None)
    for i, (when, _) in enumerate(run.killed):
        ax.axvline(when - t0, color="C3", lw=2, label="worker killed" if i == 0 else None)
    ax.set(xlabel="seconds since the first worker started", ylabel="workers", ylim=(0, max(n for _, n in steps) + 1),
           title="Elastic Horovod: a worker dies, training goes on")
    ax.legend(loc="lower right", fontsize=8)
    return ax


#: The ways :func:`resume_one_step` restarts a plain job from rank 0's checkpoint.
RESUME_ORDERS = {
    "the weights only": ("parameters",),
    "the weights, then the optimizer's state": ("parameters", "optimizer"),
    "the optimizer's state, then the weights": ("optimizer", "parameters"),
}


def resume_one_step(checkpoint: str) -> dict[str, float]:
    """Run in each worker of a plain (not elastic) Horovod job: restart from ``checkpoint`` as the
    course's script saves it (rank 0 wrote it; only rank 0 reads it), broadcast what each of
    :data:`RESUME_ORDERS` says in its order, take one training step on the same batch, and return
    this worker's weight checksum after it, per order.

    What it shows (Lab 4): without the optimizer's state the other ranks restart with no momentum
    and one step makes the copies differ. With it, the order matters when the optimizer has weight
    decay: ``hvd.broadcast_optimizer_state`` first gives an optimizer without state one step with
    zero gradients to create it, and weight decay moves the weights in that step; broadcast the
    weights after it."""
    import horovod.torch as hvd
    import torch

    from multigpu.core import models, training
    from multigpu.running.scripts.common import checksum

    hvd.init()
    torch.manual_seed(0)  # the same batch on every rank: any difference comes from the restart
    size = models.default_image_size("alexnet_small")
    images, labels = torch.randn(8, 3, size, size), torch.randint(0, 10, (8,))
    after = {}
    for name, order in RESUME_ORDERS.items():
        model = models.build_model("alexnet_small")
        optimizer = hvd.DistributedOptimizer(training.make_optimizer(model, 0.01), named_parameters=model.named_parameters())
        if hvd.rank() == 0:  # into the wrapped optimizer: wrapping makes a new one, without the loaded state
            saved = torch.load(checkpoint, weights_only=True)
            model.load_state_dict(saved["model"])
            optimizer.load_state_dict(saved["optimizer"])
        for what in order:
            if what == "parameters":
                hvd.broadcast_parameters(model.state_dict(), root_rank=0)
            else:
                hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(images), labels).backward()
        optimizer.step()
        after[name] = checksum(model)
    return after
