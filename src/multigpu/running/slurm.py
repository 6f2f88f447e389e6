"""The course's jobs on a Slurm cluster: the batch script, its submission, the wait and the output.

A Slurm job of N nodes x K tasks per node runs one course program per task (one worker per GPU),
with Horovod over Gloo (``form="horovod"``) or torch.distributed over Gloo (``form="torch"``) wired
from Slurm's variables by :mod:`multigpu.running.slurm_job` (no ``horovodrun``, no SSH):

- :func:`batch_script` writes the ``sbatch`` script (``#SBATCH --nodes=N --ntasks-per-node=K``,
  then the batch step that serves the rendezvous and runs :func:`srun_line`);
- :func:`submit` hands it to ``sbatch --parsable``, :func:`wait` follows the job with ``scontrol``
  (``sacct`` once the controller has forgotten it) until it ends, ``scancel``\\ s it past a time
  limit, and :func:`run_job` does all three and reads the output file, like
  :func:`multigpu.running.launch.run_command` does for a local command: a job that did not end
  COMPLETED raises :class:`~multigpu.running.supervisor.WorkerError` with Slurm's reason in words
  and the output's tail; one past the caller's limit :class:`~multigpu.running.supervisor.WorkerTimeout`.

Every client runs through a :class:`SlurmClient`: plainly on a real cluster, behind a command
prefix and with an environment of its own where the cluster lives elsewhere (the tests' cluster
in network namespaces: ``SlurmClient(prefix=["nsenter", "--net=/run/netns/mgt-ctl"], env=...)``).
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from multigpu.running.environment import worker_env
from multigpu.running.slurm_job import CHECK_TAG, FORMS
from multigpu.running.supervisor import WorkerError, WorkerTimeout

JOB_MODULE = "multigpu.running.slurm_job"
#: The states a job ends in, each with what it means for the reader.
END_STATES = {
    "COMPLETED": "every task exited with code 0",
    "FAILED": "a task exited with a non-zero code",
    "CANCELLED": "it was cancelled (scancel, or by an administrator)",
    "TIMEOUT": "it ran past its time limit (#SBATCH --time) and Slurm cancelled it",
    "NODE_FAIL": "a node it ran on failed",
    "OUT_OF_MEMORY": "a task ran out of memory",
    "PREEMPTED": "a job of higher priority took its nodes",
    "BOOT_FAIL": "its nodes did not boot",
    "DEADLINE": "it could not end before its deadline",
}
#: Lines of output kept in an error message.
TAIL_LINES = 30


@dataclass
class SlurmClient:
    """How Slurm's clients are run: ``prefix`` before each (empty on a real cluster) and the
    environment they get (``None``: this process's)."""

    prefix: Sequence[str] = ()
    env: Mapping[str, str] | None = None

    def run(self, *argv: str, timeout: float = 60.0, input: str | None = None,
            env: Mapping[str, str] | None = None, check: bool = True) -> subprocess.CompletedProcess:
        """Run one client (``run("squeue", "-j", "12")``); with ``check`` a failure raises
        :class:`WorkerError` with the client's own message."""
        chosen = env if env is not None else self.env
        try:
            done = subprocess.run([*self.prefix, *argv], input=input, capture_output=True, text=True, timeout=timeout,
                                  env=dict(chosen) if chosen is not None else None)
        except FileNotFoundError:
            raise WorkerError(f"{argv[0]} not found: install Slurm's clients (make cluster-deps, as root on Debian)") from None
        except subprocess.TimeoutExpired:
            raise WorkerError(f"{argv[0]} did not answer within {timeout:.0f} s: is slurmctld running?") from None
        if check and done.returncode != 0:
            raise WorkerError(f"{' '.join(argv[:2])} failed (exit code {done.returncode}): {done.stderr.strip()}")
        return done


def srun_line(argv: Sequence[str], *, form: str = "horovod", python: str | None = None,
              iface: str | None = None) -> list[str]:
    """The ``srun`` line of the batch step: one task per slot of the allocation (the ``#SBATCH``
    lines say how many), each mapping Slurm's variables to ``form``'s before running ``argv``. A
    task that fails ends the job (``--kill-on-bad-exit``: its peers would wait in a collective)."""
    if form not in FORMS:
        raise ValueError(f"form must be one of {', '.join(FORMS)}, not {form!r}")
    python = python or sys.executable
    return ["srun", "--kill-on-bad-exit=1", "--distribution=block", python, "-m", JOB_MODULE, "task", "--form", form,
            *(["--iface", iface] if iface else []), "--", *argv]


def batch_script(argv: Sequence[str], *, nodes: int, tasks_per_node: int, form: str = "horovod",
                 time_limit: str = "00:10:00", job_name: str = "multigpu", output: str = "slurm-%j.out",
                 python: str | None = None, iface: str | None = None, port: int | None = None,
                 sbatch_options: Sequence[str] = ()) -> str:
    """The ``sbatch`` script that runs ``argv`` (e.g. ``["python", "train.py"]``) in ``nodes`` x
    ``tasks_per_node`` tasks, one per GPU, with ``form``'s rendezvous. ``time_limit``: Slurm's
    ``--time``; ``output``: where the tasks' output goes (``%j``: the job id); ``iface``: the
    interface the nodes share (default: the one that routes to the first node); ``port``: the
    torch form's MASTER_PORT; ``sbatch_options``: more ``#SBATCH`` lines (``--partition=gpu``,
    ``--gres=gpu:4``)."""
    if nodes < 1 or tasks_per_node < 1:
        raise ValueError(f"nodes and tasks_per_node must be >= 1, got {nodes} and {tasks_per_node}")
    python = python or sys.executable
    options = [f"--job-name={job_name}", f"--nodes={nodes}", f"--ntasks-per-node={tasks_per_node}",
               f"--time={time_limit}", f"--output={output}", *sbatch_options]
    launch = [python, "-m", JOB_MODULE, "launch", "--form", form, *(["--port", str(port)] if port else []), "--"]
    rendezvous = ("serves Horovod's Gloo rendezvous (what horovodrun would)" if form == "horovod"
                  else "exports MASTER_ADDR/MASTER_PORT (rank 0's TCP store on this node)")
    return "\n".join([
        "#!/bin/bash",
        *(f"#SBATCH {o}" for o in options),
        f"# {nodes} node(s) x {tasks_per_node} task(s), one per GPU, {form} over Gloo, no SSH between nodes:",
        f"# this batch step, on the first node, {rendezvous};",
        "# each task srun starts maps SLURM_PROCID, SLURM_LOCALID, SLURM_NODEID to the ranks before the program runs",
        "set -eu",
        shlex.join(launch) + " \\",
        "    " + shlex.join(srun_line(argv, form=form, python=python, iface=iface)),
        "",
    ])


def submit(script: str, client: SlurmClient | None = None, *, cwd: str | Path | None = None,
           env: Mapping[str, str] | None = None) -> int:
    """Submit ``script`` (on ``sbatch``'s stdin) and return the job id. The job's environment is
    :func:`~multigpu.running.environment.worker_env` of the client's, this package importable in it,
    ``env`` on top; ``cwd``: the job's working folder (default: this one)."""
    client = client or SlurmClient()
    job_env = worker_env({**(client.env or {}), **(env or {})})
    done = client.run("sbatch", "--parsable", *([f"--chdir={cwd}"] if cwd else []), input=script, env=job_env)
    first = done.stdout.strip().split(";")[0]
    if not first.isdigit():
        raise WorkerError(f"sbatch answered {done.stdout.strip()!r}, not a job id")
    return int(first)


@dataclass
class SlurmJob:
    """A job that ended: its id, Slurm's end state and reason, exit code, wall time and output."""

    job_id: int
    state: str
    reason: str = ""
    exit_code: str = ""
    seconds: float = 0.0
    output: list[str] = field(default_factory=list)

    @property
    def meaning(self) -> str:
        """The end state in words."""
        return END_STATES.get(self.state, f"Slurm reports {self.state}")

    @property
    def text(self) -> str:
        return "\n".join(self.output)


def job_state(job_id: int, client: SlurmClient) -> tuple[str, str, str]:
    """``(state, reason, exit code)`` of a job, from ``scontrol`` or, once the controller has
    forgotten it (MinJobAge), from ``sacct``. ``("", "", "")`` while neither knows it."""
    done = client.run("scontrol", "show", "job", "-o", str(job_id), check=False)
    if done.returncode == 0:
        fields = dict(re.findall(r"(\w+)=(\S*)", done.stdout))
        return fields.get("JobState", ""), fields.get("Reason", ""), fields.get("ExitCode", "")
    acct = client.run("sacct", "-j", str(job_id), "-X", "-n", "-P", "-o", "State,ExitCode", check=False)
    if acct.returncode == 0 and acct.stdout.strip():
        state, _, code = acct.stdout.strip().splitlines()[0].partition("|")
        return state.split()[0], "", code
    return "", "", ""


def wait(job_id: int, client: SlurmClient | None = None, *, timeout: float = 600.0, poll_s: float = 0.5) -> SlurmJob:
    """Follow the job until it ends; past ``timeout`` seconds ``scancel`` it and raise
    :class:`WorkerTimeout` saying what it was doing."""
    client = client or SlurmClient()
    began = time.monotonic()
    state = reason = code = ""
    while time.monotonic() - began < timeout:
        state, reason, code = job_state(job_id, client)
        if state in END_STATES or (state and state not in {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING",
                                                           "SUSPENDED", "REQUEUED", "RESIZING"}):
            return SlurmJob(job_id, state, reason, code, time.monotonic() - began)
        time.sleep(poll_s)
    client.run("scancel", str(job_id), check=False)
    raise WorkerTimeout(f"Slurm job {job_id} did not end within {timeout:.0f} s (last seen {state or 'unknown'}"
                        f"{', reason ' + reason if reason and reason != 'None' else ''}): cancelled with scancel")


def read_output(path: str | Path, job_id: int) -> list[str]:
    """The lines of the job's output file (``%j`` in ``path`` is its id); none when it has none."""
    try:
        return Path(str(path).replace("%j", str(job_id))).read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return []


def run_job(script: str, client: SlurmClient | None = None, *, output: str | Path, timeout: float = 600.0,
            cwd: str | Path | None = None, env: Mapping[str, str] | None = None, check: bool = True) -> SlurmJob:
    """Submit ``script``, wait for its end and read ``output`` (the path its ``--output`` names).
    With ``check`` a job that did not end COMPLETED raises :class:`WorkerError`: its state in
    words, its exit code and the last lines of its output."""
    client = client or SlurmClient()
    began = time.monotonic()
    job_id = submit(script, client, cwd=cwd, env=env)
    job = wait(job_id, client, timeout=timeout)
    job.seconds = time.monotonic() - began
    job.output = read_output(output, job_id)
    if check and job.state != "COMPLETED":
        raise WorkerError(f"Slurm job {job_id} ended {job.state}: {job.meaning} (exit code {job.exit_code}). "
                          "Last output:\n" + "\n".join(job.output[-TAIL_LINES:]))
    return job


def check_script(*, nodes: int, tasks_per_node: int, form: str = "horovod", output: str = "slurm-%j.out",
                 python: str | None = None, time_limit: str = "00:05:00") -> str:
    """A batch script whose every task all-reduces rank + 1 and prints where it ran
    (``python -m multigpu.running.slurm_job check``): the first job to run on a new cluster."""
    python = python or sys.executable
    return batch_script([python, "-m", JOB_MODULE, "check", "--form", form], nodes=nodes, tasks_per_node=tasks_per_node,
                        form=form, output=output, python=python, time_limit=time_limit, job_name=f"multigpu-check-{form}")


def check_results(lines: Sequence[str]) -> list[dict]:
    """What each rank of a :func:`check_script` job reported, by rank."""
    found = [json.loads(line.split(CHECK_TAG, 1)[1]) for line in lines if CHECK_TAG in line]
    return sorted(found, key=lambda seen: seen["rank"])
