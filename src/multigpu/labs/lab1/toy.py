"""A regression problem small enough to see: fit a line ``y = w x + b`` to noisy points.

The parameters are ``theta = (w, b)``, so the loss is a surface over a plane and every
optimiser's path can be drawn on its contours (Lab 1). Everything is NumPy, float64 and
seeded, so the paths are reproducible.

Loss: ``L(theta) = mean_i 0.5 * (w x_i + b - y_i) ** 2``. Its gradient is the mean of the
per-example gradients ``g_i = (w x_i + b - y_i) * (x_i, 1)``: full-batch gradient descent (GD)
uses all of them for each step, mini-batch SGD the mean over ``batch_size`` of them.
The inputs ``x`` are not centred (mean 1 by default), so ``w`` and ``b`` are correlated and the
contours are tilted ellipses, which makes the zig-zag of noisy steps easy to see.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

#: ``epoch_fn(theta, x, y, batch_size, lr, rng) -> (theta, path)``: one pass over the data.
EpochFn = Callable[[np.ndarray, np.ndarray, np.ndarray, int, float, np.random.Generator], tuple[np.ndarray, np.ndarray]]
#: ``converged_fn(previous_loss, loss, tol) -> bool``.
ConvergedFn = Callable[[float, float, float], bool]

#: Where the paths in Lab 1 start: far enough from the minimum that the paths are long.
START = np.array([-1.0, 3.0])


@dataclass(frozen=True)
class ToyProblem:
    """Noisy points on a line: inputs ``x``, targets ``y`` and the line they came from."""

    x: np.ndarray
    y: np.ndarray
    true_w: float
    true_b: float
    noise: float

    @property
    def n(self) -> int:
        """Number of points."""
        return len(self.x)

    @property
    def minimum(self) -> np.ndarray:
        """The least-squares ``(w, b)``: where the loss surface is lowest."""
        return least_squares(self.x, self.y)


def make_problem(
    n: int = 2000,
    *,
    w: float = 2.0,
    b: float = -1.0,
    noise: float = 1.0,
    x_mean: float = 1.0,
    x_std: float = 1.0,
    seed: int = 0,
) -> ToyProblem:
    """``n`` points ``y = w x + b + noise * N(0, 1)`` with ``x ~ N(x_mean, x_std**2)``."""
    if n < 2:
        raise ValueError(f"need at least 2 points, got n={n}")
    rng = np.random.default_rng(seed)
    x = rng.normal(x_mean, x_std, size=n)
    y = w * x + b + noise * rng.normal(size=n)
    return ToyProblem(x=x, y=y, true_w=float(w), true_b=float(b), noise=float(noise))


def least_squares(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The exact minimiser ``(w, b)`` of the loss (ordinary least squares)."""
    a = np.stack([x, np.ones_like(x)], axis=1)
    return np.linalg.lstsq(a, y, rcond=None)[0]


def residuals(theta: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``w x_i + b - y_i`` for every point."""
    return theta[0] * x + theta[1] - y


def loss(theta: np.ndarray, x: np.ndarray, y: np.ndarray) -> float:
    """Mean squared error / 2 of the line ``theta = (w, b)`` on the points ``(x, y)``."""
    r = residuals(np.asarray(theta, dtype=float), x, y)
    return float(0.5 * np.mean(r * r))


def loss_grid(ws: np.ndarray, bs: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The loss at every ``(w, b)`` of the grid ``meshgrid(ws, bs)``; shape ``(len(bs), len(ws))``.

    Uses the sufficient statistics of the data, so a 200x200 grid over a million points is cheap.
    """
    w, b = np.meshgrid(np.asarray(ws, dtype=float), np.asarray(bs, dtype=float))
    sxx, sx, sxy, sy, syy = (np.mean(v) for v in (x * x, x, x * y, y, y * y))
    return 0.5 * (w * w * sxx + 2 * w * b * sx + b * b - 2 * w * sxy - 2 * b * sy + syy)


def per_example_gradients(theta: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The gradient of each point's loss, shape ``(n, 2)``: ``(r_i x_i, r_i)``."""
    r = residuals(np.asarray(theta, dtype=float), x, y)
    return np.stack([r * x, r], axis=1)


def gradient(theta: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The gradient of :func:`loss` at ``theta`` (the mean of the per-example gradients)."""
    r = residuals(np.asarray(theta, dtype=float), x, y)
    return np.array([np.mean(r * x), np.mean(r)])


def sgd_epoch(
    theta: np.ndarray, x: np.ndarray, y: np.ndarray, batch_size: int, lr: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """One epoch of mini-batch SGD: shuffle, then one step per batch of ``batch_size`` points.

    Every point is used exactly once. When ``batch_size`` does not divide ``n`` the last batch
    is smaller (its gradient is still a mean, so it has the same scale). ``batch_size >= n`` is
    one full-batch GD step. Returns the final ``theta`` and the path: an array of shape
    ``(steps + 1, 2)`` that starts with the initial ``theta``. ``theta`` is not modified.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    theta = np.array(theta, dtype=float)
    order = rng.permutation(len(x))
    path = [theta.copy()]
    for start in range(0, len(x), batch_size):
        idx = order[start : start + batch_size]
        theta = theta - lr * gradient(theta, x[idx], y[idx])
        path.append(theta.copy())
    return theta, np.array(path)


def steps_per_epoch(n: int, batch_size: int) -> int:
    """Optimizer steps in one epoch: ``ceil(n / batch_size)``, the uneven last batch included."""
    return -(-n // batch_size)


def gd(theta: np.ndarray, x: np.ndarray, y: np.ndarray, lr: float, steps: int) -> np.ndarray:
    """Full-batch gradient descent for ``steps`` steps; returns the path, shape ``(steps + 1, 2)``."""
    theta = np.array(theta, dtype=float)
    path = [theta.copy()]
    for _ in range(steps):
        theta = theta - lr * gradient(theta, x, y)
        path.append(theta.copy())
    return np.array(path)


def run_sgd(
    theta: np.ndarray,
    x: np.ndarray,
    y: np.ndarray,
    batch_size: int,
    lr: float,
    epochs: int,
    *,
    seed: int = 0,
    epoch_fn: EpochFn = sgd_epoch,
) -> np.ndarray:
    """``epochs`` epochs of ``epoch_fn`` (default :func:`sgd_epoch`); returns the whole path."""
    rng = np.random.default_rng(seed)
    theta = np.array(theta, dtype=float)
    parts = [theta[None, :]]
    for _ in range(epochs):
        theta, path = epoch_fn(theta, x, y, batch_size, lr, rng)
        parts.append(np.asarray(path)[1:])
    return np.concatenate(parts)


def relative_change(previous: float, current: float) -> float:
    """``|previous - current| / |previous|`` (``inf`` when ``previous`` is 0 and they differ)."""
    if previous == current:
        return 0.0
    if previous == 0:
        return float("inf")
    return abs(previous - current) / abs(previous)


def converged(previous_loss: float, loss_value: float, tol: float = 1e-3) -> bool:
    """The convergence test of Lab 1: the relative change of the loss is below ``tol``.

    A non-finite loss (the run diverged) never counts as converged.
    """
    if not (np.isfinite(previous_loss) and np.isfinite(loss_value)):
        return False
    return relative_change(previous_loss, loss_value) < tol


def train_until_converged(
    theta: np.ndarray,
    x: np.ndarray,
    y: np.ndarray,
    batch_size: int,
    lr: float,
    *,
    tol: float = 1e-3,
    max_epochs: int = 100,
    seed: int = 0,
    epoch_fn: EpochFn = sgd_epoch,
    converged_fn: ConvergedFn = converged,
) -> dict[str, Any]:
    """Run epochs until ``converged_fn(loss before, loss after, tol)`` or ``max_epochs``.

    Returns ``{"theta", "path", "losses", "epochs", "steps", "converged"}``: ``losses`` has the
    full-data loss at the start and after every epoch, ``steps`` counts optimizer steps.
    """
    rng = np.random.default_rng(seed)
    theta = np.array(theta, dtype=float)
    losses = [loss(theta, x, y)]
    parts = [theta[None, :]]
    steps, done = 0, False
    epochs = 0
    for epochs in range(1, max_epochs + 1):
        theta, path = epoch_fn(theta, x, y, batch_size, lr, rng)
        path = np.asarray(path)
        parts.append(path[1:])
        steps += len(path) - 1
        losses.append(loss(theta, x, y))
        if converged_fn(losses[-2], losses[-1], tol):
            done = True
            break
        if not np.isfinite(losses[-1]):
            break
    return {
        "theta": theta,
        "path": np.concatenate(parts),
        "losses": np.array(losses),
        "epochs": epochs,
        "steps": steps,
        "converged": done,
    }


def path_extent(paths: list[np.ndarray], minimum: np.ndarray, margin: float = 0.5) -> tuple[float, float, float, float]:
    """``(w_min, w_max, b_min, b_max)`` that holds every path and the minimum, plus a margin."""
    pts = np.concatenate([np.asarray(p).reshape(-1, 2) for p in paths] + [np.asarray(minimum).reshape(1, 2)])
    pts = pts[np.all(np.isfinite(pts), axis=1)]
    lo, hi = pts.min(axis=0) - margin, pts.max(axis=0) + margin
    return float(lo[0]), float(hi[0]), float(lo[1]), float(hi[1])
