"""The grading service's Slurm backend without a cluster: the queue's Slurm column (and its
migration), the fence that keeps a given-up Slurm job's result out, the batch script, and what a
learner reads for each way a Slurm job ends. tests/test_cluster_grading.py runs it on a real
cluster."""

from __future__ import annotations

import json
import shlex
import sqlite3

import pytest

from multigpu.workshop import gradingpage, jobs, layout, slurmgrading


def test_a_queue_made_before_the_slurm_column_gets_it_and_keeps_its_jobs(tmp_path):
    path = tmp_path / "queue.sqlite"
    with sqlite3.connect(path) as db:  # the schema of a queue made before gradings ran as Slurm jobs
        db.executescript(jobs.SCHEMA)
        db.execute("INSERT INTO jobs (submission, student, assignment, submitted, state, created) "
                   "VALUES ('ana+lab-00+t+x', 'ana', 'lab-00', 't', 'queued', 0)")
    assert "slurm_job" not in {r[1] for r in sqlite3.connect(path).execute("PRAGMA table_info(jobs)")}
    q = jobs.Queue(path)
    [job] = q.jobs()
    assert job.student == "ana" and job.slurm_job is None
    jobs.Queue(path)  # opened again: nothing to add
    taken = q.take()
    q.set_slurm(taken.id, 41, "Slurm job 41: submitted")
    assert q.get(taken.id).slurm_job == 41 and q.in_slurm() == [q.get(taken.id)]


def test_only_the_slurm_job_a_running_job_names_may_finish_it(tmp_path):
    q = jobs.Queue(tmp_path / "q.sqlite")
    q.add("ana+lab-00+t+x", "ana", "lab-00", "t")
    job = q.take()
    q.set_slurm(job.id, 7, "")
    assert q.requeue(job.id, "Slurm job 7 ended NODE_FAIL") == "queued"
    again = q.take()
    assert again.id == job.id and again.attempts == 2
    q.set_slurm(job.id, 8, "")
    assert not q.finish(job.id, "done", "from the node given up", {"x": 1}, slurm_job=7)
    assert q.get(job.id).state == "running"
    assert q.finish(job.id, "done", "graded", {"x": 2}, slurm_job=8)
    assert not q.finish(job.id, "failed", "late", slurm_job=8), "a finished job is finished once"
    assert (q.get(job.id).state, q.get(job.id).result) == ("done", {"x": 2})


def test_a_restart_leaves_slurms_jobs_running_and_an_unsubmitted_start_is_not_counted(tmp_path):
    q = jobs.Queue(tmp_path / "q.sqlite")
    for who in ("ana", "ben"):
        q.add(f"{who}+lab-00+t+x", who, "lab-00", "t")
    in_slurm, cut = q.take(), q.take()
    q.set_slurm(in_slurm.id, 3, "")
    assert [j.id for j in q.recover(keep_slurm=True)] == [cut.id]
    assert q.get(in_slurm.id).state == "running" and q.get(cut.id).state == "queued"
    again = q.take()
    assert q.requeue(again.id, "the scheduler did not take it", count=False) == "queued"
    assert q.get(again.id).attempts == again.attempts - 1


def test_a_job_lost_on_every_start_fails_with_words(tmp_path):
    q = jobs.Queue(tmp_path / "q.sqlite")
    q.add("ana+lab-00+t+x", "ana", "lab-00", "t")
    for _ in range(jobs.MAX_ATTEMPTS - 1):
        assert q.requeue(q.take().id, "node failed") == "queued"
    assert q.requeue(q.take().id, "node failed") == "failed"
    assert f"started {jobs.MAX_ATTEMPTS} times, the most" in q.get(1).message and "kept" in q.get(1).message


def test_settings_come_from_the_environment_and_the_backend_is_off_by_default():
    assert slurmgrading.Settings.from_env(3600, {}) is None
    s = slurmgrading.Settings.from_env(3600, {"MULTIGPU_GRADING_SLURM": "1", "MULTIGPU_GRADING_TIMEOUT": "61",
                                              "MULTIGPU_GRADING_SLURM_OPTIONS": "--account=course --overcommit",
                                              "MULTIGPU_GRADING_SLURM_PREFIX": "nsenter --net=/run/netns/x"})
    assert s is not None and (s.partition, s.tasks, s.minutes) == ("grading", 4, 2)
    assert s.options == ["--account=course", "--overcommit"] and s.client().prefix == ["nsenter", "--net=/run/netns/x"]


def test_the_batch_script_asks_for_an_exclusive_node_and_runs_the_whole_grading(tmp_path):
    hub = layout.Hub(tmp_path)
    q = jobs.Queue(hub.queue_db)
    job = q.add("ana+lab-00+t+x", "ana", "lab-00", "t")
    script = slurmgrading.batch_script(hub, job, slurmgrading.Settings(options=["--overcommit"], timeout_s=90))
    lines = script.splitlines()
    for option in ("--partition=grading", "--nodes=1", "--ntasks=4", "--exclusive", "--time=2", "--no-requeue",
                   "--overcommit", f"--job-name=grading-{hub.tag}-{job.id}"):
        assert f"#SBATCH {option}" in lines, option
    assert f"#SBATCH --output={hub.state}/slurm/grading-{job.id}-%j.out" in lines
    command = shlex.split(lines[-1])
    assert command[0] == "exec" and command[2:5] == ["-m", "multigpu.workshop.slurmgrading", "grade"]
    assert json.loads(command[5])["submission"] == job.submission


@pytest.mark.parametrize("state, words, final", [
    ("TIMEOUT", "ran past its time limit (1 min) and Slurm stopped it (Slurm job 5, TIMEOUT)", "failed"),
    ("CANCELLED", "was cancelled in Slurm (Slurm job 5", "failed"),
    ("FAILED", "crashed (Slurm job 5 ended FAILED: a task exited with a non-zero code)", "failed"),
    ("NODE_FAIL", "Slurm job 5 ended NODE_FAIL: a node it ran on failed; your submission is graded again", "queued"),
    ("", "Slurm job 5 is gone from Slurm without a result; your submission is graded again", "queued"),
])
def test_each_end_of_a_slurm_job_without_a_result_is_told_in_words(tmp_path, state, words, final):
    hub = layout.Hub(tmp_path)
    q = jobs.Queue(hub.queue_db)
    q.add("ana+lab-00+t+x", "ana", "lab-00", "t")
    job = q.take()
    q.set_slurm(job.id, 5, "")
    assert slurmgrading.ended(hub, q, q.get(job.id), state, slurmgrading.Settings(timeout_s=60)) == final
    assert words in q.get(job.id).message
    page = gradingpage.render(hub, q, "ana", False, "/services/grading/")
    assert words[:40] in page.replace("&#x27;", "'")


def test_a_result_written_in_the_job_is_what_the_queue_records(tmp_path):
    hub = layout.Hub(tmp_path)
    q = jobs.Queue(hub.queue_db)
    q.add("ana+lab-00+t+x", "ana", "lab-00", "t")
    job = q.take()
    q.set_slurm(job.id, 9, "")
    slurmgrading.write_result(hub, job.id, 8, {"state": "failed", "message": "an earlier Slurm job's", "result": {}})
    slurmgrading.write_result(hub, job.id, 9, {"state": "done", "message": "notebooks 1/1 points", "result": {"s": 1}})
    assert slurmgrading.ended(hub, q, q.get(job.id), "COMPLETED", slurmgrading.Settings()) == "done"
    assert (q.get(job.id).message, q.get(job.id).result) == ("notebooks 1/1 points", {"s": 1})


def test_the_learners_page_reads_a_waiting_and_a_running_slurm_job():
    assert slurmgrading.describe(12, "PENDING", "Resources", "", [11, 12, 13]) == \
        "Slurm job 12: PENDING (Resources), place 2 of 3 waiting for a grading node"
    assert slurmgrading.describe(11, "RUNNING", "None", "mgn1", [12]) == "Slurm job 11: RUNNING on node mgn1"
