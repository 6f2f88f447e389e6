"""multigpu.running.warm: a job's workers are forks of one warm parent, each job gets fresh
processes, and every failure ends the way it ends with fresh interpreters."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from multigpu.running import launch, warm

pytestmark = pytest.mark.slow


def parent_pid() -> int:
    warm.python()  # starts it where it is not running
    assert warm.PARENT.proc is not None, f"no warm parent here: {warm.PARENT.unavailable}"
    return warm.PARENT.proc.pid


def workers_left() -> list[int]:
    """The warm parent's children still alive a moment after a job (none once a job has ended)."""
    deadline = time.monotonic() + 5
    while True:
        left = [p.pid for p in psutil.Process(parent_pid()).children() if p.status() != psutil.STATUS_ZOMBIE]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def warm_python(code: str, *, env: dict | None = None, cwd=None, timeout: float = 60) -> subprocess.CompletedProcess:
    """``python -c code`` started warm, its stdout and stderr apart."""
    return subprocess.run([*warm.python(), "-c", textwrap.dedent(code)], env=launch.worker_env(env), cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


def whoami(rank, world_size):
    import torch.distributed as dist

    return os.getppid(), dist.get_rank(), dist.get_world_size()


def whoami_hvd():
    import horovod.torch as hvd

    hvd.init()
    return os.getppid(), hvd.rank(), hvd.size()


def test_a_jobs_workers_are_forks_of_the_warm_parent():
    parent = parent_pid()
    assert launch.run(whoami, 2, timeout=60, echo=False) == [(parent, 0, 2), (parent, 1, 2)]
    # under a real horovodrun, over MPI (the course's default) and over Gloo
    assert launch.run_horovod(whoami_hvd, 2, timeout=120, echo=False) == [(parent, 0, 2), (parent, 1, 2)]
    assert launch.run_horovod(whoami_hvd, 2, timeout=120, echo=False, horovod_args=["--gloo"]) == \
        [(parent, 0, 2), (parent, 1, 2)]
    assert workers_left() == []


def test_warm_off_takes_effect_while_a_warm_parent_runs(monkeypatch):
    """MULTIGPU_WARM=0 set after a warm job: the next job's workers are fresh Pythons (children of
    the job, not of the warm parent); set back, the same parent serves again (what `make bench
    --only warm` compares)."""
    parent = parent_pid()
    monkeypatch.setenv(warm.ENV, "0")
    assert all(ppid != parent for ppid, _, _ in launch.run(whoami, 2, timeout=120, echo=False))
    monkeypatch.setenv(warm.ENV, "1")
    assert launch.run(whoami, 2, timeout=60, echo=False) == [(parent, 0, 2), (parent, 1, 2)]


def change_everything(rank, world_size, path):
    import json
    import threading

    import torch

    torch.set_num_threads(7)
    os.environ["MULTIGPU_LEAKED"] = "1"
    json.LEAKED = True
    threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()
    fd = os.open(path, os.O_RDONLY)
    os.set_inheritable(fd, True)
    return fd


def what_is_left(rank, world_size, fd):
    import json
    import threading

    import torch

    try:
        still_open = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        still_open = None
    return (torch.get_num_threads(), os.environ.get("MULTIGPU_LEAKED"), hasattr(json, "LEAKED"),
            threading.active_count(), still_open)


def test_nothing_a_job_changes_reaches_the_next_job(tmp_path):
    marker = tmp_path / "opened-by-the-first-job"
    marker.write_text("x")
    fds = launch.run(change_everything, 2, args=(str(marker),), backend=None, threads=1, timeout=60, echo=False)
    after = launch.run(what_is_left, 2, args=(fds[0],), backend=None, threads=1, timeout=60, echo=False)
    for threads, env, module, alive, fd in after:
        assert threads == 1, "torch's thread count carried over"
        assert env is None, "an environment variable carried over"
        assert not module, "a module global carried over"
        assert alive == 1, "a thread carried over"
        assert fd is None or fd != str(marker), "a file descriptor carried over"


def test_a_warm_python_runs_as_a_fresh_python_would(tmp_path):
    (tmp_path / "extra").mkdir()
    (tmp_path / "extra" / "helper_module.py").write_text("VALUE = 42\n")
    ran = warm_python("""
        import os, sys, helper_module
        print(sys.argv, os.getcwd(), helper_module.VALUE, os.environ["ASKED"], os.getppid() != os.getpid())
        print("to stderr", file=sys.stderr)
        sys.exit(3)
    """, env={"PYTHONPATH": str(tmp_path / "extra"), "ASKED": "yes"}, cwd=tmp_path)
    assert ran.returncode == 3, ran.stderr
    assert ran.stdout.split("\n")[0] == f"['-c'] {tmp_path} 42 yes True"
    assert ran.stderr.strip().endswith("to stderr")
    # the site-packages' .pth lines run with the job's environment (Horovod's: whole lines under mpirun)
    assert warm_python("import sys; print(sys.stdout.line_buffering)", env={"PMI_RANK": "0"}).stdout.strip() == "True"
    assert warm_python("import sys; print(sys.stdout.line_buffering)").stdout.strip() == "False"
    crashed = warm_python("raise ValueError('the learner wrote this')")
    assert crashed.returncode == 1 and crashed.stderr.strip().endswith("ValueError: the learner wrote this")
    script = tmp_path / "script.py"
    script.write_text("import sys\nprint(__name__, sys.argv[1:], sys.path[0])\n")
    ran = subprocess.run([*warm.python(), str(script), "a", "b"], env=launch.worker_env(), capture_output=True, text=True,
                         timeout=60)
    assert ran.stdout.strip() == f"__main__ ['a', 'b'] {tmp_path}"


def test_a_signal_to_the_stand_in_reaches_the_worker_and_its_status_comes_back(tmp_path):
    proc = subprocess.Popen([*warm.python(), "-c", "import time; print('up', flush=True); time.sleep(60)"],
                            env=launch.worker_env(), stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "up"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == -signal.SIGTERM
    assert workers_left() == []


def crash_on_rank_one(rank, world_size):
    if rank == 1:
        raise ValueError("rank one fails on purpose")
    import torch
    import torch.distributed as dist

    dist.all_reduce(torch.zeros(1))  # waits for rank 1 for ever
    return rank


def test_a_worker_that_dies_fails_the_job_with_the_usual_message_and_the_next_job_runs():
    with pytest.raises(launch.WorkerError, match="(?s)rank 1 raised an exception.*rank one fails on purpose"):
        launch.run(crash_on_rank_one, 2, timeout=60, echo=False)
    assert workers_left() == []
    assert [r for _, r, _ in launch.run(whoami, 2, timeout=60, echo=False)] == [0, 1]


def hang(rank, world_size):
    time.sleep(3600)


def test_a_worker_that_hangs_is_killed_at_the_deadline_and_the_next_job_runs():
    start = time.monotonic()
    with pytest.raises(launch.WorkerTimeout, match="ran past its time limit of 3 s"):
        launch.run(hang, 2, backend=None, timeout=3, echo=False)
    assert time.monotonic() - start < 20
    assert workers_left() == []
    assert [r for _, r, _ in launch.run(whoami, 2, timeout=60, echo=False)] == [0, 1]


def kill_the_warm_parent(rank, world_size):
    if rank == 0:
        os.kill(os.getppid(), signal.SIGKILL)
    time.sleep(3600)


def test_a_warm_parent_that_dies_fails_its_job_and_the_next_job_starts_another():
    first = parent_pid()
    with pytest.raises(launch.WorkerError, match="warm parent process ended"):
        launch.run(kill_the_warm_parent, 2, backend=None, timeout=60, echo=False)
    assert not psutil.pid_exists(first) or psutil.Process(first).status() == psutil.STATUS_ZOMBIE
    assert [r for _, r, _ in launch.run(whoami, 2, timeout=60, echo=False)] == [0, 1]
    assert parent_pid() != first


INTERRUPTED = """
import os, signal, sys, time
from multigpu.running import launch

# a kernel's Ctrl-C is KeyboardInterrupt, also where this test runs with SIGINT ignored (a shell's
# background job, whose children inherit that)
signal.signal(signal.SIGINT, signal.default_int_handler)

def wait(rank, world_size, folder):
    open(os.path.join(folder, f"rank{rank}"), "w").write(str(os.getpid()))
    time.sleep(3600)

if __name__ == "__main__":
    launch.run(wait, 2, args=(sys.argv[1],), backend=None, timeout=600, echo=False)
"""


def test_an_interrupt_stops_the_ranks_within_5_seconds(tmp_path):
    """Ctrl-C in a notebook: KeyboardInterrupt in the process that waits for the job."""
    script = tmp_path / "interrupted.py"
    script.write_text(INTERRUPTED)
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path)], env=launch.worker_env())
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("rank*"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    ranks = [int(p.read_text()) for p in tmp_path.glob("rank*")]
    assert len(ranks) == 2, "the job's ranks never started"
    proc.send_signal(signal.SIGINT)
    stopped = time.monotonic()
    while any(psutil.pid_exists(r) and psutil.Process(r).status() != psutil.STATUS_ZOMBIE for r in ranks):
        assert time.monotonic() - stopped < 5, "a rank outlived the interrupt by 5 s"
        time.sleep(0.05)
    proc.wait(timeout=30)


FALLBACK = """
from multigpu.running import launch

def ppid(rank, world_size):
    import os
    return os.getppid()

if __name__ == "__main__":
    import os
    for _ in range(2):
        print("parents", launch.run(ppid, 2, backend=None, timeout=120, echo=False), os.getpid(), flush=True)
"""


@pytest.mark.parametrize("env", [{"MULTIGPU_WARM_PYTHON": "/nonexistent/python"}, {"MULTIGPU_WARM": "0"}],
                         ids=["cannot-start", "turned-off"])
def test_where_the_warm_parent_cannot_start_every_worker_starts_fresh_and_one_line_says_so(tmp_path, env):
    script = tmp_path / "fallback.py"
    script.write_text(FALLBACK)
    ran = subprocess.run([sys.executable, str(script)], env=launch.worker_env(env), capture_output=True, text=True,
                         timeout=300)
    assert ran.returncode == 0, ran.stderr[-3000:]
    said = [line for line in ran.stdout.splitlines() if line.startswith("warm workers unavailable")]
    assert len(said) == 1, ran.stdout
    for line in ran.stdout.splitlines():
        if line.startswith("parents"):
            *parents, launcher = line.split()[1:]
            assert all(p.strip("[],") == launcher for p in parents), line  # the launcher's own children


def test_mpi_jobs_of_warm_ranks_end_cleanly_every_time():
    """MPICH's proxy kills the ranks still running once one has ended, and takes a rank's output
    pipes and PMI socket closing for its end: warm ranks end together and their stand-ins hold no
    other rank's pipes, so a clean job is a clean exit every time (it was one in three at 3 ranks)."""
    for _ in range(10):
        assert launch.run_horovod(whoami_hvd, 3, timeout=120, echo=False) == [(parent_pid(), r, 3) for r in range(3)]
