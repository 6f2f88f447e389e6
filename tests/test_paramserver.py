"""multigpu.labs.lab2.paramserver: rank 0 averages every gradient; traffic through it grows with N."""

from __future__ import annotations

import pytest
import torch

from multigpu.core import models
from multigpu.labs.lab2 import paramserver
from multigpu.running import launch


def test_flat_gradient_round_trip():
    params = [torch.nn.Parameter(torch.zeros(2, 3)), torch.nn.Parameter(torch.zeros(4))]
    for i, p in enumerate(params):
        p.grad = torch.full_like(p, float(i + 1))
    flat = paramserver.flat_gradient(params)
    assert flat.shape == (10,)
    paramserver.set_flat_gradient(params, flat * 10)
    assert params[0].grad.eq(10).all() and params[1].grad.eq(20).all()


def average_worker(rank, world_size):
    import torch

    from multigpu.labs.lab2 import paramserver

    p = torch.nn.Parameter(torch.zeros(5))
    p.grad = torch.full((5,), float(rank + 1))
    moved = paramserver.ps_average_gradients([p])
    return p.grad.tolist(), moved


@pytest.mark.slow
def test_average_is_exact_and_bytes_through_rank_0_grow_with_n():
    values = launch.run(average_worker, 3, timeout=90, threads=1, echo=False)
    for grad, _ in values:
        assert grad == [2.0] * 5  # (1 + 2 + 3) / 3
    assert values[0][1] == {"sent": 2 * 20, "received": 2 * 20}
    assert values[1][1] == {"sent": 20, "received": 20}


@pytest.mark.slow
def test_scaling_run_reports_every_worker_count_with_the_expected_traffic():
    cfg = {"steps": 2, "warmup": 1, "batch_size": 8}
    rows = paramserver.measure_ps_scaling((1, 2, 4), cfg, timeout=150)
    assert [r["workers"] for r in rows] == [1, 2, 4]
    g = rows[0]["gradient_bytes"]
    assert g == models.ALEXNET_SMALL_PARAMETERS_10 * 4
    for r in rows:
        assert r["central_bytes"] == 2 * (r["workers"] - 1) * g
        assert r["checksums_equal"], "every rank must end with the same parameters"
        assert r["images_per_s"] > 0 and 0 < r["efficiency"] <= 2.0
    assert rows[0]["efficiency"] == pytest.approx(1.0)
    assert rows[2]["worker_bytes"] == 2 * g
    assert "central MB/step" in paramserver.format_rows(rows)


@pytest.mark.gpu
def test_dataparallel_runs_on_the_visible_gpus():
    from multigpu.core.models import build_model

    rate = paramserver.dataparallel_images_per_s(build_model("alexnet", 1000), batch_size=64, steps=2, warmup=1)
    assert rate > 0


def test_dataparallel_refuses_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    with pytest.raises(RuntimeError, match="CUDA"):
        paramserver.dataparallel_images_per_s(torch.nn.Linear(2, 2))


def test_rows_round_trip(tmp_path):
    rows = [{"workers": 1, "images_per_s": 10.0}]
    path = paramserver.save_rows(rows, str(tmp_path / "r.json"))
    assert paramserver.load_rows(str(path)) == rows
    assert paramserver.load_rows(str(tmp_path / "missing.json")) is None
