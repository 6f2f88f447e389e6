"""The figures of the course (matplotlib) and the widgets that redraw them (ipywidgets).

Every function draws on an ``ax`` you pass (or a new figure) and returns the axes, so a
notebook cell stays one line and tests can check what was drawn.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib.pyplot as plt
import numpy as np

from multigpu.labs.lab1 import toy


def _axes(ax: Any = None, figsize: tuple[float, float] = (6, 4.5)) -> Any:
    if ax is None:
        _, ax = plt.subplots(figsize=figsize)
    return ax


def plot_loss_surface(
    problem: toy.ToyProblem,
    extent: tuple[float, float, float, float],
    ax: Any = None,
    levels: int = 18,
    resolution: int = 150,
) -> Any:
    """Contours of the toy loss over ``extent = (w_min, w_max, b_min, b_max)``, minimum marked.

    Levels are spaced geometrically above the minimum loss, so the flat valley floor shows too.
    """
    ax = _axes(ax)
    ws = np.linspace(extent[0], extent[1], resolution)
    bs = np.linspace(extent[2], extent[3], resolution)
    z = toy.loss_grid(ws, bs, problem.x, problem.y)
    best = toy.loss(problem.minimum, problem.x, problem.y)
    top = float(z.max())
    lv = best + np.geomspace(1e-3 * max(top - best, 1e-12), top - best, levels)
    ax.contour(ws, bs, z, levels=lv, colors="0.6", linewidths=0.7)
    m = problem.minimum
    ax.plot(m[0], m[1], marker="*", color="k", markersize=14, linestyle="none", label="minimum")
    ax.set_xlabel("w (slope)")
    ax.set_ylabel("b (intercept)")
    ax.set_xlim(extent[0], extent[1])
    ax.set_ylim(extent[2], extent[3])
    return ax


def plot_paths(
    problem: toy.ToyProblem,
    paths: Mapping[str, np.ndarray],
    ax: Any = None,
    extent: tuple[float, float, float, float] | None = None,
    title: str | None = None,
) -> Any:
    """Optimiser paths (label -> array of ``(w, b)`` rows) on the loss contours."""
    ax = _axes(ax)
    arrays = {k: np.asarray(v, dtype=float).reshape(-1, 2) for k, v in paths.items()}
    extent = extent or toy.path_extent(list(arrays.values()), problem.minimum)
    plot_loss_surface(problem, extent, ax=ax)
    for label, p in arrays.items():
        many = len(p) > 60
        ax.plot(p[:, 0], p[:, 1], marker="" if many else ".", linewidth=0.8 if many else 1.4, alpha=0.85,
                label=f"{label} ({len(p) - 1} steps)")
    if arrays:
        first = next(iter(arrays.values()))[0]
        ax.plot(first[0], first[1], marker="o", color="k", markersize=6, linestyle="none")
    ax.legend(fontsize=8, loc="best")
    if title:
        ax.set_title(title)
    return ax


def plot_losses(curves: Mapping[str, Sequence[float]], ax: Any = None, xlabel: str = "epoch", logy: bool = True) -> Any:
    """Loss curves (label -> values), log scale by default."""
    ax = _axes(ax)
    for label, values in curves.items():
        ax.plot(np.arange(len(values)), values, marker=".", label=label)
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("loss")
    ax.legend(fontsize=8)
    return ax


def plot_variance(
    batch_sizes: Sequence[float],
    variances: Sequence[float],
    slope: float | None = None,
    intercept: float | None = None,
    ax: Any = None,
) -> Any:
    """Mini-batch gradient variance against batch size on log-log axes, with the fitted line."""
    ax = _axes(ax)
    b = np.asarray(batch_sizes, dtype=float)
    v = np.asarray(variances, dtype=float)
    ax.loglog(b, v, "o", label="measured")
    if slope is not None and intercept is not None:
        ax.loglog(b, 10 ** (intercept + slope * np.log10(b)), "-", label=f"fit: slope {slope:.2f}")
    ax.loglog(b, v[0] * b[0] / b, ":", color="0.5", label="1/B")
    ax.set_xlabel("batch size B")
    ax.set_ylabel("E |g_B - G|^2")
    ax.legend(fontsize=8)
    return ax


def plot_batch_sweep(
    results: Sequence[Mapping[str, Any]],
    extra: Mapping[str, Mapping[str, Any]] | None = None,
    axes: Any = None,
    colours: Mapping[str, Any] | None = None,
) -> Any:
    """Two panels against batch size: throughput (images/s) and final validation accuracy.

    ``results``: one dict per batch size with keys ``batch_size``, ``images_per_s``, ``val_acc``
    (as the Lab 1 sweep records them). ``extra``: label -> such a dict, drawn as single
    highlighted points (e.g. the large batch re-run with a scaled learning rate). ``colours``:
    label -> colour, so a series keeps its colour across the panels of a figure.
    """
    colours = colours or {}
    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(11, 4))
    bs = [r["batch_size"] for r in results]
    axes[0].plot(bs, [r["images_per_s"] for r in results], "o-")
    axes[0].set_ylabel("images / s")
    axes[0].set_title("throughput")
    axes[1].plot(bs, [100 * r["val_acc"] for r in results], "o-", label="same learning rate")
    axes[1].set_ylabel("validation accuracy (%)")
    axes[1].set_title("accuracy after a fixed number of epochs")
    for label, r in (extra or {}).items():
        axes[1].plot([r["batch_size"]], [100 * r["val_acc"]], marker="*", markersize=14, linestyle="none", label=label,
                     color=colours.get(label))
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch size")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8)
    return axes


def plot_histories(histories: Mapping[str, Mapping[str, Any]], key: str = "val_acc", ax: Any = None,
                   colours: Mapping[str, Any] | None = None) -> Any:
    """One curve per run (label -> history dict from :func:`multigpu.core.training.train`) of ``key`` per epoch
    (``colours``: label -> colour, as in :func:`plot_batch_sweep`)."""
    ax = _axes(ax)
    for label, h in histories.items():
        values = np.asarray(h[key], dtype=float)
        scale = 100 if key.endswith("acc") else 1
        ax.plot(np.arange(1, len(values) + 1), scale * values, "o-", label=label, color=(colours or {}).get(label))
    ax.set_xlabel("epoch")
    ax.set_ylabel(key.replace("_", " ") + (" (%)" if key.endswith("acc") else ""))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return ax


def plot_schedule(schedules: Mapping[str, Any], epochs: float, ax: Any = None, points: int = 200) -> Any:
    """Learning rate against (fractional) epoch for each schedule (label -> ``epoch -> lr``)."""
    ax = _axes(ax, figsize=(6, 3.5))
    e = np.linspace(0, epochs, points)
    for label, fn in schedules.items():
        ax.plot(e, [fn(float(t)) for t in e], label=label)
    ax.set_xlabel("epoch")
    ax.set_ylabel("learning rate")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return ax


def path_explorer(
    problem: toy.ToyProblem,
    epoch_fn: toy.EpochFn = toy.sgd_epoch,
    *,
    theta0: np.ndarray = toy.START,
    batch_sizes: Sequence[int] = (1, 4, 16, 64, 256, 2000),
    lr: tuple[float, float, float, float] = (0.01, 0.5, 0.01, 0.1),
    epochs: int = 2,
    seed: int = 0,
) -> Any:
    """Sliders for batch size and learning rate that redraw SGD's path (``epoch_fn``) against GD's.

    ``lr = (min, max, step, value)``. GD gets the same number of steps as SGD takes in
    ``epochs`` epochs (capped at 500 so the slider stays responsive). Returns the
    ``ipywidgets.interactive`` object (display it as the last line of a cell). Where nobody can
    move a slider (papermill, nbgrader: :func:`multigpu.core.notebook.in_jupyter` is False) it draws the
    default path once and returns None: a widget there only adds comm traffic, and a papermill
    run of Lab 1 on a busy machine waited forever on this cell.
    """
    import ipywidgets as widgets

    from multigpu.core.notebook import in_jupyter

    extent = toy.path_extent([np.asarray(theta0).reshape(1, 2)], problem.minimum, margin=1.0)

    def draw(batch_size: int, learning_rate: float) -> None:
        sgd = toy.run_sgd(theta0, problem.x, problem.y, batch_size, learning_rate, epochs, seed=seed, epoch_fn=epoch_fn)
        steps = min(len(sgd) - 1, 500)
        full = toy.gd(theta0, problem.x, problem.y, learning_rate, steps)
        ax = plot_paths(problem, {"GD": full, f"SGD, B={batch_size}": sgd}, extent=extent,
                        title=f"{epochs} epochs, lr={learning_rate:.2f}")
        final = toy.loss(sgd[-1], problem.x, problem.y)
        ax.text(0.02, 0.02, f"SGD final loss {final:.4f}", transform=ax.transAxes, fontsize=8)
        plt.show()

    if not in_jupyter():
        draw(list(batch_sizes)[2], lr[3])
        return None
    return widgets.interactive(
        draw,
        batch_size=widgets.SelectionSlider(options=list(batch_sizes), value=list(batch_sizes)[2], description="batch"),
        learning_rate=widgets.FloatSlider(min=lr[0], max=lr[1], step=lr[2], value=lr[3], description="lr"),
    )


def plot_scaling_rule(results: Any, ax: Any = None) -> Any:
    """Validation accuracy against batch size for a :class:`multigpu.labs.lab1.scaling_rule.Results`: each
    seed a dot, the mean over the seeds a line, one colour per kind of run (unchanged rate, scaled
    rate with warm-up, LARS); the baseline's range over the seeds as a band."""
    ax = _axes(ax)
    s = results.setup
    _, lo, hi = results.spread("unchanged", s.base_batch)
    ax.axhspan(100 * lo, 100 * hi, color="grey", alpha=0.2, label=f"baseline (batch {s.base_batch}), min-max")
    names = {"unchanged": "unchanged lr", "scaled": "scaled lr + warm-up", "lars": "LARS"}
    for k, (kind, name) in enumerate(names.items()):
        batches = [b for b in [s.base_batch] + [s.batch(f) for f in s.factors]
                   if all((kind if b != s.base_batch else "unchanged", b, seed) in results.runs for seed in s.seeds)]
        if not any(b != s.base_batch for b in batches):
            continue
        means = []
        for b in batches:
            values = 100 * np.asarray(results.values(kind if b != s.base_batch else "unchanged", b))
            ax.plot([b] * len(values), values, "o", color=f"C{k}", alpha=0.6)
            means.append(values.mean())
        ax.plot(batches, means, "-", color=f"C{k}", label=name)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size")
    ax.set_ylabel("validation accuracy (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return ax
