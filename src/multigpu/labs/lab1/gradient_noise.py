"""How noisy is a mini-batch gradient, and which batch size stops paying off?

A mini-batch gradient ``g_B`` is the mean of ``B`` per-example gradients, so it is an unbiased
estimate of the full gradient ``G`` whose variance falls as ``1 / B``:
``E |g_B - G|^2 = tr(Sigma) / B`` (examples drawn independently), where ``Sigma`` is the
covariance of the per-example gradients.

The *gradient noise scale* (McCandlish et al. 2018, "An Empirical Model of Large-Batch
Training") compares that noise with the signal: ``B_simple = tr(Sigma) / |G|^2``. Batches much
smaller than ``B_simple`` are noise-dominated (doubling the batch nearly halves the steps
needed); batches much larger waste compute (the gradient was already accurate). It is a first
estimate of the *critical batch size*, beyond which adding devices (a larger global batch)
stops buying fewer steps. It grows as training goes on, because ``|G|`` shrinks.

Two ways to estimate it here: exactly from per-example gradients (:func:`noise_scale`, the toy
problem of Lab 1), and from gradient norms at two batch sizes (:func:`noise_scale_from_batches`,
what a data-parallel job can measure for free: each worker's gradient is the small batch, the
all-reduced one the big batch; McCandlish et al., appendix A).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from multigpu.labs.lab1 import toy

GradFn = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]


def gradient_variance(
    theta: np.ndarray,
    x: np.ndarray,
    y: np.ndarray,
    batch_size: int,
    trials: int,
    rng: np.random.Generator,
    grad_fn: GradFn = toy.gradient,
) -> float:
    """Mean of ``|g_B - G|^2`` over ``trials`` random mini-batches of ``batch_size`` points.

    ``G`` is the full-data gradient at ``theta``; each ``g_B`` uses ``batch_size`` indices drawn
    uniformly at random with replacement (independent examples, so the expectation is exactly
    ``tr(Sigma) / batch_size``). ``grad_fn(theta, x, y)`` computes a mean gradient.
    """
    if batch_size < 1 or trials < 1:
        raise ValueError("batch_size and trials must be >= 1")
    full = grad_fn(theta, x, y)
    total = 0.0
    for _ in range(trials):
        idx = rng.integers(0, len(x), size=batch_size)
        diff = grad_fn(theta, x[idx], y[idx]) - full
        total += float(np.dot(diff, diff))
    return total / trials


def variance_curve(
    theta: np.ndarray,
    x: np.ndarray,
    y: np.ndarray,
    batch_sizes: Sequence[int],
    trials: int = 200,
    seed: int = 0,
    variance_fn: Callable[..., float] = gradient_variance,
) -> np.ndarray:
    """``variance_fn(theta, x, y, B, trials, rng)`` for every ``B`` of ``batch_sizes`` (one seeded rng)."""
    rng = np.random.default_rng(seed)
    return np.array([variance_fn(theta, x, y, int(b), trials, rng) for b in batch_sizes], dtype=float)


def fit_loglog(batch_sizes: Sequence[float], values: Sequence[float]) -> tuple[float, float]:
    """Least-squares line through ``(log10 B, log10 value)``: returns ``(slope, intercept)``.

    A variance that falls as ``1 / B`` has slope -1.
    """
    b = np.log10(np.asarray(batch_sizes, dtype=float))
    v = np.log10(np.asarray(values, dtype=float))
    if len(b) < 2 or len(b) != len(v):
        raise ValueError("need at least two (batch size, value) pairs of equal length")
    slope, intercept = np.polyfit(b, v, 1)
    return float(slope), float(intercept)


def trace_covariance(per_example_grads: np.ndarray | torch.Tensor) -> float:
    """``tr(Sigma)``: the summed variance of the per-example gradients (rows), ``mean |g_i - G|^2``."""
    g = np.asarray(per_example_grads, dtype=float).reshape(len(per_example_grads), -1)
    centred = g - g.mean(axis=0)
    return float(np.mean(np.sum(centred * centred, axis=1)))


def noise_scale(per_example_grads: np.ndarray | torch.Tensor) -> float:
    """The simple gradient noise scale ``B_simple = tr(Sigma) / |G|^2``.

    ``per_example_grads`` has one row per example (shape ``(n, parameters)``); ``G`` is their
    mean and ``tr(Sigma)`` the sum over parameters of their variance (:func:`trace_covariance`).
    """
    g = np.asarray(per_example_grads, dtype=float).reshape(len(per_example_grads), -1)
    mean = g.mean(axis=0)
    return trace_covariance(g) / float(np.dot(mean, mean))


def noise_scale_from_batches(sq_norm_small: float, sq_norm_big: float, b_small: float, b_big: float) -> dict[str, float]:
    """Unbiased ``|G|^2`` and ``tr(Sigma)`` from gradient norms at two batch sizes (McCandlish A.1).

    ``sq_norm_small`` is ``E |g_small|^2`` (e.g. averaged over the workers' own gradients),
    ``sq_norm_big`` is ``|g_big|^2`` (the all-reduced gradient). Uses
    ``E |g_B|^2 = |G|^2 + tr(Sigma) / B``. Returns ``{"g2", "trace", "b_simple"}``; with few
    samples ``g2`` can come out <= 0 (noise dominates), then ``b_simple`` is ``inf``.
    """
    if not b_big > b_small > 0:
        raise ValueError(f"need 0 < b_small < b_big, got {b_small}, {b_big}")
    g2 = (b_big * sq_norm_big - b_small * sq_norm_small) / (b_big - b_small)
    trace = (sq_norm_small - sq_norm_big) / (1.0 / b_small - 1.0 / b_big)
    b_simple = trace / g2 if g2 > 0 else float("inf")
    return {"g2": float(g2), "trace": float(trace), "b_simple": float(b_simple)}


def step_saving(b_noise: float, base_batch: float, batch: float) -> float:
    """How many times fewer steps ``batch`` needs than ``base_batch`` to reach the same loss, in
    McCandlish et al.'s model (from their trade-off ``(S / S_min - 1)(E / E_min - 1) = 1``): a batch
    ``B`` needs ``S_min (1 + B_noise / B)`` steps,
    so the saving is ``(1 + B_noise / base_batch) / (1 + B_noise / batch)``. It approaches
    ``batch / base_batch`` (perfect scaling) while both batches are far below ``B_noise``, and never
    exceeds ``1 + B_noise / base_batch``, however large the batch. An infinite ``B_noise`` (noise
    dominates every batch) is perfect scaling."""
    if b_noise < 0 or base_batch <= 0 or batch <= 0:
        raise ValueError(f"need b_noise >= 0 and positive batches, got {b_noise}, {base_batch}, {batch}")
    if np.isinf(b_noise):
        return batch / base_batch
    return (1 + b_noise / base_batch) / (1 + b_noise / batch)


def _flat_grad(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.detach().reshape(-1) for p in model.parameters() if p.grad is not None])


def model_noise_scale(
    model: nn.Module,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    device: torch.device | str = "cpu",
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
) -> dict[str, Any]:
    """Estimate ``B_simple`` of a real model from ``k`` equal-sized batches of ``b`` examples.

    Small batch: each batch's gradient (``E |g_small|^2`` averaged over the ``k``). Big batch: the
    mean of the ``k`` gradients, i.e. the gradient of all ``k * b`` examples, exactly what ``k``
    data-parallel workers would all-reduce. The model is put in eval mode while measuring (no
    dropout noise) and its gradients are cleared afterwards. Returns the result of
    :func:`noise_scale_from_batches` plus ``b_small``, ``b_big``, ``batches``.
    """
    loss_fn = loss_fn or nn.functional.cross_entropy
    was_training = model.training
    model.eval()
    total: torch.Tensor | None = None
    sq_small, k, b = 0.0, 0, None
    try:
        for images, labels in batches:
            if b is None:
                b = len(labels)
            elif len(labels) != b:
                raise ValueError("all batches must have the same size")
            model.zero_grad(set_to_none=True)
            loss_fn(model(images.to(device)), labels.to(device)).backward()
            g = _flat_grad(model).double()
            sq_small += float(g @ g)
            total = g.clone() if total is None else total + g
            k += 1
    finally:
        model.zero_grad(set_to_none=True)
        model.train(was_training)
    if k < 2 or total is None or b is None:
        raise ValueError("need at least two batches")
    big = total / k
    out: dict[str, Any] = noise_scale_from_batches(sq_small / k, float(big @ big), b, b * k)
    out.update(b_small=b, b_big=b * k, batches=k)
    return out
