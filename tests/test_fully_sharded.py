"""multigpu.labs.lab5.fully_sharded: stage 3 by hand over Horovod, and torch's fully_shard, on real workers."""

from __future__ import annotations

import statistics

import pytest

from multigpu.labs.lab5 import fully_sharded, zero


@pytest.mark.slow
def test_stage_3_trains_like_data_parallel_holding_a_shard_and_one_layer(sharding_runs):
    """4 Horovod workers: the same weights as data parallelism after 3 steps; per rank 1/4 of the
    optimizer state; weights held at the peak: the shards and the largest layer, not the model;
    bytes per step about 1.5 x data parallelism's (3 passes of (N-1)/N against 2)."""
    got = sharding_runs[1]  # the lab's small model, 3 steps (the session's sharding runs)
    dp, s3 = got["data parallel"], got["stage 3"]
    assert s3["max_weight_diff"] < 1e-5
    assert max(s3["state_bytes"]) / max(dp["state_bytes"]) == pytest.approx(0.25, abs=1e-4)
    model_bytes = 4 * dp["parameters"]
    shards = model_bytes / 4
    assert max(s3["peak_weight_bytes"]) <= shards + s3["largest_unit_bytes"] + 64
    assert max(s3["peak_weight_bytes"]) < 0.7 * model_bytes
    ratio = statistics.mean(s3["sent"]) / statistics.mean(dp["sent"])
    assert ratio == pytest.approx(1.5, rel=0.10), ratio


@pytest.mark.slow
def test_torchs_fully_shard_runs_on_cpu_workers_and_moves_twice_the_bytes_over_gloo():
    got = fully_sharded.compare_fully_shard(zero.Model(), workers=4, steps=2)
    dp, fs = got["data parallel"], got["fully_shard"]
    assert fs["max_weight_diff"] < 1e-5
    assert max(fs["state_bytes"]) / max(dp["state_bytes"]) == pytest.approx(0.25, abs=0.01)
    assert max(fs["peak_weight_bytes"]) == pytest.approx(4 * dp["parameters"] / 4, rel=0.01)
    # gloo's reduce-scatter is an all-reduce: 2 all-gathers (0.75 each) + 1.5 = 3 against 1.5
    assert statistics.mean(fs["sent"]) / statistics.mean(dp["sent"]) == pytest.approx(2.0, rel=0.05)
