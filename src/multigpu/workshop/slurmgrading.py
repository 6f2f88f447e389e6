"""The grading service's Slurm backend: each grading a Slurm job, several at once, one per node.

Off by default: the service grades one job at a time itself (:func:`service.grade_one`). With
``MULTIGPU_GRADING_SLURM=1`` it hands each job of its queue to Slurm instead (:class:`Settings`
lists the other variables): learners still take turns in the service's queue (:mod:`jobs`), and
:func:`step`, every few seconds,

1. follows the jobs Slurm has (``squeue``): a waiting one's learner reads its Slurm job id, its
   state and its place among the partition's waiting jobs, a running one's the node grading it;
   a job that ended brings back its result from the file its grading wrote in the hub's state
   folder (:func:`result_path`, named by queue job and Slurm job: the nodes share the hub's
   folders), which the service alone records in its queue. A job whose node failed
   (``NODE_FAIL``, or gone from Slurm without a result) goes back to the head of the queue and is
   graded again in a new Slurm job; the first one's result, if its node still writes one, names
   another Slurm job and is never read, so a submission is counted once. A job past its time
   limit (``TIMEOUT``) or cancelled fails with why, in words;
2. submits queued jobs while fewer than ``MULTIGPU_GRADING_SLURM_JOBS`` are in Slurm: a batch
   script (:func:`batch_script`: ``--exclusive`` node, ``--ntasks`` one per worker of the
   assessment, ``--time`` from ``MULTIGPU_GRADING_TIMEOUT``, ``--no-requeue``: the service, not
   Slurm, decides what runs again) whose one step is ``python -m multigpu.workshop.slurmgrading
   grade``: the whole grading of :mod:`grading` (collect, autograde, official run with its
   baselines, certificate) on the node Slurm chose, so the throughput ideal is measured there.

The controller out of reach (restarting) changes nothing: the jobs Slurm has are followed again
once it answers; a job it did not take goes back to the queue uncounted.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from multigpu.running import slurm
from multigpu.workshop import jobs, submissions
from multigpu.workshop.layout import Hub

ENABLE_VAR = "MULTIGPU_GRADING_SLURM"
#: The states of a job Slurm still has (waiting, starting, running, ending).
ACTIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING", "STOPPED"}
#: Ends after which the grading runs again: the node, not the submission, failed.
NODE_LOST = {"NODE_FAIL", "BOOT_FAIL", "PREEMPTED"}
POLL_S = 2.0
#: Lines of a grading's output shown to a learner when it crashed.
TAIL_LINES = 10


@dataclass
class Settings:
    """Where and how gradings run on the cluster, from the environment:

    - ``MULTIGPU_GRADING_SLURM=1``: the Slurm backend (else the service grades by itself);
    - ``MULTIGPU_GRADING_SLURM_PARTITION`` (``grading``): the partition of the grading nodes;
    - ``MULTIGPU_GRADING_SLURM_TASKS`` (4): tasks of the allocation, one per worker of the
      assessment's official run (the node is exclusive in any case);
    - ``MULTIGPU_GRADING_SLURM_OPTIONS``: more ``#SBATCH`` options (``--account=course
      --qos=grading``; ``--overcommit`` where the nodes have fewer cores than tasks);
    - ``MULTIGPU_GRADING_SLURM_JOBS`` (64): gradings handed to Slurm at most, waiting or running;
    - ``MULTIGPU_GRADING_SLURM_PREFIX``: what runs Slurm's clients (empty on a cluster's login
      node; the test cluster's ``nsenter --net=/run/netns/mgt-ctl``);
    - ``MULTIGPU_GRADING_TIMEOUT`` (s): the time limit, rounded up to Slurm's minutes.
    """

    partition: str = "grading"
    tasks: int = 4
    options: list[str] = field(default_factory=list)
    max_jobs: int = 64
    prefix: list[str] = field(default_factory=list)
    timeout_s: float = 3600.0

    @classmethod
    def from_env(cls, default_timeout_s: float, environ: dict[str, str] | None = None) -> Settings | None:
        """The settings (class doc), or None where the backend is off."""
        env = dict(os.environ if environ is None else environ)
        if env.get(ENABLE_VAR, "") not in ("1", "yes", "true"):
            return None
        return cls(partition=env.get("MULTIGPU_GRADING_SLURM_PARTITION") or "grading",
                   tasks=int(env.get("MULTIGPU_GRADING_SLURM_TASKS") or 4),
                   options=shlex.split(env.get("MULTIGPU_GRADING_SLURM_OPTIONS", "")),
                   max_jobs=int(env.get("MULTIGPU_GRADING_SLURM_JOBS") or 64),
                   prefix=shlex.split(env.get("MULTIGPU_GRADING_SLURM_PREFIX", "")),
                   timeout_s=float(env.get("MULTIGPU_GRADING_TIMEOUT") or default_timeout_s))

    @property
    def minutes(self) -> int:
        """Slurm's time limit: whole minutes, at least one."""
        return max(1, math.ceil(self.timeout_s / 60))

    def client(self) -> slurm.SlurmClient:
        return slurm.SlurmClient(prefix=self.prefix)


def folder(hub: Hub) -> Path:
    """Where the Slurm jobs' outputs and results go: in the hub's state folder (root's, 700)."""
    path = hub.state / "slurm"
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def result_path(hub: Hub, job_id: int, slurm_job: int) -> Path:
    return folder(hub) / f"result-{job_id}-{slurm_job}.json"


def output_path(hub: Hub, job_id: int) -> Path:
    """The Slurm job's output file (``%j``: its id)."""
    return folder(hub) / f"grading-{job_id}-%j.out"


def job_name(hub: Hub, job_id: int) -> str:
    return f"grading-{hub.tag}-{job_id}"


def batch_script(hub: Hub, job: jobs.Job, settings: Settings) -> str:
    """The ``sbatch`` script of one grading (module doc)."""
    options = [f"--job-name={job_name(hub, job.id)}", f"--partition={settings.partition}", "--nodes=1",
               f"--ntasks={settings.tasks}", "--exclusive", f"--time={settings.minutes}", "--no-requeue",
               f"--output={output_path(hub, job.id)}", *settings.options]
    record = json.dumps({k: v for k, v in vars(job).items() if k != "result"})
    return "\n".join([
        "#!/bin/bash",
        *(f"#SBATCH {o}" for o in options),
        f"# grading job {job.id} of the hub {hub.root} ({job.student}, {job.assignment}): the whole grading on this",
        "# node; its result goes to the hub's state folder, which the grading service reads when the job ends",
        "exec " + shlex.join([sys.executable, "-m", "multigpu.workshop.slurmgrading", "grade", record]),
        "",
    ])


def submit(hub: Hub, job: jobs.Job, settings: Settings) -> int:
    """Hand ``job`` to Slurm; its Slurm job id."""
    return slurm.submit(batch_script(hub, job, settings), settings.client(), cwd=folder(hub),
                        env={"MULTIGPU_HUB_ROOT": str(hub.root)})


def slurm_view(client: slurm.SlurmClient, partition: str) -> tuple[dict[int, tuple[str, str, str]], list[int]] | None:
    """``({job: (state, reason, node list)}, the partition's waiting jobs in Slurm's order)`` for
    every job the controller has (recently ended ones included); None when it does not answer."""
    done = client.run("squeue", "-h", "-t", "all", "-o", "%i|%T|%r|%N|%P|%Q", check=False, timeout=30)
    if done.returncode != 0:
        return None
    seen: dict[int, tuple[str, str, str]] = {}
    waiting: list[tuple[int, int]] = []
    for line in done.stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 6 or not parts[0].isdigit():
            continue
        seen[int(parts[0])] = (parts[1], parts[2], parts[3])
        if parts[1] == "PENDING" and parts[4] == partition:
            waiting.append((-int(parts[5] or 0), int(parts[0])))
    return seen, [j for _, j in sorted(waiting)]


def read_result(hub: Hub, job_id: int, slurm_job: int) -> dict[str, Any] | None:
    try:
        return json.loads(result_path(hub, job_id, slurm_job).read_text())
    except (FileNotFoundError, ValueError):
        return None


def output_tail(hub: Hub, job_id: int, slurm_job: int) -> str:
    return "\n".join(slurm.read_output(output_path(hub, job_id), slurm_job)[-TAIL_LINES:])


def ended(hub: Hub, queue: jobs.Queue, job: jobs.Job, state: str, settings: Settings) -> str:
    """Record the end of ``job``'s Slurm job (``state``: Slurm's, or "" when Slurm forgot it);
    returns the queue job's new state."""
    assert job.slurm_job is not None
    found = read_result(hub, job.id, job.slurm_job)
    where = f"Slurm job {job.slurm_job}"
    if found is not None:
        queue.finish(job.id, found["state"], found["message"], found["result"], slurm_job=job.slurm_job)
    elif state in NODE_LOST or not state:
        what = f"ended {state}: {slurm.END_STATES[state]}" if state else "is gone from Slurm without a result"
        return queue.requeue(job.id, f"{where} {what}; your submission is graded again from the start")
    elif state == "TIMEOUT":
        queue.finish(job.id, "failed", f"the grading ran past its time limit ({settings.minutes} min) and Slurm stopped "
                     f"it ({where}, TIMEOUT); your submission is kept: a cell that waits or loops without end is the "
                     "usual cause; submit again to retry, or ask the instructor", slurm_job=job.slurm_job)
    elif state == "CANCELLED":
        queue.finish(job.id, "failed", f"the grading was cancelled in Slurm ({where}: scancel, or by an administrator); "
                     "your submission is kept: submit again, or ask the instructor", slurm_job=job.slurm_job)
    else:
        queue.finish(job.id, "failed", f"the grading crashed ({where} ended {state}: {slurm.END_STATES.get(state, '')}); "
                     f"your submission is kept and the instructor has been told:\n{output_tail(hub, job.id, job.slurm_job)}",
                     slurm_job=job.slurm_job)
    after = queue.get(job.id)
    if after is not None and after.state in ("done", "failed"):
        submissions.forget(hub, job.submission)
        return after.state
    return after.state if after else ""


def follow(hub: Hub, queue: jobs.Queue, settings: Settings) -> int | None:
    """Part 1 of :func:`step`; how many of the queue's jobs Slurm has now (None: no answer)."""
    view = slurm_view(settings.client(), settings.partition)
    if view is None:
        return None
    seen, waiting = view
    held = 0
    for job in queue.in_slurm():
        assert job.slurm_job is not None
        state, reason, nodes = seen.get(job.slurm_job, ("", "", ""))
        if state in ACTIVE:
            held += 1
            queue.note(job.id, describe(job.slurm_job, state, reason, nodes, waiting))
            continue
        new = ended(hub, queue, job, state, settings)
        print(f"grading job {job.id}: Slurm job {job.slurm_job} ended {state or '(forgotten)'}: {new}", flush=True)
    return held


def describe(slurm_job: int, state: str, reason: str, nodes: str, waiting: list[int]) -> str:
    """A job Slurm has, in words for its learner's page."""
    if state == "PENDING":
        place = f", place {waiting.index(slurm_job) + 1} of {len(waiting)} waiting" if slurm_job in waiting else ""
        why = f" ({reason})" if reason and reason != "None" else ""
        return f"Slurm job {slurm_job}: PENDING{why}{place} for a grading node"
    return f"Slurm job {slurm_job}: {state}" + (f" on node {nodes}" if nodes and nodes != "(null)" else "")


def step(hub: Hub, queue: jobs.Queue, settings: Settings) -> None:
    """One round (module doc): follow the jobs Slurm has, then hand it queued ones."""
    held = follow(hub, queue, settings)
    if held is None:
        return
    while held < settings.max_jobs:
        job = queue.take()
        if job is None:
            return
        try:
            slurm_job = submit(hub, job, settings)
        except slurm.WorkerError as e:
            queue.requeue(job.id, f"waiting: the cluster's scheduler did not take the grading ({e})", count=False)
            print(f"grading job {job.id}: sbatch failed, queued again: {e}", flush=True)
            return
        queue.set_slurm(job.id, slurm_job, f"Slurm job {slurm_job}: submitted to partition {settings.partition}")
        print(f"grading job {job.id}: {job.student} {job.assignment} is Slurm job {slurm_job}", flush=True)
        held += 1


async def worker(hub: Hub, queue: jobs.Queue, settings: Settings) -> None:
    """The service's worker with this backend: :func:`step` every :data:`POLL_S` seconds."""
    loop = asyncio.get_running_loop()
    print(f"grading as Slurm jobs in partition {settings.partition} ({settings.tasks} tasks, exclusive, "
          f"{settings.minutes} min)", flush=True)
    while True:
        try:
            await loop.run_in_executor(None, step, hub, queue, settings)
        except Exception as e:
            print(f"grading service error (Slurm backend): {e!r}", file=sys.stderr, flush=True)
        await asyncio.sleep(POLL_S)


def write_result(hub: Hub, job_id: int, slurm_job: int, outcome: dict[str, Any]) -> None:
    """The grading's outcome where the service reads it, whole or not at all (a rename)."""
    path = result_path(hub, job_id, slurm_job)
    part = path.with_suffix(".part")
    part.write_text(json.dumps(outcome))
    os.replace(part, path)


def grade(record: str) -> int:
    """In the Slurm job: grade the queue job ``record`` (its fields, as JSON) and write the outcome."""
    import warnings

    from sqlalchemy.exc import SAWarning

    from multigpu.workshop import grading

    # what `multigpu workshop grade-job` silences too: SQLAlchemy 2's warning at nbgrader's add_submission
    warnings.filterwarnings("ignore", message=r"Object of type <Submitted\w+> not in session, add operation along",
                            category=SAWarning)
    fields = json.loads(record)
    job = jobs.Job(**{**fields, "result": None})
    hub = Hub.default()
    slurm_job = int(os.environ["SLURM_JOB_ID"])
    node = os.environ.get("SLURMD_NODENAME", "")
    print(f"grading job {job.id} ({job.student} {job.assignment}) in Slurm job {slurm_job} on {node}", flush=True)
    state, message, result = grading.run(hub, job, lambda msg: print(msg, flush=True))
    result["slurm"] = {"job": slurm_job, "node": node}
    write_result(hub, job.id, slurm_job, {"state": state, "message": message, "result": result})
    print(f"job {job.id}: {state}: {message.splitlines()[0] if message else ''}", flush=True)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "grade":
        sys.exit("usage: python -m multigpu.workshop.slurmgrading grade JOB-JSON (the Slurm backend's batch script runs it)")
    sys.exit(grade(sys.argv[2]))
