"""Facts a correct data-parallel run must show, checked on the records of a ``--record`` run.

Each rank of :mod:`multigpu.running.scripts.train_horovod` (or a learner's version of it) run with
``--record`` writes ``rank<R>.json``; :func:`multigpu.running.run_records.read_records` loads them. The
checks here compare the ranks and raise ``AssertionError`` with a message that says what is
wrong and which step of the conversion to look at. They check facts, not code: any correct
script passes them, whatever it looks like.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

Records = Sequence[dict[str, Any]]


def _close(a: float, b: float, rel: float = 1e-6, abs_: float = 1e-6) -> bool:
    return math.isclose(a, b, rel_tol=rel, abs_tol=abs_)


def _needs_records(check: Callable[..., None]) -> Callable[..., None]:
    """A check given no records (``None``: the run above failed) says so instead of a TypeError."""

    @functools.wraps(check)
    def checked(records: Records | None, *args: Any, **kwargs: Any) -> None:
        assert records is not None, (
            "fix the error shown under the cell that ran your script first: it did not finish, so there "
            "is no record to check")
        check(records, *args, **kwargs)

    return checked


@_needs_records
def check_world(records: Records, size: int) -> None:
    """One record per rank, ranks 0..size-1, each seeing ``size`` workers (step 1)."""
    assert len(records) == size, f"run every worker to the end with --record: expected {size} records, got {len(records)}"
    ranks = [r["rank"] for r in records]
    assert ranks == list(range(size)), f"return hvd.rank() from init_horovod: the ranks should be 0..{size - 1}, got {ranks}"
    sizes = {r["size"] for r in records}
    assert sizes == {size}, f"return hvd.size() from init_horovod: every rank should see size {size}, got {sizes}"


@_needs_records
def check_threads(records: Records, cores: int) -> None:
    """CPU mode: the workers of a node share its cores, at least one thread each (step 2)."""
    for r in records:
        if r["device"].startswith("cuda"):
            continue
        fair = max(1, cores // max(1, r["local_size"]))
        assert r["threads"] <= fair, (
            "set torch.set_num_threads(devices.threads_per_worker(local_size)): "
            f"rank {r['rank']} ran {r['threads']} torch threads; {r['local_size']} workers on {cores} cores "
            f"should use at most {fair} each (the assessment's grader cannot count threads: it measures the "
            "throughput that oversubscribed cores cost)"
        )


@_needs_records
def check_same_start(records: Records) -> None:
    """All ranks start training from the same weights (step 6: broadcast from rank 0)."""
    start = [r["start_checksum"] for r in records]
    assert all(_close(s, start[0]) for s in start), (
        "broadcast the parameters and optimizer state from rank 0 (hvd.broadcast_parameters, "
        f"hvd.broadcast_optimizer_state): the ranks started from different weights (checksums {start})"
    )


@_needs_records
def check_same_weights(records: Records) -> None:
    """After training every rank holds the same weights (steps 5 and 6)."""
    check_same_start(records)
    final = [r["final_checksum"] for r in records]
    assert all(_close(f, final[0]) for f in final), (
        "wrap the optimizer in hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters()): "
        f"after training the ranks hold different weights (checksums {final}), each trained alone"
    )


@_needs_records
def check_disjoint_shards(records: Records) -> None:
    """In every epoch the ranks train on disjoint shards that together cover the data set (step 3).

    Where the data set does not split evenly, ``DistributedSampler`` pads: it repeats the first
    ``ceil(n / size) * size - n`` indices of the epoch's order so every rank gets as many. Those
    repeats are allowed; anything shared beyond them is not."""
    epochs = {len(r["shards"]) for r in records}
    assert epochs and min(epochs) > 0, "no shard was recorded: make_train_loader must return (loader, sampler)"
    n = records[0]["train_size"]
    size = len(records)
    share = math.ceil(n / size)
    padding = share * size - n
    for e in range(min(epochs)):
        shards = [set(r["shards"][e]) for r in records]
        repeats = sum(len(s) for s in shards) - len(set().union(*shards))
        if repeats > padding:
            i, j, common = max(((i, j, shards[i] & shards[j]) for i in range(size) for j in range(i + 1, size)),
                               key=lambda t: len(t[2]))
            assert False, (
                "give each rank its own shard with a DistributedSampler(num_replicas=hvd.size(), rank=hvd.rank()): "
                f"in epoch {e + 1} ranks {i} and {j} both trained on {len(common)} of the same images"
                + (f" (the sampler's padding repeats at most {padding} of {n})" if padding else "")
            )
        covered = set().union(*shards)
        assert len(covered) >= n - size, (
            f"the sampler should split the whole data set: in epoch {e + 1} the shards cover {len(covered)} of {n} images"
        )
        biggest = max(len(s) for s in shards)
        assert biggest <= share, (
            f"give each rank only its 1/{size} share: in epoch {e + 1} a rank trained on {biggest} images, "
            f"more than ceil({n} / {size}) = {share}"
        )
    if min(epochs) >= 2:
        assert records[0]["shards"][0] != records[0]["shards"][1], (
            "call sampler.set_epoch(epoch) at the start of each epoch: rank 0 saw its shard in the same order in "
            "epochs 1 and 2 (the assessment's grader fails this too: 'sharded')"
        )


@_needs_records
def check_lr_after_warmup(records: Records, base_lr: float | None = None) -> None:
    """After warm-up the learning rate is ``base_lr x size`` on every rank (step 4)."""
    size = len(records)
    for r in records:
        base = base_lr if base_lr is not None else r["args"]["base_lr"]
        lr = r["lr_after_warmup"]
        assert _close(lr, base * size, rel=1e-6), (
            f"scale the learning rate by hvd.size(): rank {r['rank']}'s after the warm-up is {lr:.6g}, expected "
            f"base x size = {base:g} x {size} = {base * size:.6g} (step 4 asks for the rule; the assessment's "
            "grader does not read the rate: it grades the accuracy a run reaches, and names an unscaled rate when "
            "that falls short)"
        )
        warmup = r["args"].get("warmup_epochs", 0) or 0
        if warmup > 0 and r["history"]["lr"]:
            first = r["history"]["lr"][0]
            if r["args"]["epochs"] >= 1 and warmup >= 1 and size > 1:
                assert first < base * size - 1e-12, (
                    "grow the learning rate linearly from base_lr during the warm-up: "
                    f"rank {r['rank']}'s is already {first:.6g} at the end of epoch 1 of a {warmup:g}-epoch warm-up"
                )
        epochs = r["args"]["epochs"]
        if epochs > warmup and r["history"]["lr"]:
            last = r["history"]["lr"][-1]
            assert _close(last, base * size, rel=1e-6), (
                "set the optimizer's learning rate from the schedule every step: "
                f"rank {r['rank']} trained with lr {last:.6g} after the warm-up, expected {base * size:.6g}"
            )


@_needs_records
def check_metrics_averaged(records: Records, names: Sequence[str] = ("train_loss", "val_acc")) -> None:
    """Each reported metric is the mean of the ranks' own values, identical on all ranks (step 7)."""
    size = len(records)
    for name in names:
        if name not in records[0]["local_metrics"]:
            continue
        locals_ = [r["local_metrics"][name] for r in records]
        for e in range(len(locals_[0])):
            mean = sum(v[e] for v in locals_) / size
            for r in records:
                got = r["history"][name][e]
                assert got is not None and _close(got, mean, rel=1e-5, abs_=1e-7), (
                    "average with hvd.allreduce(torch.tensor(value), name=name): "
                    f"rank {r['rank']} reported {name} = {got} in epoch {e + 1}, but the mean over the "
                    f"{size} ranks is {mean}"
                )
    spread = [r["local_metrics"].get("train_loss", [None])[0] for r in records]
    if size > 1 and None not in spread:
        assert len(set(spread)) > 1, "give each rank its own shard (DistributedSampler): all ranks had the same local loss"


@_needs_records
def check_rank0_checkpoint(records: Records, out: str | Path) -> None:
    """Only rank 0 writes the checkpoint, and it is there (step 8)."""
    writers = [r["rank"] for r in records if r["saved_checkpoint"]]
    assert writers == [0], f"save on rank 0 only (if hvd.rank() == 0): ranks {writers} wrote the checkpoint"
    assert (Path(out) / "checkpoint.pt").exists(), f"save the checkpoint with torch.save(..., path) on rank 0: there is none at {Path(out) / 'checkpoint.pt'}"


def _checks(records: Records, out: str | Path, size: int, cores: int | None) -> list[tuple[str, Callable[[], None]]]:
    """Every check above as ``(the steps it looks at, a call)``, in the order of the conversion steps."""
    from multigpu.core import devices

    return [
        ("steps 1 and 9: every rank ran and left its record", lambda: check_world(records, size)),
        ("step 2: a fair share of threads", lambda: check_threads(records, cores or devices.cpu_cores())),
        ("step 3: disjoint shards, reshuffled each epoch", lambda: check_disjoint_shards(records)),
        ("step 4: the scaled learning rate after the warm-up", lambda: check_lr_after_warmup(records)),
        ("steps 5 and 6: one model on every rank", lambda: check_same_weights(records)),
        ("step 7: averaged metrics", lambda: check_metrics_averaged(records)),
        ("step 8: one checkpoint, from rank 0", lambda: check_rank0_checkpoint(records, out)),
    ]


@_needs_records
def check_all(records: Records, out: str | Path, size: int, cores: int | None = None) -> None:
    """Every check above, in the order of the conversion steps."""
    for _, check in _checks(records, out, size, cores):
        check()


def report(records: Records | None, out: str | Path, size: int, cores: int | None = None) -> list[str]:
    """One line per check of a whole run, ``ok`` or ``FAIL`` with its message, for a learner to read.

    Lab 3 grades each step in its own exercise test; this report shows how the steps work together
    in one run of the assembled script, and raises nothing."""
    if records is None:
        return ["FAIL the script did not finish: fix the error shown under the cell that ran it"]
    lines = []
    for what, check in _checks(records, out, size, cores):
        try:
            check()
        except AssertionError as failed:
            lines.append(f"FAIL {what}: {failed}")
        else:
            lines.append(f"ok   {what}")
    return lines
