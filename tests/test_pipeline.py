"""multigpu.labs.lab5.pipeline: the orders' rules, and torch's schedules measured on real workers."""

from __future__ import annotations

import pytest

from multigpu.labs.lab5 import pipeline as pp


@pytest.mark.parametrize("stages, m", [(1, 1), (2, 1), (2, 5), (4, 4), (4, 8), (4, 16), (8, 3)])
def test_one_f_one_b_keeps_the_rules_and_at_most_p_minus_s_in_flight(stages, m):
    for s in range(stages):
        order = pp.one_f_one_b_order(s, stages, m)
        assert pp.order_problems(order, s, stages, m) == []
        assert max(pp.in_flight(order)) == min(stages - s, m)
        gpipe = pp.gpipe_order(s, stages, m)
        assert max(pp.in_flight(gpipe)) == m


def test_order_problems_name_what_is_wrong():
    assert "start with 4" in pp.order_problems(pp.gpipe_order(0, 4, 8), 0, 4, 8)[0]
    early = [("B", 0), ("F", 0), ("F", 1), ("B", 1)]
    assert any("after its forward" in p for p in pp.order_problems(early, 1, 2, 2))
    assert "exactly once" in pp.order_problems(pp.one_f_one_b_order(0, 4, 8)[:-1], 0, 4, 8)[0]
    lumpy = [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("F", 3), ("B", 1), ("B", 2), ("B", 3)]
    assert "alternate" in pp.order_problems(lumpy, 0, 2, 4)[0]


def test_the_bubble_formula():
    assert pp.bubble(4, 1) == 0.75 and pp.bubble(4, 16) == 3 / 19 and pp.bubble(1, 5) == 0


@pytest.mark.slow
def test_torchs_schedules_run_the_orders_and_their_bubble_falls_with_m():
    """4 stand-in stages on real workers: torch's GPipe and 1F1B run exactly our orders on every
    stage, hold m against p - s micro-batches, and their measured bubble is at least the formula's
    and falls as m grows."""
    setup = pp.Setup(forward_s=0.01, backward_s=0.02, width=64, micro_batch=8)
    got = pp.measure(setup, stages=4, micro_batches=(1, 4, 8), steps=1)
    assert "refused" in got[("1F1B", 1)]  # torch's 1F1B wants m >= p
    for (name, m), row in got.items():
        if "refused" in row:
            continue
        for s, stage in enumerate(row["stages"]):
            assert stage["order"] == pp.ORDERS[name](s, 4, m), (name, m, s)
            assert stage["peak_in_flight"] == (m if name == "GPipe" else min(4 - s, m))
        assert row["bubble"] >= row["formula"] - 0.03, (name, m, row["bubble"])
    assert got[("GPipe", 8)]["bubble"] < got[("GPipe", 4)]["bubble"] < got[("GPipe", 1)]["bubble"]
    # the first stage of 1F1B holds 4 micro-batches' activations at its peak, GPipe's all 8
    assert got[("1F1B", 8)]["stages"][0]["peak_saved_bytes"] < 0.75 * got[("GPipe", 8)]["stages"][0]["peak_saved_bytes"]


@pytest.mark.slow
def test_real_layers_on_two_stages():
    got = pp.measure(pp.Setup("mlp", width=64, layers=2, micro_batch=8), stages=2, micro_batches=(2, 4), steps=1)
    for (name, m), row in got.items():
        for s, stage in enumerate(row["stages"]):
            assert stage["order"] == pp.ORDERS[name](s, 2, m)
            assert stage["forward_s"] > 0 and stage["backward_s"] > 0 and stage["peak_saved_bytes"] > 0
