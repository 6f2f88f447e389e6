"""multigpu.labs.lab5.tensor_parallel: Megatron's split MLP equals the unsplit one, on real workers."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from multigpu.labs.lab5 import tensor_parallel as tp

LAYER = tp.Layer("t", 12, 20, 5)


def test_the_shards_rebuild_the_unsplit_layer():
    full = tp.weights(LAYER)
    parts = [tp.split(full, r, 4) for r in range(4)]
    assert torch.equal(torch.cat([p[0] for p in parts]), full[0])
    assert torch.equal(torch.cat([p[2] for p in parts], dim=1), full[2])
    x = torch.randn(3, LAYER.d)
    partial = sum(F.linear(F.relu(F.linear(x, a, ab)), b) for a, ab, b, _ in parts)
    assert torch.allclose(partial + full[3], tp.unsplit_mlp(x, *full), atol=1e-5)


def no_backward_allreduce(x, w1, b1, w2, b2):
    h = F.relu(F.linear(x, w1, b1))  # f forgotten: the input's gradient stays partial
    return tp.ReduceFromParallel.apply(F.linear(h, w2)) + b2


@pytest.mark.slow
def test_the_split_mlp_equals_the_unsplit_one_on_2_and_4_workers_with_one_allreduce_each_way():
    got = tp.check(tp.parallel_mlp, (2, 4), LAYER)
    for n, r in got.items():
        assert r["output"] < 1e-5 and r["input_grad"] < 1e-5 and r["weight_grads"] < 1e-5, (n, r)
        assert r["forward_allreduces"] == 1 and r["backward_allreduces"] == 1
    wrong = tp.check(no_backward_allreduce, (2,), LAYER)[2]
    assert wrong["output"] < 1e-5 and wrong["input_grad"] > 1e-3 and wrong["backward_allreduces"] == 0


@pytest.mark.slow
def test_torchs_tensor_parallel_runs_on_cpu_and_agrees():
    assert tp.torch_split_matches(LAYER, workers=2) < 1e-5


@pytest.mark.slow
def test_bytes_follow_activations_one_way_and_parameters_the_other():
    layers = (tp.Layer("wide", 512, 2048, 32), tp.Layer("narrow", 32, 128, 2048))  # KBs: gloo adds ~0.6 KB a call
    got = tp.measure(layers, workers=2, steps=2)
    for layer in layers:
        row = got[layer.name]
        for way in ("tensor parallel", "data parallel"):
            assert row[way]["sent"] == pytest.approx(row[way]["predicted"], rel=0.05), (layer.name, way, row[way])
        assert row["tensor parallel"]["allreduces"] == 2 and row["data parallel"]["allreduces"] == 1
    assert got["wide"]["tensor parallel"]["sent"] < got["wide"]["data parallel"]["sent"]
    assert got["narrow"]["tensor parallel"]["sent"] > got["narrow"]["data parallel"]["sent"]
