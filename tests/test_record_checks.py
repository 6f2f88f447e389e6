"""multigpu.labs.lab3.record_checks: each fact check passes on a correct run and fails, with advice, on a broken one."""

from __future__ import annotations

import copy

import pytest

from multigpu.labs.lab3 import record_checks


def good_records(size: int = 2, n: int = 8) -> list[dict]:
    """Records as a correct 2-epoch run with a 1-epoch warm-up writes them."""
    recs = []
    local_loss = [[1.0 + r, 0.5 + r] for r in range(size)]
    mean = [sum(v[e] for v in local_loss) / size for e in range(2)]
    for r in range(size):
        recs.append({
            "rank": r, "size": size, "local_rank": r, "local_size": size, "threads": 1, "device": "cpu",
            "args": {"base_lr": 0.02, "warmup_epochs": 1.0, "epochs": 2, "batch_size": 4},
            "start_checksum": 12.5, "final_checksum": -3.25, "train_size": n,
            "shards": [list(range(r, n, size)), list(range(n - 1 - r, -1, -size))],
            "local_metrics": {"train_loss": local_loss[r]},
            "history": {"lr": [0.03, 0.02 * size], "train_loss": mean},
            "saved_checkpoint": r == 0, "lr_after_warmup": 0.02 * size,
        })
    return recs


def test_good_records_pass_every_check(tmp_path):
    (tmp_path / "checkpoint.pt").write_bytes(b"x")
    record_checks.check_all(good_records(), tmp_path, 2, cores=2)
    record_checks.check_all(good_records(4, 12), tmp_path, 4, cores=2)


@pytest.mark.parametrize(
    "breakage, check, advice",
    [
        (lambda rs: rs[1].update(final_checksum=9.0), record_checks.check_same_weights, "DistributedOptimizer"),
        (lambda rs: rs[1].update(start_checksum=1.0), record_checks.check_same_start, "broadcast"),
        (lambda rs: rs[1].update(shards=rs[0]["shards"]), record_checks.check_disjoint_shards, "DistributedSampler"),
        (lambda rs: [r.update(shards=[r["shards"][0], r["shards"][0]]) for r in rs], record_checks.check_disjoint_shards, "set_epoch"),
        (lambda rs: [r.update(lr_after_warmup=0.02) for r in rs], record_checks.check_lr_after_warmup, "hvd.size()"),
        (lambda rs: [r["history"].update(lr=[0.04, 0.04]) for r in rs], record_checks.check_lr_after_warmup, "warm-up"),
        (lambda rs: rs[0]["history"].update(train_loss=[1.0, 0.5]), record_checks.check_metrics_averaged, "hvd.allreduce"),
        (lambda rs: rs[1].update(threads=2), lambda rs: record_checks.check_threads(rs, 2), "set_num_threads"),
        (lambda rs: rs[1].update(size=3), lambda rs: record_checks.check_world(rs, 2), "hvd.size()"),
    ],
)
def test_broken_records_fail_with_advice(breakage, check, advice):
    recs = copy.deepcopy(good_records())
    breakage(recs)
    with pytest.raises(AssertionError) as failed:
        check(recs)
    # the advice comes first: nbgrader's Validate shows only the start of a message
    assert advice in str(failed.value)[:90], str(failed.value)


def test_report_names_every_check_and_the_failing_step(tmp_path):
    (tmp_path / "checkpoint.pt").write_bytes(b"x")
    good = record_checks.report(good_records(), tmp_path, 2, cores=2)
    assert len(good) == 7 and all(line.startswith("ok   step") for line in good), good
    broken = copy.deepcopy(good_records())
    broken[1].update(final_checksum=9.0)
    lines = record_checks.report(broken, tmp_path, 2, cores=2)
    failed = [line for line in lines if line.startswith("FAIL")]
    assert len(failed) == 1 and failed[0].startswith("FAIL steps 5 and 6") and "DistributedOptimizer" in failed[0]
    assert record_checks.report(None, tmp_path, 2)[0].startswith("FAIL the script did not finish")


def test_a_run_that_failed_is_named_not_a_type_error():
    with pytest.raises(AssertionError, match="^fix the error shown under the cell that ran your script first"):
        record_checks.check_world(None, 2)


def sampler_records(n: int, size: int, epochs: int = 2) -> list[dict]:
    """Records whose shards are exactly what torch's DistributedSampler gives each rank."""
    from torch.utils.data import DistributedSampler

    recs = good_records(size, n)
    for r in recs:
        sampler = DistributedSampler(range(n), num_replicas=size, rank=r["rank"], shuffle=True, seed=3)
        r["shards"] = []
        for e in range(epochs):
            sampler.set_epoch(e)
            r["shards"].append(list(sampler))
    return recs


@pytest.mark.parametrize("n, size", [(10, 4), (9, 2), (4003, 4), (12, 4)])
def test_a_distributed_sampler_passes_when_the_data_does_not_split_evenly(n, size):
    record_checks.check_disjoint_shards(sampler_records(n, size))  # it pads with up to size - 1 repeats


def test_shards_shared_beyond_the_samplers_padding_fail():
    recs = sampler_records(10, 4)  # 2 padded repeats allowed
    recs[1]["shards"][0] = recs[1]["shards"][0][:1] + recs[0]["shards"][0][:2]  # 2 more of rank 0's images
    with pytest.raises(AssertionError, match=r"^give each rank its own shard .* ranks 0 and 1 both trained on 2 .*"
                                             r"padding repeats at most 2 of 10"):
        record_checks.check_disjoint_shards(recs)


def test_rank0_checkpoint(tmp_path):
    recs = good_records()
    with pytest.raises(AssertionError, match="^save the checkpoint with torch.save"):
        record_checks.check_rank0_checkpoint(recs, tmp_path)
    (tmp_path / "checkpoint.pt").write_bytes(b"x")
    record_checks.check_rank0_checkpoint(recs, tmp_path)
    recs[1]["saved_checkpoint"] = True
    with pytest.raises(AssertionError, match="^save on rank 0 only"):
        record_checks.check_rank0_checkpoint(recs, tmp_path)
