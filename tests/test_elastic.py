"""multigpu.labs.lab4.elastic and scripts/train_elastic: a worker killed mid-epoch, training goes on, and the
ledger accounts for every sample."""

from __future__ import annotations

import contextlib
import json
import os
import sys

import pytest

from multigpu.labs.lab4 import elastic
from multigpu.running import launch


@contextlib.contextmanager
def busy_cores(seconds: float):
    """One CPU-bound process per core of this machine for the block (each ends by itself after
    ``seconds`` too): the kill run must survive other work on the machine."""
    spin = f"import time\nend = time.time() + {seconds}\nwhile time.time() < end: pass"
    procs = [launch.start([sys.executable, "-c", spin], env=dict(os.environ), capture=False)
             for _ in range(len(os.sched_getaffinity(0)))]
    try:
        yield procs
    finally:
        launch.kill_sessions(procs)


def _ledger(tmp_path, lines_by_pid):
    for pid, lines in lines_by_pid.items():
        (tmp_path / f"{pid}.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return elastic.read_ledger(tmp_path)


def test_the_accounting_finds_a_lost_and_a_repeated_sample(tmp_path):
    t = iter(range(100))
    start = [{"event": "start", "rank": r, "size": 2, "host": "localhost", "time": next(t)} for r in (0, 1)]
    entries = _ledger(tmp_path, {
        10: [start[0], {"event": "commit", "epoch": 0, "rank": 0, "size": 2, "indices": [0, 2], "time": next(t)},
             {"event": "reset", "rank": 0, "size": 1, "lost": 2, "time": next(t)},
             {"event": "commit", "epoch": 0, "rank": 0, "size": 1, "indices": [4, 5], "time": next(t)}],
        11: [start[1], {"event": "commit", "epoch": 0, "rank": 1, "size": 2, "indices": [1, 3], "time": next(t)}],
    })
    exact = elastic.account(entries, 6, 1)
    assert exact.exact and exact.sizes == [2, 1] and exact.resets == 1 and exact.lost_samples == 2
    assert "epoch 1: 6 of 6 samples committed, 0 missing, 0 more than once" in exact.report()
    wrong = elastic.account(entries, 7, 1)
    assert not wrong.exact and wrong.missing[0] == [6]
    (tmp_path / "12.jsonl").write_text(json.dumps(
        {"event": "commit", "epoch": 0, "rank": 2, "size": 1, "indices": [5], "time": 50}) + "\n")
    twice = elastic.account(elastic.read_ledger(tmp_path), 6, 1)
    assert twice.repeated[0] == [5] and "1 more than once" in twice.report()


@pytest.mark.slow
def test_on_a_busy_machine_a_killed_worker_leaves_with_its_host_which_comes_back_and_no_sample_is_lost(tmp_path):
    """4 workers on two hosts (localhost, 127.0.0.1), one busy process per core beside them; one
    step after the first commit a worker on localhost is killed. Horovod drops that host, the other
    2 workers throw away what they trained since the commit, go back to it and go on; after the
    blacklist's cool-down the host rejoins at a commit (its workers start Python and import torch
    on the busy machine while the survivors wait for them) and the run ends on 4 workers. The
    committed samples cover each epoch exactly once."""
    timeout = 420  # the run took 44 s on an idle 2-core machine, 87-147 s beside busy loops and other work
    with busy_cores(timeout + 60) as busy:
        run = elastic.run(tmp_path, kill_at_commit=1, kill_after_steps=1, cooldown_s=(1, 2), gloo_timeout_s=5,
                          echo=False, timeout=timeout, script_args=["--epochs", "3", "--synthetic", "512",
                                                                "--commit-every", "4", "--step-delay", "0.2"])
        assert all(p.poll() is None for p in busy), "the busy processes must run beside the whole job"
    accounting = run.accounting
    assert len(run.killed) == 1
    assert accounting.sizes == [4, 2, 4], accounting.report()
    assert accounting.lost_samples > 0, "the kill should have come between two commits: " + accounting.report()
    assert accounting.exact, accounting.report()
    ends = [e for e in run.entries if e.event == "end"]
    assert len(ends) == 4 and {e.data["size"] for e in ends} == {4}


#: A worker of a 2-worker Gloo job whose rank 1 reaches ``hvd.init()`` 6 s late, as a worker that
#: joins an elastic job does while it imports torch.
RANK_1_STARTS_LATE = """
import os, time
import horovod.torch as hvd
if os.environ["HOROVOD_RANK"] == "1":
    time.sleep(6)
hvd.init()
print("in a ring of", hvd.size(), flush=True)
"""


@pytest.mark.slow
def test_a_worker_later_than_the_gloo_timeout_joins_within_the_rendezvous_timeout():
    """The project's Horovod patch, item 6: the ring waits HOROVOD_GLOO_RENDEZVOUS_TIMEOUT_SECONDS
    for a late peer, while collectives keep the short HOROVOD_GLOO_TIMEOUT_SECONDS. Without it a
    peer 6 s late fails a job whose Gloo timeout is 2 s."""
    argv, args = [sys.executable, "-c", RANK_1_STARTS_LATE], ["--gloo", "--gloo-timeout-seconds", "2"]
    joined = launch.horovodrun(argv, 2, horovod_args=args, echo=False, timeout=120,
                               env={"HOROVOD_GLOO_RENDEZVOUS_TIMEOUT_SECONDS": "60"})
    assert joined.text.count("in a ring of 2") == 2, joined.text
    late = launch.horovodrun(argv, 2, horovod_args=args, echo=False, timeout=120, check=False)
    assert late.returncodes != [0] and "Wait timeout after 2 seconds" in late.text, late.text


def test_a_failed_job_is_explained_with_its_cause_and_what_to_do():
    """The survivors gave up on workers that were still starting (the failure Lab 4's kill run met
    on a busy machine): the message names the cause and the remedy, and keeps the workers' errors."""
    output = [("[2]<stderr>:  what():  [http_store.cc:54] Wait timeout after 5 seconds for key(s): 2. You may want to "
               "increase the timeout via HOROVOD_GLOO_TIMEOUT_SECONDS"),
              "Process 2 exit with status code 134.",
              "[3]<stderr>:  what():  [pair.cc:799] connect [127.0.0.1]:12711: Connection refused",
              "ERROR:root:failure count == 4 -> stop running"]
    message = elastic.explain_failure(launch.JobResult([1], 1.0, output))
    assert message.startswith("workers waited 5 s for a peer to join the ring"), message
    assert "rendezvous_timeout_s" in message and "Connection refused" in message
    assert elastic.explain_failure(launch.JobResult([1], 1.0, output[2:])).startswith("every worker exited with an error")


@pytest.mark.slow
def test_a_restart_from_rank_0s_checkpoint_keeps_the_copies_identical_only_with_the_optimizer_first(tmp_path):
    """Lab 4, part 3: a checkpoint with momentum (2 steps of the course's optimizer, weight decay
    included); 2 workers restart from it and take one step on the same batch. Weights alone: rank 1
    has no momentum and the copies differ. Weights, then the optimizer's state: the zero-gradient
    step that creates rank 1's optimizer state applies weight decay after the weights were sent.
    The optimizer's state first, then the weights: identical."""
    import torch

    from multigpu.core import models, training
    from multigpu.running import launch

    torch.manual_seed(1)
    model = models.build_model("alexnet_small")
    optimizer = training.make_optimizer(model, 0.01)
    assert optimizer.param_groups[0]["weight_decay"] > 0, "the lesson needs an optimizer with weight decay"
    size = models.default_image_size("alexnet_small")
    images, labels = torch.randn(8, 3, size, size), torch.randint(0, 10, (8,))
    for _ in range(2):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(images), labels).backward()
        optimizer.step()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": 1}, tmp_path / "checkpoint.pt")
    rank0, rank1 = launch.run_horovod(elastic.resume_one_step, 2, args=(str(tmp_path / "checkpoint.pt"),), echo=False, timeout=120)
    weights_only, lab3_order, optimizer_first = elastic.RESUME_ORDERS
    assert abs(rank0[weights_only] - rank1[weights_only]) > 1e-3
    assert rank0[lab3_order] != rank1[lab3_order]
    assert rank0[optimizer_first] == rank1[optimizer_first]


def test_the_late_exit_of_a_worker_whose_slot_was_relaunched_is_not_recorded():
    """The project's Horovod patch, item 5: a worker killed with its blacklisted host can be reaped
    after the host came back and a new worker took its slot; its exit code (137) must not be
    recorded as the new worker's, or a job that finished on every worker is reported as failed
    (seen once in Lab 4's kill run on a loaded machine)."""
    import threading

    from horovod.runner.common.util.hosts import SlotInfo
    from horovod.runner.elastic import discovery
    from horovod.runner.elastic.driver import ElasticDriver

    class Rendezvous:
        def stop(self):
            pass

    driver = ElasticDriver(Rendezvous(), discovery.FixedHosts({"localhost": 1}), min_num_proc=1, max_num_proc=1)
    recorded, old_started, old_may_exit = [], threading.Event(), threading.Event()

    def create_worker(slot_info, events):
        if not old_started.is_set():  # the old worker: killed, and reaped after the new one started
            old_started.set()
            old_may_exit.wait(10)
            return 137, 1.0
        return 0, 2.0  # the new worker: done

    driver._create_worker_fn = create_worker
    driver._handle_worker_exit = lambda slot_info, exit_code, timestamp: recorded.append(exit_code)
    slot = SlotInfo(hostname="localhost", rank=0, local_rank=0, cross_rank=0, size=1, local_size=1, cross_size=1)
    try:
        driver._start_worker_process(slot)  # the old worker, still being killed
        assert old_started.wait(10)
        driver._start_worker_process(slot)  # the new worker on the same slot
        old_may_exit.set()
        driver.get_results()  # joins both worker threads
    finally:
        driver.stop()
    assert recorded == [0], recorded
