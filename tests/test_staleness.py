"""multigpu.labs.lab1.staleness: asynchronous SGD's stale gradients, simulated exactly, and stragglers."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from multigpu.labs.lab1 import staleness
from multigpu.labs.lab1.scaling_rule import SmallConvNet


def square(out, target):
    return ((out - target) ** 2).mean()


def quadratic(w0: float = 1.0) -> tuple[nn.Linear, TensorDataset]:
    """loss(w) = w^2 on every example (x = 1, y = 0): curvature 2, gradient 2 w."""
    model = nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(w0)
    return model, TensorDataset(torch.ones(4, 1), torch.zeros(4, 1))


def stale_losses(tau: int, lr: float, steps: int) -> list[float]:
    model, data = quadratic()
    history = staleness.train_stale(model, data, lr=lr, tau=tau, batch_size=4, epochs=steps, loss_fn=square)
    return history["train_loss"]  # one step per epoch: the loss at the weights each gradient was taken at


def test_the_stable_rate_is_the_delayed_recurrences_bound():
    assert staleness.stable_rate(0) == pytest.approx(2.0)
    assert staleness.stable_rate(1) == pytest.approx(1.0)
    assert staleness.stable_rate(4, curvature=2.0) == pytest.approx(np.sin(np.pi / 18))
    rates = [staleness.stable_rate(t) for t in (1, 4, 16, 64)]
    assert all(a > b for a, b in zip(rates, rates[1:]))
    assert staleness.stable_rate(64) * 64 == pytest.approx(np.pi / 2, rel=0.02)  # about 1 / tau
    with pytest.raises(ValueError):
        staleness.stable_rate(-1)


def test_each_step_applies_the_gradient_taken_tau_steps_earlier():
    lr, tau, steps = 0.1, 2, 8
    w = [1.0]
    for t in range(steps):
        w.append(w[t] - lr * 2 * w[max(t - tau, 0)])
    expected = [w[max(t - tau, 0)] ** 2 for t in range(steps)]
    assert stale_losses(tau, lr, steps) == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("tau", [0, 1, 4, 16])
def test_staleness_converges_below_the_stable_rate_and_diverges_above_it(tau):
    bound = staleness.stable_rate(tau, curvature=2.0)
    below, above = stale_losses(tau, 0.8 * bound, 400), stale_losses(tau, 1.5 * bound, 400)
    assert below[-1] < 1e-3 * below[0]
    assert not np.isfinite(above[-1]) or above[-1] > 1e3 * above[0]


def test_tau_zero_is_plain_sgd_on_a_network():
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(24, 3, 8, 8), torch.randint(0, 10, (24,)))
    model = SmallConvNet(side=8, width=4)
    twin = SmallConvNet(side=8, width=4)
    twin.load_state_dict(model.state_dict())
    staleness.train_stale(model, data, lr=0.05, tau=0, batch_size=8, epochs=1, seed=3)
    optimizer = torch.optim.SGD(twin.parameters(), lr=0.05)
    order = torch.randperm(24, generator=torch.Generator().manual_seed(3))
    for start in range(0, 24, 8):
        batch = order[start:start + 8]
        optimizer.zero_grad()
        nn.functional.cross_entropy(twin(data.tensors[0][batch]), data.tensors[1][batch]).backward()
        optimizer.step()
    assert all(torch.allclose(p, q, atol=1e-6) for p, q in zip(model.parameters(), twin.parameters()))


def test_a_diverged_run_stops_and_says_so():
    model, data = quadratic()
    history = staleness.train_stale(model, data, lr=50.0, tau=3, batch_size=4, epochs=10_000, loss_fn=square)
    assert history["diverged"] and history["steps"] < 10_000


def test_the_bound_rate_falls_as_the_quadratics_bound_not_as_one_over_tau():
    assert [round(staleness.bound_rate(1.0, tau), 3) for tau in (0, 1, 4, 16)] == [1.0, 0.5, 0.174, 0.048]
    assert staleness.bound_rate(0.2, 4) == pytest.approx(0.2 * np.sin(np.pi / 18))


def test_the_plan_tries_each_staleness_at_the_fresh_and_the_bounds_rate_and_sync_with_as_many_workers():
    setup = staleness.Setup(lr=0.4, batch=16, taus=(0, 1, 8), seeds=(1, 2))
    keys = setup.plan()
    assert len(keys) == len(set(keys)) == 2 * (1 + 2 + 2 + 2)
    assert (0, 0.4, 16, 1) in keys and (1, 0.4, 16, 2) in keys and (8, 0.4, 16, 1) in keys
    assert (1, pytest.approx(0.2), 16, 1) in keys and (8, pytest.approx(0.4 * np.sin(np.pi / 34)), 16, 2) in keys
    assert (0, 0.4, 32, 1) in keys and (0, 0.4, 9 * 16, 2) in keys  # 2 and 9 synchronous workers


def fake(setup, accs, diverged=()):
    """Results for every run of the plan: accuracies by (tau, lr, batch), one per seed."""
    out = {}
    for tau, lr, batch, seed in setup.plan():
        out[tau, lr, batch, seed] = {"val_acc": accs[tau, round(lr, 4), batch][setup.seeds.index(seed)],
                                     "train_loss": [2.0], "diverged": (tau, round(lr, 4), batch) in diverged,
                                     "steps": 100 // (batch // 16)}
    return out


def test_the_verdict_says_what_the_runs_show():
    setup = staleness.Setup(lr=0.2, batch=16, taus=(0, 1, 4), seeds=(0, 1, 2))
    accs = {(0, 0.2, 16): [0.40, 0.42, 0.44], (1, 0.2, 16): [0.41, 0.43, 0.39], (4, 0.2, 16): [0.0, 0.0, 0.0],
            (1, 0.1, 16): [0.30, 0.33, 0.36], (4, 0.0347, 16): [0.20, 0.22, 0.25],
            (0, 0.2, 32): [0.31, 0.35, 0.37], (0, 0.2, 80): [0.26, 0.27, 0.30]}
    lines = staleness.verdict(fake(setup, accs, diverged={(4, 0.2, 16)}), setup)
    assert "42.0%" in lines[0] and "100 steps" in lines[0]
    assert "within tau = 0's range" in lines[1]
    assert "diverged on every seed" in lines[2]
    assert "below tau = 0's range" in lines[3] and "(the bound's, 0.5 x)" in lines[3]
    assert "below tau = 0's range" in lines[4] and "0.17 x" in lines[4]
    assert lines[5].startswith(" 2 workers") and "batch 32, 50 steps" in lines[5] and "overlap" in lines[5]
    assert lines[6].startswith(" 5 workers") and "synchronous above asynchronous on every seed" in lines[6]
    accs[0, 0.2, 80] = [0.10, 0.11, 0.12]
    accs[4, 0.0347, 16] = [0.10, 0.10, 0.13]
    assert "neither left chance" in staleness.verdict(fake(setup, accs), setup)[6]
    accs[4, 0.0347, 16] = [0.30, 0.31, 0.32]
    assert "asynchronous above synchronous on every seed" in staleness.verdict(fake(setup, accs), setup)[6]
    accs[1, 0.2, 16] = [0.11, 0.10, 0.12]
    assert "did not train" in staleness.verdict(fake(setup, accs), setup)[1]
    assert "diverged on 3 of 3" not in staleness.verdict(fake(setup, accs), setup)[1]
    accs[1, 0.2, 16] = [0.0, 0.11, 0.0]
    runs = fake(setup, accs)
    runs[1, 0.2, 16, 0]["diverged"] = runs[1, 0.2, 16, 2]["diverged"] = True
    assert "did not train (at most 11%, chance is 10%, diverged on 2 of 3 seeds)" in staleness.verdict(runs, setup)[1]
    text = staleness.table(fake(setup, accs), 16)
    assert "3 seeds" not in text and "0 of 3" in text
    assert "1 worker " in text and "async, 5 workers" in text and "sync, 5 workers" in text


def test_the_expected_slowest_of_n_draws():
    times = np.array([1.0, 2.0, 3.0, 10.0])
    assert staleness.expected_max(times, 1) == pytest.approx(times.mean())
    assert staleness.expected_max(times, 2) == pytest.approx(np.mean([max(a, b) for a in times for b in times]))
    assert staleness.expected_max(times, 500) == pytest.approx(10.0, rel=1e-6)
    rng = np.random.default_rng(0)
    skewed = rng.lognormal(0.0, 0.5, 300)
    draws = rng.choice(skewed, size=(20_000, 16)).max(axis=1).mean()
    assert staleness.expected_max(skewed, 16) == pytest.approx(draws, rel=0.02)
    rows = staleness.stragglers(skewed, [4, 16, 64])
    assert [r["workers"] for r in rows] == [4, 16, 64]
    assert 1 > rows[0]["efficiency"] > rows[1]["efficiency"] > rows[2]["efficiency"] > 0
    assert "64" in staleness.straggler_table(skewed, [4, 16, 64])
    with pytest.raises(ValueError):
        staleness.expected_max([], 4)


def test_step_times_times_each_step():
    data = TensorDataset(torch.randn(32, 3, 8, 8), torch.randint(0, 10, (32,)))
    times = staleness.step_times(SmallConvNet(side=8, width=4), data, 8, 12, warmup=2)
    assert times.shape == (12,) and (times > 0).all()


def test_setup_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        staleness.Setup().lr = 1.0  # type: ignore[misc]
