"""The toy regression problem of Lab 1: loss, gradients, SGD epochs, convergence test."""

from __future__ import annotations

import numpy as np
import pytest

from multigpu.labs.lab1 import toy


@pytest.fixture(scope="module")
def problem() -> toy.ToyProblem:
    return toy.make_problem(n=500, seed=1)


def test_make_problem_is_seeded_and_near_its_line():
    a, b = toy.make_problem(n=300, seed=3), toy.make_problem(n=300, seed=3)
    assert np.array_equal(a.x, b.x) and np.array_equal(a.y, b.y)
    assert not np.array_equal(a.x, toy.make_problem(n=300, seed=4).x)
    assert np.allclose(toy.make_problem(n=20000, seed=0).minimum, [2.0, -1.0], atol=0.05)


def test_gradient_matches_finite_differences_and_per_example_mean(problem):
    theta = np.array([0.3, -0.7])
    g = toy.gradient(theta, problem.x, problem.y)
    eps = 1e-6
    fd = [
        (toy.loss(theta + eps * e, problem.x, problem.y) - toy.loss(theta - eps * e, problem.x, problem.y)) / (2 * eps)
        for e in np.eye(2)
    ]
    assert np.allclose(g, fd, rtol=1e-6)
    per = toy.per_example_gradients(theta, problem.x, problem.y)
    assert per.shape == (problem.n, 2)
    assert np.allclose(per.mean(axis=0), g)


def test_gradient_vanishes_at_the_least_squares_minimum(problem):
    assert np.allclose(toy.gradient(problem.minimum, problem.x, problem.y), 0, atol=1e-10)


def test_loss_grid_agrees_with_loss(problem):
    ws, bs = np.linspace(-1, 3, 5), np.linspace(-2, 2, 4)
    z = toy.loss_grid(ws, bs, problem.x, problem.y)
    assert z.shape == (4, 5)
    assert np.isclose(z[2, 3], toy.loss([ws[3], bs[2]], problem.x, problem.y))


@pytest.mark.parametrize("batch_size, steps", [(1, 500), (64, 8), (100, 5), (499, 2), (500, 1), (4096, 1)])
def test_sgd_epoch_takes_one_step_per_batch_including_the_uneven_last(problem, batch_size, steps):
    theta0 = np.array([0.0, 0.0])
    theta, path = toy.sgd_epoch(theta0, problem.x, problem.y, batch_size, 0.01, np.random.default_rng(0))
    assert path.shape == (steps + 1, 2)
    assert steps == toy.steps_per_epoch(problem.n, batch_size)
    assert np.array_equal(path[0], theta0) and np.array_equal(path[-1], theta)
    assert np.array_equal(theta0, [0.0, 0.0]), "the input must not be modified"


def test_sgd_epoch_uses_every_point_once_so_linear_steps_sum_to_a_full_gradient(problem):
    # With a tiny learning rate theta barely moves, so the sum of steps ~ lr * sum_k (B_k/B) * g_k.
    # With the last batch smaller the *mean* per batch is used: check against a manual run instead.
    rng_a, rng_b = np.random.default_rng(5), np.random.default_rng(5)
    theta, path = toy.sgd_epoch([1.0, 1.0], problem.x, problem.y, 96, 0.1, rng_a)
    order = rng_b.permutation(problem.n)
    t = np.array([1.0, 1.0])
    for s in range(0, problem.n, 96):
        i = order[s : s + 96]
        t = t - 0.1 * toy.gradient(t, problem.x[i], problem.y[i])
    assert np.allclose(theta, t)


def test_full_batch_epoch_equals_one_gd_step(problem):
    theta, _ = toy.sgd_epoch([0.5, 0.5], problem.x, problem.y, problem.n, 0.2, np.random.default_rng(0))
    assert np.allclose(theta, toy.gd([0.5, 0.5], problem.x, problem.y, 0.2, 1)[-1])


def test_gd_and_sgd_approach_the_minimum(problem):
    gd = toy.gd(toy.START, problem.x, problem.y, 0.3, 200)
    assert np.allclose(gd[-1], problem.minimum, atol=1e-3)
    sgd = toy.run_sgd(toy.START, problem.x, problem.y, 8, 0.05, 5, seed=0)
    assert len(sgd) == 1 + 5 * toy.steps_per_epoch(problem.n, 8)
    assert np.linalg.norm(sgd[-1] - problem.minimum) < 0.2


def test_relative_change_and_converged():
    assert toy.relative_change(2.0, 1.5) == pytest.approx(0.25)
    assert toy.relative_change(1.0, 1.0) == 0.0
    assert toy.relative_change(0.0, 1.0) == float("inf")
    assert toy.converged(1.0, 0.9999, tol=1e-3)
    assert not toy.converged(1.0, 0.99, tol=1e-3)
    assert not toy.converged(1.0, 1.01, tol=1e-3)
    assert not toy.converged(float("nan"), float("nan"), tol=1e-3)
    assert not toy.converged(1.0, float("inf"), tol=1e-3)


def test_train_until_converged_stops_early_and_reports(problem):
    r = toy.train_until_converged(toy.START, problem.x, problem.y, 32, 0.05, tol=1e-2, max_epochs=100)
    assert r["converged"] and r["epochs"] < 100
    assert len(r["losses"]) == r["epochs"] + 1
    assert r["steps"] == r["epochs"] * toy.steps_per_epoch(problem.n, 32)
    assert len(r["path"]) == r["steps"] + 1
    assert toy.relative_change(r["losses"][-2], r["losses"][-1]) < 1e-2
    never = toy.train_until_converged(toy.START, problem.x, problem.y, 32, 0.05, max_epochs=3,
                                      converged_fn=lambda a, b, t: False)
    assert not never["converged"] and never["epochs"] == 3


def test_path_extent_contains_everything():
    e = toy.path_extent([np.array([[0, 0], [1, 2]])], np.array([3.0, -1.0]), margin=0.5)
    assert e == (-0.5, 3.5, -1.5, 2.5)
