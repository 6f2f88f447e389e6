"""multigpu.labs.lab4.parallelism: both ways compute the same step; the bytes are those of the tensors they move."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from multigpu.labs.lab4 import parallelism
from multigpu.running import launch

SMALL = parallelism.Shape("small", width=16, depth=4, batch=8)


def test_the_two_stages_are_the_whole_network():
    model = parallelism.build(SMALL)
    first, second = parallelism.stages(model)
    assert len(first) + len(second) == len(model)
    x, _ = parallelism.batch_of(SMALL, 0)
    assert torch.equal(second(first(x)), model(x))
    assert sum(p.numel() for p in first.parameters()) == 2 * (16 * 16 + 16)


def test_the_same_seed_builds_the_same_network_and_batches():
    a, b = parallelism.build(SMALL), parallelism.build(SMALL)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert torch.equal(parallelism.batch_of(SMALL, 3)[0], parallelism.batch_of(SMALL, 3)[0])
    assert not torch.equal(parallelism.batch_of(SMALL, 3)[0], parallelism.batch_of(SMALL, 4)[0])


@pytest.mark.slow
def test_pipeline_and_data_parallel_take_the_single_process_step():
    pipe = launch.run(parallelism.one_step_weights, 2, args=(SMALL, "pipeline"), backend="gloo", echo=False)
    data = launch.run(parallelism.one_step_weights, 2, args=(SMALL, "data parallel"), backend="gloo", echo=False)
    model = parallelism.build(SMALL)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = parallelism.batch_of(SMALL, 0)
    F.cross_entropy(model(x), y).backward()
    opt.step()
    want = [p.detach() for p in model.parameters()]
    for got in (pipe[0] + pipe[1], data[0], data[1]):
        assert len(got) == len(want)
        assert all(torch.allclose(g, w, atol=1e-6) for g, w in zip(got, want))


@pytest.mark.slow
def test_measure_counts_activations_one_way_and_gradients_the_other():
    shapes = (SMALL, parallelism.Shape("wide", width=64, depth=2, batch=4))
    got = parallelism.measure(shapes, steps=2)
    for shape in shapes:
        row = got[shape.name]
        params = sum(p.numel() for p in parallelism.build(shape).parameters())
        assert row["parameters"] == params
        assert row["pipeline"]["bytes"] == 2 * shape.batch * shape.width * 4  # activations forward, gradients back
        assert row["data parallel"]["bytes"] == 2 * params * 4  # 2 workers, each 2 (N-1)/N = 1 x the gradient
        assert row["pipeline"]["step_s"] > 0 and row["data parallel"]["step_s"] > 0
