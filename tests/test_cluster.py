"""A real two-node Slurm cluster (tests/slurm_cluster.py: munged, slurmctld and two slurmd, each in
a network namespace of its own) running the course's jobs through multigpu.running.slurm: real
sbatch, srun, scontrol and scancel, no mock. As root after `make cluster-deps`: `make test-cluster`;
elsewhere every test here is skipped with the reason."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

import slurm_cluster
from multigpu.running import slurm
from multigpu.running.supervisor import WorkerTimeout

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


cluster = pytest.fixture(scope="module")(slurm_cluster.running)


@pytest.fixture(scope="module")
def client(cluster):
    return slurm.SlurmClient(prefix=cluster.prefix, env=cluster.env)


def test_two_nodes_are_idle_at_addresses_that_exist_only_in_the_clusters_namespaces(cluster, client):
    assert cluster.node_states() == {"mgn1": "idle", "mgn2": "idle"}
    for name, (ns, addr) in slurm_cluster.NODES.items():
        shown = client.run("scontrol", "show", "node", "-o", name).stdout
        assert f"NodeAddr={addr} " in shown and "CPUTot=2 " in shown, shown
        inside = subprocess.run(["ip", "-n", ns, "-4", "-o", "addr", "show", "eth0"], capture_output=True, text=True).stdout
        assert f"inet {addr}/24" in inside
    root = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
    routes = subprocess.run(["ip", "route"], capture_output=True, text=True).stdout
    assert slurm_cluster.SUBNET not in root + routes, "the test cluster's subnet leaked into the root namespace"


@pytest.mark.parametrize("form", slurm.FORMS)
def test_a_2x2_job_all_reduces_across_both_nodes(cluster, client, form):
    """2 nodes x 2 tasks: every rank adds rank + 1 and gets 1+2+3+4 = 10; ranks 0-1 ran on mgn1 and
    2-3 on mgn2, as Slurm placed them (block), and Horovod's host name is Slurm's node."""
    output = cluster.root / f"check-{form}-%j.out"
    script = slurm.check_script(nodes=2, tasks_per_node=2, form=form, output=str(output))
    job = slurm.run_job(script, client, output=output, timeout=240, cwd=cluster.root)
    print(f"{form}: job {job.job_id} {job.state} in {job.seconds:.1f} s")
    seen = slurm.check_results(job.output)
    assert [r["rank"] for r in seen] == [0, 1, 2, 3], job.text
    assert all(r["size"] == 4 and r["sum"] == 10.0 and r["iface"] == "eth0" for r in seen), seen
    assert [(r["slurm_node"], r["local_rank"]) for r in seen] == [("mgn1", 0), ("mgn1", 1), ("mgn2", 0), ("mgn2", 1)]
    assert all(r["slurm_procid"] == r["rank"] for r in seen)
    if form == "horovod":
        assert [r["horovod_hostname"] for r in seen] == [r["slurm_node"] for r in seen]
    assert "multigpu-check" in slurm_cluster_jobcomp(cluster, job.job_id)


def slurm_cluster_jobcomp(cluster, job_id: int) -> str:
    """The job's line in jobcomp/filetxt's record, as the controller wrote it."""
    lines = (cluster.root / "log" / "jobcomp.txt").read_text().splitlines()
    return next((line for line in lines if line.startswith(f"JobId={job_id} ")), "")


def test_a_job_past_the_callers_limit_is_cancelled_and_leaves_nothing_behind(cluster, client):
    """wait() scancels a job past its limit and says so; afterwards no process of it remains on
    either node (its batch step, srun, the tasks' sleep)."""
    output = cluster.root / "sleep-%j.out"
    script = slurm.batch_script(["sleep", "300"], nodes=2, tasks_per_node=1, form="torch", output=str(output),
                                job_name="multigpu-sleep")
    job_id = slurm.submit(script, client, cwd=cluster.root)
    deadline = time.monotonic() + 60
    while slurm.job_state(job_id, client)[0] != "RUNNING" or not sleeping(cluster):
        assert time.monotonic() < deadline, "the sleep job did not start its tasks within 60 s"
        time.sleep(0.3)
    with pytest.raises(WorkerTimeout, match=rf"Slurm job {job_id} did not end within 1 s \(last seen RUNNING.*cancelled with scancel"):
        slurm.wait(job_id, client, timeout=1)
    ended = slurm.wait(job_id, client, timeout=60)
    assert ended.state == "CANCELLED" and "cancelled" in ended.meaning
    deadline = time.monotonic() + 30
    while sleeping(cluster) and time.monotonic() < deadline:
        time.sleep(0.3)
    assert not sleeping(cluster), "a task of the cancelled job is still running"
    assert not leftovers(cluster, job_id)


def sleeping(cluster) -> list[int]:
    """The ``sleep`` processes running on the cluster's nodes."""
    pids = [pid for ns, _ in slurm_cluster.NODES.values() for pid in slurm_cluster.namespace_pids(ns)]
    return [pid for pid in pids if slurm_cluster.command_of(pid).startswith("sleep")]


def leftovers(cluster, job_id: int) -> list[str]:
    """Processes of the job still on the nodes: its steps' slurmstepd, srun, the launch step."""
    pids = [pid for ns, _ in slurm_cluster.NODES.values() for pid in slurm_cluster.namespace_pids(ns)]
    return [c for c in map(slurm_cluster.command_of, pids) if f"[{job_id}." in c or "srun" in c or "slurm_job" in c]


def test_a_failing_task_ends_the_job_failed_with_its_output(cluster, client):
    """A task that exits non-zero ends the whole job (srun --kill-on-bad-exit) and run_job says so
    in words, with the task's own message."""
    output = cluster.root / "fail-%j.out"
    program = [sys.executable, "-c", "import os, sys; r = int(os.environ['RANK']); print('rank', r, 'fails') if r == 1 "
               "else None; sys.exit(3 if r == 1 else 0)"]
    script = slurm.batch_script(program, nodes=2, tasks_per_node=1, form="torch", output=str(output))
    with pytest.raises(slurm.WorkerError, match=r"ended FAILED: a task exited with a non-zero code[\s\S]*rank 1 fails"):
        slurm.run_job(script, client, output=output, timeout=120, cwd=cluster.root)
