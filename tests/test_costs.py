"""multigpu.labs.lab4.costs: time to train, the bill, and spot interruptions (checked against a simulation)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from multigpu.labs.lab4 import costs


def simulate(hours, rate, rng, tau=None, c=0.0, r=0.0, trials=20000):
    """Mean wall-clock hours by drawing Poisson interruptions: each segment (the whole job without
    checkpoints) is retried, after a restart, until it runs through without one."""
    tau = hours if tau is None else tau
    segments = int(round(hours / tau))
    total = np.zeros(trials)
    for _ in range(segments):
        need = np.full(trials, tau + c)
        first = np.ones(trials, bool)
        left = np.ones(trials, bool)
        while left.any():
            attempt = need + np.where(first, 0.0, r)  # a restart before every try but the first
            gap = rng.exponential(1 / rate, size=trials)
            done = left & (gap >= attempt)
            failed = left & ~done
            total += np.where(done, attempt, 0.0) + np.where(failed, gap, 0.0)
            left, first = failed, first & ~left
    return total.mean()


def test_time_to_train_is_one_gpus_time_over_n_times_efficiency():
    assert math.isclose(costs.hours_to_train(100, 8, 0.9), 100 / 7.2)
    assert costs.hours_to_train(10, 1, 1.0) == 10
    for bad in [(10, 0, 1.0), (10, 4, 0.0), (10, 4, -0.5)]:
        with pytest.raises(ValueError):
            costs.hours_to_train(*bad)


def test_interruptions_cost_what_a_simulation_says():
    rng = np.random.default_rng(0)
    assert costs.expected_hours_with_interruptions(5.0, 0.0) == 5.0
    assert math.isclose(costs.expected_hours_with_interruptions(4.0, 0.0, checkpoint_every=1.0, checkpoint_cost=0.1), 4.4)
    for hours, rate in [(2.0, 0.1), (3.0, 0.5)]:
        formula = costs.expected_hours_with_interruptions(hours, rate)
        assert formula > hours
        assert math.isclose(formula, simulate(hours, rate, rng), rel_tol=0.03), (hours, rate)
    # restart from the last checkpoint: restart paid after each interruption, checkpoint per segment
    formula = costs.expected_hours_with_interruptions(3.0, 0.5, checkpoint_every=0.5, checkpoint_cost=0.05, restart_cost=0.1)
    assert math.isclose(formula, simulate(3.0, 0.5, rng, tau=0.5, c=0.05, r=0.1), rel_tol=0.03)


def test_checkpoints_pay_off_on_a_long_job_and_cost_time_on_a_safe_one():
    risky = dict(hours=10.0, rate_per_hour=0.5)
    assert costs.expected_hours_with_interruptions(**risky) > 250  # (e^5 - 1) / 0.5
    assert costs.expected_hours_with_interruptions(**risky, checkpoint_every=0.5, checkpoint_cost=0.01) < 12
    safe = dict(hours=1.0, rate_per_hour=0.001)
    assert (costs.expected_hours_with_interruptions(**safe, checkpoint_every=0.1, checkpoint_cost=0.01)
            > costs.expected_hours_with_interruptions(**safe))


def test_the_cheapest_option_that_meets_the_deadline():
    efficiency = {1: 1.0, 2: 0.95, 4: 0.9, 8: 0.8, 16: 0.6}.get
    choices = costs.options(16.0, efficiency, gpus=(1, 2, 4, 8, 16), on_demand=3.0, spot=0.9,
                            interruptions_per_hour=0.2, gpus_per_instance=16, checkpoint_every=0.25, checkpoint_cost=0.01)
    assert len(choices) == 15 and {o.label for o in choices} == {
        "on demand", "spot, restart from zero", "spot, from the last checkpoint"}
    on_demand = {o.gpus: o for o in choices if o.label == "on demand"}
    assert math.isclose(on_demand[4].hours, 16 / 3.6) and math.isclose(on_demand[4].cost, 4 * 3.0 * 16 / 3.6)
    # more GPUs are faster and, below perfect scaling, dearer
    assert on_demand[16].hours < on_demand[8].hours and on_demand[16].cost > on_demand[8].cost
    best = costs.cheapest_within(choices, deadline_hours=3.0)
    assert best.hours <= 3.0
    assert all(o.cost >= best.cost for o in choices if o.hours <= 3.0)
    assert best.label == "spot, from the last checkpoint" and best.gpus == 8, str(best)
    assert costs.cheapest_within(choices, deadline_hours=0.5) is None
    generous = costs.cheapest_within(choices, deadline_hours=100.0)
    assert generous.gpus == 1 and generous.label.startswith("spot")
    assert "GPUs" in str(best) and "$" in str(best)


def test_the_v100_spot_range_runs_from_the_k80s_discount_to_on_demand_where_spot_never_pays():
    low, high = costs.V100_SPOT_RANGE_2017
    on_demand = costs.PRICES_2017["V100, on demand (1-GPU server, $3/h)"]
    assert math.isclose(low, on_demand / 3) and high == on_demand
    def efficiency(n):
        return 0.9 ** math.log2(n)
    for deadline in (200, 30, 8):
        at_high = costs.options(100, efficiency, on_demand=on_demand, spot=high, interruptions_per_hour=0.5,
                                gpus_per_instance=8, checkpoint_every=0.1)
        best = costs.cheapest_within(at_high, deadline)
        assert best is not None and best.label == "on demand", (deadline, best)
        at_low = costs.options(100, efficiency, on_demand=on_demand, spot=low, interruptions_per_hour=0.5,
                               gpus_per_instance=8, checkpoint_every=0.1)
        assert costs.cheapest_within(at_low, deadline).label == "spot, from the last checkpoint", deadline


def test_a_job_on_m_instances_is_interrupted_m_times_as_often():
    assert [costs.instances(n, 8) for n in (1, 8, 9, 16, 64)] == [1, 1, 2, 2, 8]
    assert costs.job_rate(0.5, 64, 8) == 4.0 and costs.job_rate(0.5, 64, 1) == 32.0
    with pytest.raises(ValueError):
        costs.instances(0, 8)

    def efficiency(n):
        return 1.0

    kw = dict(on_demand=3.0, spot=1.0, interruptions_per_hour=0.5, checkpoint_every=0.1)
    for per_instance in (1, 4, 8):
        choices = {(o.gpus, o.label): o for o in costs.options(100, efficiency, gpus_per_instance=per_instance, **kw)}
        for n in (1, 4, 16, 64):
            rate = 0.5 * -(-n // per_instance)
            hours = 100 / n
            assert math.isclose(choices[n, "spot, from the last checkpoint"].hours,
                                costs.expected_hours_with_interruptions(hours, rate, checkpoint_every=0.1)), (per_instance, n)
    # one GPU per instance: 64 GPUs are interrupted 32 times an hour and take longer than 8 GPUs per instance
    one = {(o.gpus, o.label): o for o in costs.options(100, efficiency, gpus_per_instance=1, **kw)}
    eight = {(o.gpus, o.label): o for o in costs.options(100, efficiency, gpus_per_instance=8, **kw)}
    assert one[64, "spot, from the last checkpoint"].hours > 2 * eight[64, "spot, from the last checkpoint"].hours


def test_a_job_that_cannot_finish_takes_infinite_hours_instead_of_overflowing():
    assert costs.expected_hours_with_interruptions(100.0, 32.0) == math.inf
    assert math.isfinite(costs.expected_hours_with_interruptions(100.0, 32.0, checkpoint_every=0.1))
