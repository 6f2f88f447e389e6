"""The hub on a Slurm cluster (``make hub SPAWNER=slurm``): each user's server is a Slurm job.

:class:`SlurmWorkshopSpawner` is batchspawner's ``SlurmSpawner`` with the workshop's settings:

- the job asks for one learner's share, ``MULTIGPU_LEARNER_CPUS`` cores (``--cpus-per-task``,
  rounded up) and ``MULTIGPU_LEARNER_MEM_GB`` (``--mem``), on ``MULTIGPU_SLURM_PARTITION`` for
  ``MULTIGPU_SLURM_RUNTIME`` (default 12 h, a workshop day);
- ``sbatch``, ``squeue``, ``scontrol`` and ``scancel`` run as the user (``setpriv``: the job is
  theirs, Slurm's accounting and limits see them), after ``MULTIGPU_SLURM_PREFIX`` when it is set
  (the test cluster's ``nsenter --net=...``), with ``SLURM_CONF`` when the hub has it;
- the server's address is the node's ``NodeAddr`` (``scontrol show node``), not its name, which
  the hub's box need not resolve;
- a job that ends before its server answers, or while it runs (``scancel``, a node lost, its time
  limit), is said in words a learner understands, with Slurm's state and reason;
- submissions wait in the hub's spawn queue (``spawnqueue``, ``MULTIGPU_SPAWN_LIMIT`` at a time),
  as starts do on one box; Slurm's own queue then places the jobs.

What the one-box spawner adds and this one does not: its cgroup (on a cluster Slurm's own
``task/cgroup`` confines each job to its cores and memory: the admin's ``cgroup.conf``) and its
namespaces (private PIDs, network, /tmp; the exchange read-only). On a cluster the nodes'
own rules apply; docs/workshop.md, "The hub on the cluster", says what the admin sets.

The hub itself (its API, its proxy) must be reachable from the nodes: ``MULTIGPU_HUB_CONNECT_IP``
is the hub's address on the cluster's network; the hub's API then listens on every interface.
"""

from __future__ import annotations

import math
import os
import pwd
import re
import shlex
import sys
from pathlib import Path
from typing import Any

from multigpu.core import layout as course_layout
from multigpu.workshop import hubconfig, spawnqueue
from multigpu.workshop.layout import Hub

try:
    from batchspawner import SlurmSpawner
except ImportError:  # only the hub's environment has batchspawner (deploy/hub/install.sh)
    SlurmSpawner = object

#: A workshop day: the job's ``--time`` unless ``MULTIGPU_SLURM_RUNTIME`` says otherwise.
RUNTIME = "12:00:00"
#: Seconds between the hub's checks that each job still runs (JupyterHub's default is 30).
POLL_S = 30

#: The job script: Slurm's options, then the server in a job step. Jinja, filled by batchspawner
#: from the spawner's ``req_*`` values; the output goes to a hidden file in the user's home.
BATCH_SCRIPT = """#!/bin/bash
#SBATCH --job-name=jupyter-{{username}}
#SBATCH --output={{homedir}}/.jupyter-slurm-%j.log
#SBATCH --chdir={{homedir}}
#SBATCH --export={{keepvars}}
#SBATCH --nodes=1
#SBATCH --ntasks=1
{% if partition %}#SBATCH --partition={{partition}}
{% endif %}{% if runtime %}#SBATCH --time={{runtime}}
{% endif %}{% if memory %}#SBATCH --mem={{memory}}
{% endif %}{% if nprocs %}#SBATCH --cpus-per-task={{nprocs}}
{% endif %}{% if options %}#SBATCH {{options}}
{% endif %}
echo "JupyterLab of {{username}} on $(hostname), Slurm job $SLURM_JOB_ID"
exec {{srun}} {{cmd}}
"""

#: Slurm's job states, as a learner reads them.
STATE_WORDS = {
    "CANCELLED": "it was cancelled (by your instructor, the cluster's admin or scancel)",
    "TIMEOUT": "it reached its time limit",
    "FAILED": "it failed on its node",
    "NODE_FAIL": "its node failed",
    "OUT_OF_MEMORY": "it ran out of memory",
    "PREEMPTED": "a job of higher priority took its place",
    "BOOT_FAIL": "its node did not start",
    "DEADLINE": "it passed its deadline",
    "COMPLETED": "the server exited",
}


def slurm_prefix() -> str:
    """What runs before each Slurm client (``MULTIGPU_SLURM_PREFIX``, shell words), or nothing."""
    return os.environ.get("MULTIGPU_SLURM_PREFIX", "").strip()


def job_request() -> dict[str, str]:
    """One learner's share as Slurm options: cores (rounded up) and memory in MB."""
    cpus = float(os.environ.get("MULTIGPU_LEARNER_CPUS") or hubconfig.LEARNER_CPUS)
    mem_gb = float(os.environ.get("MULTIGPU_LEARNER_MEM_GB") or hubconfig.LEARNER_MEM_GB)
    return {"nprocs": str(max(1, math.ceil(cpus))), "memory": f"{max(1, int(mem_gb * 1024))}M"}


def words(state: str, reason: str = "") -> str:
    """Slurm's ``state`` (and ``reason`` where it says more) in a learner's words."""
    said = STATE_WORDS.get(state.split()[0] if state else "", f"Slurm reports it {state or 'gone'}")
    return said + (f" (Slurm: {reason})" if reason and reason not in ("None", state) else "")


class SlurmWorkshopSpawner(SlurmSpawner):
    """batchspawner's SlurmSpawner with the workshop's job, clients, addresses and messages (module doc)."""

    #: why the last job ended, in words: kept in the spawner's state (JupyterHub drops a stopped
    #: server's spawner and loads a new one from it), shown on the "not running" page and the next start
    ended: str = ""

    def is_instructor(self) -> bool:
        return self.user.name in hubconfig.instructors()

    def get_env(self) -> dict[str, str]:
        env = super().get_env()
        env.update(hubconfig.server_env(Hub.default(), self.is_instructor()))
        if os.environ.get("SLURM_CONF"):
            env["SLURM_CONF"] = os.environ["SLURM_CONF"]
        return env

    def user_prefix(self) -> str:
        """The clients run as the user (their job, their limits), inside the cluster's prefix."""
        pw = pwd.getpwnam(self.user.name)
        return " ".join([slurm_prefix(), f"setpriv --reuid={pw.pw_uid} --regid={pw.pw_gid} --init-groups"]).strip()

    async def node_address(self, node: str) -> str:
        """The node's ``NodeAddr`` as the controller knows it (its name where scontrol does not say)."""
        try:
            shown = await self.run_command(f"{self.user_prefix()} scontrol show node -o {shlex.quote(node)}")
        except RuntimeError:
            return node
        found = re.search(r"\bNodeAddr=(\S+)", shown)
        return found.group(1) if found else node

    async def job_end(self, job_id: str) -> str:
        """Why job ``job_id`` ended, in words (``scontrol show job``; Slurm forgets it after MinJobAge)."""
        try:
            shown = await self.run_command(f"{self.user_prefix()} scontrol show job -o {shlex.quote(job_id)}")
        except RuntimeError:
            return "Slurm no longer knows the job"
        state = re.search(r"\bJobState=(\S+)", shown)
        reason = re.search(r"\bReason=(\S+)", shown)
        return words(state.group(1) if state else "", reason.group(1) if reason else "")

    async def start(self) -> Any:
        hubconfig.open_on(self, Hub.default(), self.is_instructor())
        self.exec_prefix = self.user_prefix()
        try:
            node, port = await super().start()  # the node's name, as squeue gives it
        except RuntimeError as e:  # batchspawner's own words name no job and no reason
            raise RuntimeError(await self.failed_start(self.last_job, e)) from e
        self.ip = await self.node_address(node)
        self.ended = ""
        return self.ip, port

    #: the job of the last submission (batchspawner clears ``job_id`` before it raises)
    last_job: str = ""

    async def submit_batch_script(self) -> str:
        """The submission waits its turn in the hub's spawn queue; the job then waits in Slurm's
        (a job pending for a node holds no place here)."""
        queue = spawnqueue.queue(len(os.sched_getaffinity(0)))
        await queue.enter(self.user.name)
        try:
            self.last_job = await super().submit_batch_script()
        finally:
            await queue.leave()
        return self.last_job

    async def failed_start(self, job: str, error: Exception) -> str:
        if not job:
            return f"Your server could not be submitted to the cluster ({error}). Tell your instructor."
        return (f"Your server (Slurm job {job}) ended before JupyterLab started: {await self.job_end(job)}. "
                "Press Start to try again; if it fails again, tell your instructor.")

    def get_state(self) -> dict[str, Any]:
        state = super().get_state()
        if self.ended:
            state["ended"] = self.ended
        return state

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)
        self.ended = state.get("ended", "")

    async def poll(self) -> int | None:
        job = self.job_id
        status = await super().poll()
        if status is not None and job:
            self.ended = f"Your server (Slurm job {job}) stopped: {await self.job_end(job)}. Your files are kept."
            self.log.warning("%s: %s", self.user.name, self.ended)
        return status

    async def progress(self) -> Any:
        if self.ended:
            yield {"progress": 1, "message": f"Last time: {self.ended}"}
        async for event in spawnqueue.queue(1).progress(self.user.name):
            yield event
        async for event in super().progress():
            yield event


def configure(c: Any) -> None:
    """The one-box hub's config (``hubconfig.configure``) with servers as Slurm jobs (module doc)."""
    hubconfig.configure(c)
    internal = hubconfig.internal_ports()["MULTIGPU_HUB_INTERNAL_PORT"]
    connect_ip = os.environ.get("MULTIGPU_HUB_CONNECT_IP", "")
    if connect_ip:
        # the nodes' servers call the hub's API at its address on the cluster's network
        c.JupyterHub.hub_bind_url = f"http://0.0.0.0:{internal}"
        c.JupyterHub.hub_connect_url = f"http://{connect_ip}:{internal}"
    c.JupyterHub.spawner_class = SlurmWorkshopSpawner
    # the "server not running" page says why the last job ended (``SlurmWorkshopSpawner.ended``)
    c.JupyterHub.template_paths = [str(course_layout.course_root() / "jupyter" / "hub" / "slurm-templates")]
    c.SlurmWorkshopSpawner.batch_script = BATCH_SCRIPT
    c.SlurmWorkshopSpawner.batchspawner_singleuser_cmd = str(Path(sys.executable).parent / "batchspawner-singleuser")
    request = job_request()
    c.SlurmWorkshopSpawner.req_nprocs = request["nprocs"]
    c.SlurmWorkshopSpawner.req_memory = request["memory"]
    c.SlurmWorkshopSpawner.req_partition = os.environ.get("MULTIGPU_SLURM_PARTITION", "")
    c.SlurmWorkshopSpawner.req_runtime = os.environ.get("MULTIGPU_SLURM_RUNTIME") or RUNTIME
    c.SlurmWorkshopSpawner.poll_interval = hubconfig.env_int("MULTIGPU_SLURM_POLL_S", POLL_S)
    # batchspawner checks the job every half second while it starts; a room of 30 would be 60 squeues a second
    c.SlurmWorkshopSpawner.startup_poll_interval = 2.0
