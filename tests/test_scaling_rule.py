"""multigpu.labs.lab1.scaling_rule: Lab 1's large-batch experiment (the linear scaling rule and LARS)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

from multigpu.core import schedules
from multigpu.figures import plots
from multigpu.labs.lab1 import large_batch, scaling_rule


def test_the_small_network_takes_shrunk_images_and_has_five_adapted_layers():
    images = torch.randn(6, 3, 64, 64)
    small = scaling_rule.shrink(TensorDataset(images, torch.arange(6)), 16)
    assert small.tensors[0].shape == (6, 3, 16, 16)
    assert torch.allclose(small.tensors[0][0, 0, 0, 0], images[0, 0, :4, :4].mean(), atol=1e-6)  # 4x4 averages
    model = scaling_rule.build_model(scaling_rule.Setup(), seed=0)
    assert model(small.tensors[0]).shape == (6, 10)
    assert sum(large_batch.adapted(p) for p in model.parameters()) == 5
    again = scaling_rule.build_model(scaling_rule.Setup(), seed=0)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), again.parameters()))  # the seed fixes it
    with pytest.raises(ValueError):
        scaling_rule.Setup(side=12)


def test_the_plan_runs_every_factor_at_both_rates_on_every_seed_and_lars_at_the_largest_batch():
    setup = scaling_rule.Setup(base_batch=2, factors=(4, 32), seeds=(5, 6))
    keys = scaling_rule.plan(setup)
    assert len(keys) == len(set(keys)) == 2 * (1 + 2 * 2 + 1)
    assert ("unchanged", 2, 5) in keys and ("scaled", 8, 6) in keys and ("unchanged", 64, 5) in keys
    assert [k for k in keys if k[0] == "lars"] == [("lars", 64, 5), ("lars", 64, 6)]
    assert not any(k[0] == "lars" for k in scaling_rule.plan(dataclasses.replace(setup, lars=False)))


def fake(setup, acc):
    """Results holding the accuracies ``acc[kind, factor]`` (one per seed)."""
    out = scaling_rule.Results(setup, eta=0.01)
    for (kind, factor), values in acc.items():
        for seed, v in zip(setup.seeds, values):
            out.runs[kind, setup.batch(factor), seed] = {"val_acc": v, "train_loss": 1.0}
    return out


def test_compare_says_what_the_numbers_say():
    setup = scaling_rule.Setup(factors=(4, 64), seeds=(0, 1, 2))
    works = fake(setup, {("unchanged", 1): [0.60, 0.62, 0.64], ("unchanged", 4): [0.20, 0.25, 0.30],
                         ("scaled", 4): [0.55, 0.58, 0.61], ("unchanged", 64): [0.10, 0.10, 0.10],
                         ("scaled", 64): [0.10, 0.12, 0.14], ("lars", 64): [0.20, 0.24, 0.28]})
    verdict = scaling_rule.compare(works)
    four, far = verdict["factors"][4], verdict["factors"][64]
    assert four["scaled_beyond_spread"] and four["won_fraction"] == pytest.approx((0.58 - 0.25) / (0.62 - 0.25))
    assert far["short_beyond_spread"] and far["won_fraction"] == pytest.approx(0.02 / 0.52)
    assert verdict["lars"]["beyond_spread"] and verdict["lars"]["over_scaled"] == pytest.approx(0.12)
    text = "\n".join(verdict["lines"])
    assert "every seed's scaled run beat every seed's unchanged one" in text and "89% of the 37.0 points" in text
    assert "above the scaled rate on every seed" in text
    overlap = fake(setup, {("unchanged", 1): [0.60, 0.62, 0.64], ("unchanged", 4): [0.20, 0.25, 0.56],
                           ("scaled", 4): [0.55, 0.58, 0.61], ("unchanged", 64): [0.1] * 3,
                           ("scaled", 64): [0.10, 0.30, 0.14], ("lars", 64): [0.20, 0.24, 0.28]})
    verdict = scaling_rule.compare(overlap)
    assert not verdict["factors"][4]["scaled_beyond_spread"] and not verdict["lars"]["beyond_spread"]
    assert "no clear win" in verdict["lines"][1] and "the ranges overlap" in verdict["lines"][-1]


def test_the_plot_draws_each_seed_and_the_means():
    import matplotlib

    matplotlib.use("Agg")
    setup = scaling_rule.Setup(factors=(4, 64), seeds=(0, 1))
    results = fake(setup, {("unchanged", 1): [0.6, 0.62], ("unchanged", 4): [0.2, 0.25], ("scaled", 4): [0.55, 0.58],
                           ("unchanged", 64): [0.1, 0.1], ("scaled", 64): [0.1, 0.12], ("lars", 64): [0.2, 0.24]})
    ax = plots.plot_scaling_rule(results)
    labels = [line.get_label() for line in ax.get_lines() if not line.get_label().startswith("_")]
    assert labels == ["unchanged lr", "scaled lr + warm-up", "LARS"]
    means = {line.get_label(): line.get_ydata().tolist() for line in ax.get_lines()}
    assert means["scaled lr + warm-up"] == pytest.approx([61.0, 56.5, 11.0])
    assert means["LARS"] == pytest.approx([61.0, 22.0])


@pytest.mark.slow
def test_the_rule_wins_at_4x_fails_far_past_the_noise_scale_and_lars_beats_it_there():
    """The lab's experiment on two seeds: the ordering the lab's text states, with margins."""
    setup = dataclasses.replace(scaling_rule.Setup(), seeds=(0, 1))
    train_set, val_set = scaling_rule.images(3200, 500, setup.side)
    torch.set_num_threads(1)
    results = scaling_rule.run_all(train_set, val_set, setup, lr_at=schedules.lr_at, show_progress=False)
    verdict = scaling_rule.compare(results)
    base = np.mean(verdict["base"])
    four, far = verdict["factors"][4], verdict["factors"][64]
    # 4x: the unchanged rate falls behind, the scaled rate wins most of it back on every seed
    assert four["lost"] > 0.1 and four["scaled_beyond_spread"] and four["won_fraction"] > 0.6, verdict["lines"]
    # 64x: the scaled rate stays far below the baseline on every seed
    assert far["short_beyond_spread"] and np.mean(far["scaled"]) < base - 0.2, verdict["lines"]
    # LARS: above the scaled rate on every seed, below the baseline
    assert verdict["lars"]["beyond_spread"] and verdict["lars"]["over_scaled"] > 0.05, verdict["lines"]
    assert scaling_rule.beyond_spread(verdict["lars"]["lars"], verdict["base"]), verdict["lines"]
    noise = scaling_rule.noise_scale(results.runs["unchanged", setup.base_batch, 0]["model"], train_set)
    assert 4 * setup.base_batch < noise["b_simple"] < setup.far, noise  # 4x below the noise scale, 64x past it
