"""multigpu.elastic and scripts/train_elastic: a worker killed mid-epoch, training goes on, and the
ledger accounts for every sample."""

from __future__ import annotations

import json

import pytest

from multigpu import elastic


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
def test_a_killed_worker_leaves_with_its_host_which_comes_back_and_no_sample_is_lost(tmp_path):
    """4 workers on two hosts (localhost, 127.0.0.1); one step after the first commit a worker on
    localhost is killed. Horovod drops that host, the other 2 workers throw away what they trained
    since the commit, go back to it and go on; after the blacklist's cool-down the host rejoins
    at a commit and the run ends on 4 workers. The committed samples cover each epoch exactly once."""
    run = elastic.run(tmp_path, kill_at_commit=1, kill_after_steps=1, cooldown_s=(1, 2), gloo_timeout_s=5, echo=False,
                      timeout=240, script_args=["--epochs", "3", "--synthetic", "512", "--commit-every", "4",
                                                "--step-delay", "0.2"])
    accounting = run.accounting
    assert run.result.returncodes == [0], "\n".join(run.result.output[-30:])
    assert len(run.killed) == 1
    assert accounting.sizes == [4, 2, 4], accounting.report()
    assert accounting.lost_samples > 0, "the kill should have come between two commits: " + accounting.report()
    assert accounting.exact, accounting.report()
    ends = [e for e in run.entries if e.event == "end"]
    assert len(ends) == 4 and {e.data["size"] for e in ends} == {4}
