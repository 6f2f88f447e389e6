"""Mini-batch gradient variance and the gradient noise scale B_simple."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from multigpu.labs.lab1 import gradient_noise, toy


@pytest.fixture(scope="module")
def problem() -> toy.ToyProblem:
    return toy.make_problem(n=2000, seed=0)


def test_gradient_variance_is_trace_sigma_over_b(problem):
    rng = np.random.default_rng(0)
    trace = gradient_noise.trace_covariance(toy.per_example_gradients(toy.START, problem.x, problem.y))
    for b in (1, 16, 128):
        v = gradient_noise.gradient_variance(toy.START, problem.x, problem.y, b, 2000, rng)
        assert v == pytest.approx(trace / b, rel=0.12)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_variance_falls_as_one_over_b(problem, seed):
    bs = [1, 2, 4, 8, 16, 32, 64, 128, 256]
    v = gradient_noise.variance_curve(toy.START, problem.x, problem.y, bs, trials=200, seed=seed)
    slope, _ = gradient_noise.fit_loglog(bs, v)
    assert -1.1 < slope < -0.9


def test_fit_loglog_recovers_a_power_law():
    b = np.array([1, 4, 16, 64])
    slope, intercept = gradient_noise.fit_loglog(b, 3.0 * b**-0.5)
    assert slope == pytest.approx(-0.5) and intercept == pytest.approx(np.log10(3.0))
    with pytest.raises(ValueError):
        gradient_noise.fit_loglog([1], [1])


def test_noise_scale_by_hand():
    g = np.array([[1.0, 0.0], [3.0, 0.0], [2.0, 2.0], [2.0, -2.0]])  # mean (2, 0), |G|^2 = 4
    # deviations: (-1,0) (1,0) (0,2) (0,-2): squared norms 1 1 4 4 -> mean 2.5
    assert gradient_noise.trace_covariance(g) == pytest.approx(2.5)
    assert gradient_noise.noise_scale(g) == pytest.approx(2.5 / 4)
    assert gradient_noise.noise_scale(torch.tensor(g)) == pytest.approx(2.5 / 4)


def test_noise_scale_grows_towards_the_minimum(problem):
    far = gradient_noise.noise_scale(toy.per_example_gradients(toy.START, problem.x, problem.y))
    near = gradient_noise.noise_scale(toy.per_example_gradients(problem.minimum + 0.05, problem.x, problem.y))
    assert 1 < far < near


def test_two_batch_estimator_is_exact_on_expectations():
    g2, trace = 4.0, 100.0
    out = gradient_noise.noise_scale_from_batches(g2 + trace / 8, g2 + trace / 64, 8, 64)
    assert out["g2"] == pytest.approx(g2) and out["trace"] == pytest.approx(trace)
    assert out["b_simple"] == pytest.approx(25.0)
    assert gradient_noise.noise_scale_from_batches(10.0, 0.5, 8, 64)["b_simple"] == float("inf")  # noise-dominated: g2 <= 0
    with pytest.raises(ValueError):
        gradient_noise.noise_scale_from_batches(1.0, 1.0, 64, 8)


def test_model_noise_scale_on_a_linear_model_matches_per_example_value():
    """A 1-D linear model in torch is the toy problem: the two-batch estimate must be close to exact."""
    p = toy.make_problem(n=4096, seed=2)
    theta = np.array([0.5, 0.5])
    exact = gradient_noise.noise_scale(toy.per_example_gradients(theta, p.x, p.y))
    model = nn.Linear(1, 1).double()
    with torch.no_grad():
        model.weight.fill_(theta[0])
        model.bias.fill_(theta[1])
    loss_fn = lambda out, y: 0.5 * ((out.squeeze(1) - y) ** 2).mean()  # noqa: E731
    x = torch.tensor(p.x).unsqueeze(1)
    y = torch.tensor(p.y)
    batches = [(x[i : i + 32], y[i : i + 32]) for i in range(0, 4096, 32)]
    out = gradient_noise.model_noise_scale(model, batches, loss_fn=loss_fn)
    assert out["b_small"] == 32 and out["b_big"] == 4096 and out["batches"] == 128
    assert out["b_simple"] == pytest.approx(exact, rel=0.35)
    assert all(q.grad is None for q in model.parameters()), "gradients must be cleared"
    with pytest.raises(ValueError):
        gradient_noise.model_noise_scale(model, batches[:1], loss_fn=loss_fn)


def test_the_step_saving_of_mccandlishs_model():
    assert gradient_noise.step_saving(0.0, 4, 256) == 1.0  # no noise: a larger batch saves no step
    assert gradient_noise.step_saving(1e9, 4, 16) == pytest.approx(4.0, rel=1e-6)  # far below B_noise: perfect scaling
    assert gradient_noise.step_saving(27.0, 4, 16) == pytest.approx((1 + 27 / 4) / (1 + 27 / 16))
    assert gradient_noise.step_saving(27.0, 4, 1e12) == pytest.approx(1 + 27 / 4)  # the ceiling, however large the batch
    assert gradient_noise.step_saving(float("inf"), 4, 16) == 4.0
    with pytest.raises(ValueError):
        gradient_noise.step_saving(-1.0, 4, 16)
