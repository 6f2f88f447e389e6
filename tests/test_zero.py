"""multigpu.labs.lab5.zero and sharded_gradients: ZeRO stages 1 and 2 over Horovod, on real workers, against data
parallelism."""

from __future__ import annotations

import math
import statistics

import pytest
import torch
from torch import nn

from multigpu.labs.lab5 import bytes_sent, sharded_gradients, zero

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


def test_gradient_error_is_relative_to_the_largest_entry_and_inf_without_a_gradient():
    dp = (torch.arange(4), torch.tensor([1.0, -4.0, 2.0, 0.5]))
    assert zero.gradient_error((torch.tensor([1, 2]), torch.tensor([-4.0, 2.0])), dp) == 0
    assert zero.gradient_error((torch.tensor([1, 2]), torch.tensor([-4.0, 3.0])), dp) == pytest.approx(0.25)
    assert zero.gradient_error(None, dp) == math.inf
    assert zero.gradient_error((torch.tensor([1, 2]), torch.tensor([1.0])), dp) == math.inf


#: Stage 2's worst case on MANY_LAYERS, per rank 0: its rows of every parameter (64 of 256 rows of each
#: hidden layer, 3 of 10 of the last), IN_FLIGHT layers' whole gradients and one layer's reduced rows.
LAYER = 256 * 256 + 256
STAGE2_BOUND = 4 * (96 * (64 * 256 + 64) + 3 * 256 + 3 + sharded_gradients.IN_FLIGHT * LAYER + (64 * 256 + 64))


@pytest.mark.slow
def test_every_way_trains_like_data_parallel_and_stage_2_holds_a_quarter_of_the_gradient(sharding_runs):
    """On 4 real Horovod workers, the model of 96 layers, 3 steps (the session's sharding runs): every way's weights equal data
    parallelism's and each rank's averaged gradient its slice of data parallelism's; each rank holds
    1/4 of the optimizer state; at its peak a rank holds the whole gradient in data parallelism and
    stage 1 (1.25 x with the reduce-scatter's slice beside it), and under 0.3 x in stage 2 (its rows and
    at most IN_FLIGHT layers); stage 2 and stage 1 by reduce-scatter send what an all-reduce sends,
    stage 1 by all-reduce 1.5 times that."""
    got = sharding_runs[0]
    dp = got["data parallel"]
    assert dp["parameters"] == 96 * LAYER + 256 * 10 + 10
    for way, row in got.items():
        assert row["ranks_agree"] and row["max_weight_diff"] < 1e-5 and row["grad_error"] < 1e-5, (way, row)
        for compute, whole in zip(row["samples"]["compute_s"], row["samples"]["step_s"]):
            assert len(compute) == len(whole) == 3 and all(0 < c < t for c, t in zip(compute, whole)), (compute, whole)
        if way != "data parallel":
            assert max(row["state_bytes"]) / max(dp["state_bytes"]) == pytest.approx(0.25, abs=1e-4), way
    padded = 4 * math.ceil(dp["parameters"] / 4)
    assert dp["peak_grad_bytes"] == [4 * padded] * 4
    assert got["stage 1, all-reduce"]["peak_grad_bytes"] == [4 * padded] * 4
    assert got["stage 1, reduce-scatter"]["peak_grad_bytes"] == [5 * padded] * 4
    two = got["stage 2"]["peak_grad_bytes"]
    assert max(two) <= STAGE2_BOUND and max(two) / dp["peak_grad_bytes"][0] < 0.3, two
    sent = {way: statistics.mean(row["sent"]) / statistics.mean(dp["sent"]) for way, row in got.items()}
    assert statistics.mean(dp["sent"]) == pytest.approx(zero.ring_bytes(dp["gradient_bytes"], 4), rel=0.02)
    assert sent["stage 1, reduce-scatter"] == pytest.approx(1.0, abs=0.10)
    assert sent["stage 2"] == pytest.approx(1.0, abs=0.10)
    assert sent["stage 1, all-reduce"] == pytest.approx(1.5, abs=0.05)


def wrong_sum_step(flat_params, flat_grad, shard, optimizer):
    import horovod.torch as hvd

    shard.grad = hvd.reducescatter(flat_grad, op=hvd.Sum, name="zero.gradient")  # summed, not averaged
    optimizer.step()
    flat_params.copy_(hvd.allgather(shard.detach(), name="zero.weights"))


@pytest.mark.slow
def test_check_step_passes_the_step_and_catches_a_summed_gradient_on_the_gradient():
    right = zero.check_step(zero.sharded_step, workers=2)
    assert right["grad_error"] < 1e-6 and right["ranks_agree"] and right["max_weight_diff"] < 1e-5
    assert right["state_ratio"] == pytest.approx(0.5, abs=1e-4) and right["sent_ratio"] < 1.1
    wrong = zero.check_step(wrong_sum_step, workers=2)
    assert wrong["grad_error"] == pytest.approx(1.0, rel=1e-4)  # twice the average: off by the average itself
    assert wrong["ranks_agree"]
