"""The plotting helpers draw what they are given (headless backend)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pytest

from multigpu.figures import plots
from multigpu.labs.lab1 import toy


@pytest.fixture(autouse=True)
def _close():
    yield
    plt.close("all")


@pytest.fixture(scope="module")
def problem():
    return toy.make_problem(n=300, seed=0)


def test_plot_paths_draws_every_path_and_the_minimum(problem):
    paths = {"GD": toy.gd(toy.START, problem.x, problem.y, 0.1, 5),
             "SGD": toy.run_sgd(toy.START, problem.x, problem.y, 30, 0.1, 1)}
    ax = plots.plot_paths(problem, paths, title="t")
    labels = [line.get_label() for line in ax.get_lines()]
    assert "minimum" in labels
    assert any(lbl.startswith("GD (5 steps)") for lbl in labels)
    assert any(lbl.startswith("SGD (10 steps)") for lbl in labels)
    w0, w1 = ax.get_xlim()
    assert w0 <= toy.START[0] <= w1 and w0 <= problem.minimum[0] <= w1
    assert ax.get_title() == "t"


def test_plot_variance_draws_points_fit_and_reference():
    b = [1, 2, 4, 8]
    ax = plots.plot_variance(b, [8.0, 4.0, 2.0, 1.0], slope=-1.0, intercept=np.log10(8.0))
    lines = ax.get_lines()
    assert len(lines) == 3 and ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert np.allclose(lines[1].get_ydata(), [8, 4, 2, 1])
    assert "slope -1.00" in lines[1].get_label()


def test_plot_batch_sweep_two_panels_with_extra_point():
    rows = [{"batch_size": b, "images_per_s": 100.0 * i, "val_acc": 0.9 - 0.1 * i} for i, b in enumerate([16, 64, 256], 1)]
    axes = plots.plot_batch_sweep(rows, extra={"scaled": {"batch_size": 256, "val_acc": 0.85}})
    assert len(axes) == 2
    assert np.allclose(axes[0].get_lines()[0].get_ydata(), [100, 200, 300])
    assert np.allclose(axes[1].get_lines()[0].get_ydata(), [80, 70, 60])
    assert [ln.get_label() for ln in axes[1].get_lines()][-1] == "scaled"


def test_plot_histories_schedule_and_losses():
    ax = plots.plot_histories({"a": {"val_acc": [0.1, 0.5]}, "b": {"val_acc": [0.2, 0.3]}})
    assert np.allclose(ax.get_lines()[0].get_ydata(), [10, 50])
    ax = plots.plot_schedule({"ramp": lambda e: 0.1 * min(e, 1.0)}, epochs=2, points=5)
    assert np.allclose(ax.get_lines()[0].get_ydata(), [0, 0.05, 0.1, 0.1, 0.1])
    ax = plots.plot_losses({"x": [3.0, 2.0, 1.0]})
    assert ax.get_yscale() == "log" and len(ax.get_lines()) == 1


def test_path_explorer_redraws_with_the_given_epoch_function(problem, monkeypatch):
    pytest.importorskip("ipywidgets")
    calls = []
    assert plots.path_explorer(problem, batch_sizes=(4, 16, 64), epochs=1) is None  # headless: one static drawing
    monkeypatch.setattr("multigpu.core.notebook.in_jupyter", lambda: True)  # a JupyterLab kernel: the sliders

    def epoch_fn(theta, x, y, batch_size, lr, rng):
        calls.append((batch_size, lr))
        return toy.sgd_epoch(theta, x, y, batch_size, lr, rng)

    w = plots.path_explorer(problem, epoch_fn, batch_sizes=(4, 16, 64), epochs=1)
    assert {c.description for c in w.children[:2]} == {"batch", "lr"}
    assert calls and calls[-1][0] == 64, "the first draw uses the third batch size"
    w.children[0].value = 4
    w.update()  # a kernel does this on every slider move
    assert calls[-1][0] == 4
