"""multigpu.running.slurm and slurm_job without a cluster: the batch script, and Slurm's variables
mapped to Horovod's and torch.distributed's (the jobs themselves: tests/test_cluster.py)."""

from __future__ import annotations

import shlex

import pytest

from multigpu.running import slurm, slurm_job

#: What Slurm gives the third task of a 2 x 2 job (block distribution).
TASK = {"SLURMD_NODENAME": "n2", "SLURM_PROCID": "2", "SLURM_LOCALID": "0", "SLURM_NODEID": "1", "SLURM_NTASKS": "4",
        "SLURM_TASKS_PER_NODE": "2(x2)", slurm_job.HOSTS_VAR: "n1:2,n2:2"}


def test_tasks_per_node_is_expanded_as_slurm_writes_it():
    assert slurm_job.tasks_per_node("4(x2),3") == [4, 4, 3]
    assert slurm_job.tasks_per_node("2") == [2]
    with pytest.raises(slurm_job.SlurmJobError, match="not of the form"):
        slurm_job.tasks_per_node("2x2")


def test_a_task_gets_the_ranks_horovodrun_would_give_it():
    env = slurm_job.horovod_env(TASK, "eth0")
    assert env == {"HOROVOD_HOSTNAME": "n2", "HOROVOD_RANK": "2", "HOROVOD_SIZE": "4", "HOROVOD_LOCAL_RANK": "0",
                   "HOROVOD_LOCAL_SIZE": "2", "HOROVOD_CROSS_RANK": "1", "HOROVOD_CROSS_SIZE": "2",
                   "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo", "HOROVOD_GLOO_IFACE": "eth0"}
    # the rendezvous server's plan (horovodrun -H n1:2,n2:2) has the same slot for it
    slot = [s for s in slurm_job.horovod_plan([("n1", 2), ("n2", 2)]) if s.rank == 2][0]
    assert (slot.hostname, slot.local_rank, slot.cross_rank) == ("n2", 0, 1)


def test_a_cyclic_placement_is_refused_with_what_to_do():
    cyclic = {**TASK, "SLURM_PROCID": "1"}  # --distribution=cyclic puts rank 1 on n2
    with pytest.raises(slurm_job.SlurmJobError, match="rank 1 as local task 0 of n2.*--distribution=block"):
        slurm_job.horovod_env(cyclic, "eth0")


def test_a_task_gets_torch_distributed_s_variables():
    assert slurm_job.torch_env(TASK, "ib0") == {"RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
                                                "GROUP_RANK": "1", "GLOO_SOCKET_IFNAME": "ib0"}


@pytest.mark.parametrize("form", slurm.FORMS)
def test_the_batch_script_asks_for_the_shape_and_starts_the_tasks_through_the_rendezvous(form):
    script = slurm.batch_script(["python", "train.py", "--epochs", "5"], nodes=2, tasks_per_node=4, form=form,
                                python="/opt/venv/bin/python", sbatch_options=["--gres=gpu:4"])
    lines = script.splitlines()
    assert lines[0] == "#!/bin/bash"
    assert {"#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=4", "#SBATCH --gres=gpu:4", "#SBATCH --time=00:10:00"} <= set(lines)
    words = shlex.split(script.split("set -eu\n", 1)[1].replace("\\\n", " "))
    srun = words.index("srun")
    assert words[:srun] == ["/opt/venv/bin/python", "-m", "multigpu.running.slurm_job", "launch", "--form", form, "--"]
    assert words[srun:] == ["srun", "--kill-on-bad-exit=1", "--distribution=block", "/opt/venv/bin/python", "-m",
                            "multigpu.running.slurm_job", "task", "--form", form, "--", "python", "train.py", "--epochs", "5"]


def test_wrong_shapes_and_forms_are_refused():
    with pytest.raises(ValueError, match="nodes and tasks_per_node must be >= 1"):
        slurm.batch_script(["python", "train.py"], nodes=0, tasks_per_node=4)
    with pytest.raises(ValueError, match="form must be one of horovod, torch"):
        slurm.batch_script(["python", "train.py"], nodes=2, tasks_per_node=4, form="mpi")


def test_check_results_are_read_by_rank():
    lines = ["noise", slurm_job.CHECK_TAG + '{"rank": 1, "sum": 3.0}', slurm_job.CHECK_TAG + '{"rank": 0, "sum": 3.0}']
    assert [r["rank"] for r in slurm.check_results(lines)] == [0, 1]


def test_each_end_state_is_said_in_words():
    job = slurm.SlurmJob(7, "TIMEOUT")
    assert "time limit" in job.meaning
    assert slurm.SlurmJob(7, "WEIRD").meaning == "Slurm reports WEIRD"
