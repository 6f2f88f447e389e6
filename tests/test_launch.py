"""multigpu.running.launch: every job ends, with the right values or a clear error."""

from __future__ import annotations

import os
import sys
import time

import pytest

from multigpu.running import launch, supervisor


def allreduce_sum(rank, world_size, scale):
    import torch
    import torch.distributed as dist

    t = torch.full((5,), float(rank + 1))
    dist.all_reduce(t)
    return t.tolist(), scale, torch.get_num_threads()


@pytest.mark.slow
def test_run_returns_each_rank_value_in_order():
    values = launch.run(allreduce_sum, 3, args=(7,), timeout=120, echo=False)
    assert [v[0] for v in values] == [[6.0] * 5] * 3
    assert [v[1] for v in values] == [7, 7, 7]


@pytest.mark.slow
def test_run_uses_one_thread_per_worker_when_workers_outnumber_cores():
    from multigpu.core import devices

    n = devices.cpu_cores() + 1
    values = launch.run(allreduce_sum, n, args=(0,), timeout=120, echo=False)
    assert all(v[2] == 1 for v in values)


def mode_of_worker(rank, world_size):
    import os

    import torch.distributed as dist

    from multigpu.core import devices

    return os.environ.get("MULTIGPU_FORCE_CPU"), devices.detect().mode, dist.get_backend()


@pytest.mark.slow
def test_on_a_one_gpu_machine_a_two_worker_job_runs_cpu_workers_and_says_so(monkeypatch, capsys):
    import torch

    from multigpu.core import devices

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the launcher sees 1 GPU
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "Simulated GPU")
    monkeypatch.delenv(devices.FORCE_CPU, raising=False)
    assert devices.detect().mode == "gpu"
    # NCCL (the GPU mode's backend) would not even start here: the workers got Gloo and CPU mode
    assert launch.run(mode_of_worker, 2, timeout=120) == [("1", "cpu", "gloo")] * 2
    assert "2 workers, 1 GPU(s): every worker runs on the CPU" in capsys.readouterr().out
    assert launch.job_env(1, {"A": "b"}, echo=False) == {"A": "b"}  # one worker keeps its GPU


@pytest.mark.slow
def test_a_function_defined_at_run_time_travels_by_value():
    offset = 10
    values = launch.run(lambda rank, world: rank + offset, 2, backend=None, timeout=60, echo=False)
    assert values == [10, 11]


def crash_on_rank_one(rank, world_size):
    import torch
    import torch.distributed as dist

    if rank == 1:
        raise ValueError("rank one is broken")
    dist.all_reduce(torch.ones(1))  # would wait forever for rank 1


@pytest.mark.slow
def test_a_crash_stops_the_job_and_names_the_rank_and_the_cause():
    start = time.monotonic()
    with pytest.raises(launch.WorkerError) as err:
        launch.run(crash_on_rank_one, 3, timeout=120, echo=False)
    assert time.monotonic() - start < 60
    assert "rank 1" in str(err.value) and "rank one is broken" in str(err.value)


def spin(rank, world_size):
    while True:
        pass


@pytest.mark.slow
def test_a_hang_is_killed_at_the_time_limit():
    start = time.monotonic()
    with pytest.raises(launch.WorkerTimeout, match="time limit"):
        launch.run(spin, 2, backend=None, timeout=4, echo=False)
    assert time.monotonic() - start < 20


def hard_exit(rank, world_size):
    import os

    os._exit(3)


@pytest.mark.slow
def test_a_worker_that_dies_without_a_traceback_is_reported():
    with pytest.raises(launch.WorkerError, match="exit code 3"):
        launch.run(hard_exit, 2, backend=None, timeout=60, echo=False)


@pytest.mark.slow
def test_output_is_prefixed_and_capped(capsys, monkeypatch):
    monkeypatch.setattr(supervisor, "MAX_PRINTED_LINES", 5)

    def chatty(rank, world_size):
        for i in range(50):
            print("line", i)
        return rank

    assert launch.run(chatty, 2, backend=None, timeout=60) == [0, 1]
    out = capsys.readouterr().out
    assert out.count("[rank ") == 5 and "not shown" in out


SCRIPT = """
import horovod.torch as hvd, torch
hvd.init()
total = hvd.allreduce(torch.tensor([hvd.rank() + 1.0]), op=hvd.Sum, name="total")
print("RESULT", f"rank={hvd.rank()}", f"size={hvd.size()}", f"total={total.item():.0f}", f"mpi={hvd.mpi_enabled()}")
"""


@pytest.mark.slow
@pytest.mark.parametrize("np,controller", [(2, "--mpi"), (4, "--mpi"), (2, "--gloo")])
def test_horovodrun_job_all_reduces_across_workers(tmp_path, np, controller):
    script = tmp_path / "allreduce.py"
    script.write_text(SCRIPT)  # a plain script: its print() is several writes, yet every line comes out whole
    result = launch.horovodrun([sys.executable, str(script)], np, timeout=180, echo=False, horovod_args=[controller])
    lines = [line for line in result.output if "RESULT" in line]
    expected = np * (np + 1) // 2
    assert len(lines) == np, result.text
    assert all(line.count("RESULT") == 1 and line.endswith(f"size={np} total={expected} mpi={controller == '--mpi'}")
               for line in lines), lines


def hvd_rank_and_mean():
    import horovod.torch as hvd
    import torch

    hvd.init()
    return hvd.rank(), hvd.allreduce(torch.tensor([float(hvd.rank())]), name="mean").item()


@pytest.mark.slow
def test_run_horovod_returns_values_per_rank():
    assert launch.run_horovod(hvd_rank_and_mean, 2, timeout=120, echo=False) == [(0, 0.5), (1, 0.5)]


def hvd_crash():
    import horovod.torch as hvd

    hvd.init()
    if hvd.rank() == 1:
        raise RuntimeError("learner bug on rank 1")
    hvd.allreduce(__import__("torch").ones(1), name="never")


@pytest.mark.slow
def test_run_horovod_reports_a_crashing_rank():
    start = time.monotonic()
    with pytest.raises(launch.WorkerError, match="learner bug on rank 1"):
        launch.run_horovod(hvd_crash, 2, timeout=120, echo=False)
    assert time.monotonic() - start < 100


def test_worker_errors_picks_the_failing_ranks_traceback():
    output = [
        "[1]<stdout>:epoch 1/1",
        "[1]<stderr>:Traceback (most recent call last):",
        '[1]<stderr>:  File "train.py", line 3, in average_metric',
        "[1]<stderr>:NotImplementedError",
        "[0]<stderr>:Terminated",
        "Traceback (most recent call last):",
        "RuntimeError: Horovod detected that one or more processes exited",
    ]
    msg = launch.worker_errors(output)
    assert msg.startswith("Rank 1 failed with: NotImplementedError")
    assert "average_metric" in msg and "Horovod detected" not in msg
    assert "Last output" in launch.worker_errors(["plain line"])


def test_worker_errors_reads_mpichs_rank_labels():
    output = [  # horovodrun over MPICH: one "[R] " label per line, stdout and stderr alike
        "[0] epoch 1/1",
        "[1] Traceback (most recent call last):",
        '[1]   File "train.py", line 3, in average_metric',
        "[1] NotImplementedError",
        "[0] Traceback (most recent call last):",
        "[0] RuntimeError: Horovod has been shut down",
        "===================================================================================",
        "=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES",
    ]
    msg = launch.worker_errors(output)
    assert msg.startswith("Rank 1 failed with: NotImplementedError")
    assert "average_metric" in msg and "shut down" not in msg and "BAD TERMINATION" not in msg


@pytest.mark.slow
def test_killing_a_job_kills_what_it_started_in_sessions_of_its_own(tmp_path):
    """A grading job starts nbgrader with start() (its own session): stopping the job stops it too."""
    import os

    pidfile = tmp_path / "grandchild"
    script = ("import subprocess, sys, time\n"
              "g = subprocess.Popen(['sleep', '60'], start_new_session=True)\n"
              f"open({str(pidfile)!r}, 'w').write(str(g.pid))\n"
              "time.sleep(60)\n")
    job = supervisor.start([sys.executable, "-c", script], env=dict(os.environ))
    deadline = time.monotonic() + 30
    while not (pidfile.exists() and pidfile.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    grandchild = int(pidfile.read_text())
    supervisor.kill_sessions([job])
    time.sleep(0.5)
    import psutil

    assert not psutil.pid_exists(grandchild) or psutil.Process(grandchild).status() == psutil.STATUS_ZOMBIE, \
        "a process the job started in its own session outlived the job"


def test_no_hub_token_or_oauth_setting_reaches_a_jobs_workers(monkeypatch):
    for name in ("JUPYTERHUB_API_TOKEN", "JPY_API_TOKEN", "JUPYTERHUB_OAUTH_CLIENT_ALLOWED_SCOPES"):
        monkeypatch.setenv(name, "hub-secret")
    env = launch.worker_env({"ASKED": "1"})
    assert env["ASKED"] == "1" and not [k for k in env if "hub-secret" in env[k]]


def command_lines_holding(marker):
    import os

    import horovod.torch as hvd

    hvd.init()
    found = []
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    found.append(pid)
        except OSError:
            pass
    return found


@pytest.mark.slow
def test_a_gloo_jobs_command_lines_hold_no_hub_token(monkeypatch):
    """horovodrun --gloo starts its workers with their whole environment on a command line that every
    account may read: the token of the learner's hub server must not be in it."""
    marker = "hub-token-7c4e1a"
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", marker)
    found = launch.run_horovod(command_lines_holding, 2, args=(marker,), horovod_args=["--gloo"],
                               timeout=120, echo=False)
    assert found == [[], []], f"processes with the token on their command line: {found}"


HANG_IN_MPI = """
import time, horovod.torch as hvd, torch
hvd.init()
hvd.allreduce(torch.ones(1000), name="x")
print("READY", flush=True)
time.sleep(600)
"""


@pytest.mark.slow
def test_an_mpi_job_killed_at_its_time_limit_leaves_no_shared_memory_file(tmp_path):
    """MPICH's /dev/shm/mpich_shm_* file (2-4 MB of memory until the machine restarts) outlived every
    MPI job killed at its limit; 45 of them had piled up on the test machine."""
    from multigpu.running import shmfiles

    script = tmp_path / "hang.py"
    script.write_text(HANG_IN_MPI)
    before = shmfiles.present()
    with pytest.raises(launch.WorkerTimeout, match="time limit"):
        launch.horovodrun([sys.executable, str(script)], 2, timeout=30, horovod_args=["--mpi"], echo=False)
    assert shmfiles.present() - before == set()


def test_only_new_unused_shared_memory_files_of_this_account_are_removed(tmp_path):
    from multigpu.running import shmfiles

    (tmp_path / "mpich_shm_old_0").write_bytes(b"x")
    before = shmfiles.present(tmp_path)
    for name in ("mpich_shm_left_0", "mpich_shm_held_0", "other_file"):
        (tmp_path / name).write_bytes(b"x")
    with open(tmp_path / "mpich_shm_held_0") as held:  # a running job's, still open
        assert shmfiles.remove_left(before, tmp_path, wait_s=0.5) == ["mpich_shm_left_0"]
        assert held.read() == "x"
    assert sorted(os.listdir(tmp_path)) == ["mpich_shm_held_0", "mpich_shm_old_0", "other_file"]
