"""multigpu.labs.lab5.zero: ZeRO stages 1 and 2 over Horovod, on real workers, against data parallelism."""

from __future__ import annotations

import statistics

import pytest
import torch
from torch import nn

from multigpu.labs.lab5 import bytes_sent, zero

SMALL = zero.Model(inputs=32, width=48, depth=2, classes=10, batch=16)


def test_flat_parameters_are_views_and_pad_to_a_multiple_of_the_workers():
    model = zero.build(SMALL)
    before = [p.detach().clone() for p in model.parameters()]
    flat = zero.FlatParameters(list(model.parameters()), 4)
    assert flat.numel == sum(p.numel() for p in before)
    assert flat.flat.numel() % 4 == 0 and flat.flat.numel() - flat.numel < 4
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))
    flat.flat.zero_()  # the parameters are views of the buffer
    assert all(float(p.abs().sum()) == 0 for p in model.parameters())
    x, y = zero.batch_of(SMALL, 0, 0, 1)
    nn.functional.cross_entropy(model(x), y).backward()
    assert float(flat.grad.abs().sum()) > 0  # autograd accumulated into the flat gradient
    shard = flat.shard(3)
    assert shard.numel() == flat.shard_numel and shard.requires_grad and shard.is_leaf


def test_a_global_batch_is_the_same_whatever_the_workers():
    whole, _ = zero.batch_of(SMALL, 2, 0, 1)
    parts = [zero.batch_of(SMALL, 2, r, 4)[0] for r in range(4)]
    assert torch.equal(torch.cat(parts), whole)


def test_ring_bytes_is_2_n_minus_1_over_n():
    assert zero.ring_bytes(100, 4) == 150 and zero.ring_bytes(100, 1) == 0


@pytest.mark.skipif(not bytes_sent.available(), reason="no /proc/self/io on this system")
def test_bytes_sent_counts_what_the_process_writes(tmp_path):
    with bytes_sent.counting() as sent:
        (tmp_path / "f").write_bytes(b"x" * 12345)
    assert 12345 <= sent() < 12345 + 4096


@pytest.mark.slow
@pytest.mark.parametrize("controller", ["gloo", "mpi"])
def test_every_collective_zero_could_use_works_on_cpu_workers(controller):
    from multigpu.running import launch

    if controller == "mpi" and launch.horovod_controller() != "mpi":
        pytest.skip("Horovod was built without MPI here")
    got = zero.collectives(controller)
    assert set(got) >= {"allreduce", "reducescatter", "allgather", "grouped_allreduce", "grouped_reducescatter",
                        "grouped_allgather", "allreduce in a process set"}
    assert all(v == "ok" for v in got.values()), got


@pytest.mark.slow
def test_sharded_adam_trains_like_data_parallel_with_a_quarter_of_the_state_and_the_same_bytes():
    """On 4 real Horovod workers: after 3 steps each stage's weights equal plain data parallelism's,
    every rank holds 1/4 of the optimizer state, and stage 2 sends what an all-reduce sends
    (stage 1, all-reduce then all-gather: 1.5 times)."""
    shape = zero.Model()  # 2.6 MB of gradient: Horovod's own messages are noise beside it
    got = zero.compare(shape, workers=4, steps=3)
    dp, one, two = got["data parallel"], got["stage 1"], got["stage 2"]
    for way in (dp, one, two):
        assert way["ranks_agree"]
        assert way["max_weight_diff"] < 1e-5
        for compute, whole in zip(way["samples"]["compute_s"], way["samples"]["step_s"]):
            assert len(compute) == len(whole) == 3 and all(0 < c < t for c, t in zip(compute, whole)), (compute, whole)
    for stage in (one, two):
        ratio = max(stage["state_bytes"]) / max(dp["state_bytes"])
        assert ratio == pytest.approx(0.25, abs=1e-4), ratio
    ring = zero.ring_bytes(dp["gradient_bytes"], 4)  # 2 (N-1)/N of the gradient: ZeRO's "2 x model size"
    assert statistics.mean(dp["sent"]) == pytest.approx(ring, rel=0.02)
    assert statistics.mean(two["sent"]) == pytest.approx(ring, rel=0.10)
    assert statistics.mean(two["sent"]) / statistics.mean(dp["sent"]) == pytest.approx(1.0, abs=0.10)
    assert statistics.mean(one["sent"]) / statistics.mean(dp["sent"]) == pytest.approx(1.5, abs=0.05)


def wrong_sum_step(flat_params, flat_grad, shard, optimizer):
    import horovod.torch as hvd

    shard.grad = hvd.reducescatter(flat_grad, op=hvd.Sum, name="zero.gradient")  # summed, not averaged
    optimizer.step()
    flat_params.copy_(hvd.allgather(shard.detach(), name="zero.weights"))


@pytest.mark.slow
def test_check_step_passes_the_step_and_catches_a_summed_gradient():
    right = zero.check_step(zero.sharded_step, workers=2)
    assert right["ranks_agree"] and right["max_weight_diff"] < 1e-5
    assert right["state_ratio"] == pytest.approx(0.5, abs=1e-4) and right["sent_ratio"] < 1.1
    wrong = zero.check_step(wrong_sum_step, workers=2)
    assert wrong["ranks_agree"] and wrong["max_weight_diff"] > 1e-4
