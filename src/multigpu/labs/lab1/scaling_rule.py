"""Lab 1, parts 4 and 5: the linear scaling rule where it works, where it fails, and LARS there.

The rule (Goyal et al. 2017: multiply the learning rate by ``k`` when the batch grows ``k``
times, and warm up to it) holds while the batch stays below the critical batch size, of which
the gradient noise scale ``B_simple`` is a first estimate (McCandlish et al. 2018): there a
learning rate ``k`` times larger makes one step do the work of ``k``. Past it the rate the rule
asks for is beyond the largest one training survives, and no rate makes ``k`` times fewer steps
do the same work. LARS (You et al. 2017) bounds how far each layer moves per step, so the large
rate no longer blows training up; it does not add steps.

Seeing both sides on a CPU in a few minutes needs a base batch well below the noise scale and
thousands of steps, several seeds each: AlexNet at a batch of 4 is far too slow for that. The
experiment therefore trains :class:`SmallConvNet` (three convolutions without BatchNorm, two
fully-connected layers, the shape LARS was made for) on the course's images shrunk to 16x16
(:func:`shrink`), through the course's one training loop (:func:`multigpu.core.training.train`).

:func:`plan` lists the runs of a :class:`Setup`, :func:`run_all` trains them, and :func:`compare`
turns the results into the figures and sentences the lab prints (means, min-max over the seeds,
what the scaled rate and LARS won back).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from torch import nn
from torch.utils.data import TensorDataset

from multigpu.core import data
from multigpu.core.notebook import progress as _progress
from multigpu.core.training import make_optimizer, train
from multigpu.labs.lab1 import batching, gradient_noise, large_batch

#: One run's key: (kind, batch size, seed), kind one of :data:`KINDS`.
Key = tuple[str, int, int]
#: The unchanged rate, the scaled rate with warm-up (linear scaling), and LARS on that schedule.
KINDS = ("unchanged", "scaled", "lars")
#: A learning-rate rule: (epoch, base_lr, batch_size, base_batch_size, warmup_epochs) -> lr.
LrAt = Callable[[float, float, int, int, float], float]


@dataclass(frozen=True)
class Setup:
    """The experiment's knobs (the lab's parameters cell sets them).

    ``factors`` are the batch growths tried (the batch is ``factor x base_batch``); the last one
    is meant to be far past the critical batch, and LARS runs there. ``eta`` is LARS's trust
    coefficient; ``None`` measures it (:func:`measured_eta`).
    """

    side: int = 16
    width: int = 16
    base_batch: int = 4
    base_lr: float = 0.002
    epochs: int = 3
    warmup_epochs: float = 0.5
    factors: tuple[int, ...] = (4, 64)
    seeds: tuple[int, ...] = (0, 1, 2)
    eta: float | None = None
    lars: bool = True

    def __post_init__(self) -> None:
        if self.base_batch < 1 or self.base_lr <= 0 or self.epochs < 1 or not self.factors or not self.seeds:
            raise ValueError(f"a setup needs a positive batch, rate and epochs, factors and seeds: {self}")
        if self.side < 8 or self.side % 8:
            raise ValueError(f"side must be a multiple of 8 (three 2x2 poolings), got {self.side}")

    @property
    def far(self) -> int:
        """The largest batch tried: where the rule is meant to fail and LARS runs."""
        return max(self.factors) * self.base_batch

    def batch(self, factor: int) -> int:
        return factor * self.base_batch


class SmallConvNet(nn.Module):
    """Three 3x3 convolutions (``width``, ``2 width``, ``2 width`` channels, each followed by ReLU
    and a 2x2 max-pool), then FC 128 and FC ``num_classes``; no BatchNorm, PyTorch's default
    initialisation."""

    def __init__(self, side: int = 16, width: int = 16, num_classes: int = 10) -> None:
        super().__init__()
        w = width
        self.features = nn.Sequential(
            nn.Conv2d(3, w, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2),
            nn.Conv2d(w, 2 * w, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2),
            nn.Conv2d(2 * w, 2 * w, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(2 * w * (side // 8) ** 2, 128), nn.ReLU(inplace=True), nn.Linear(128, num_classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def build_model(setup: Setup, seed: int, num_classes: int = 10) -> SmallConvNet:
    """A fresh :class:`SmallConvNet`, its weights drawn from ``seed``."""
    torch.manual_seed(seed)
    return SmallConvNet(setup.side, setup.width, num_classes)


def shrink(dataset: TensorDataset, side: int) -> TensorDataset:
    """The images of an in-memory data set (:func:`multigpu.labs.lab1.batching.in_memory`) averaged down to
    ``side x side`` pixels, labels unchanged."""
    images, labels = dataset.tensors
    small = nn.functional.adaptive_avg_pool2d(images.float(), side)
    out = TensorDataset(small.contiguous(), labels)
    if hasattr(dataset, "classes"):
        out.classes = list(dataset.classes)  # type: ignore[attr-defined]
    return out


def images(train: int, val: int, side: int, seed: int = 0, root: str | Path | None = None) -> tuple[TensorDataset, TensorDataset]:
    """Class-balanced training and validation sets of the course's images (``root``: the generated
    default), decoded once and shrunk to ``side x side``."""
    root = root or data.ensure_dataset(progress=False)
    sets = [batching.in_memory(data.JPEGFolder(root, data.val_transform(), split=split), n, seed=seed)
            for split, n in (("train", train), ("val", val))]
    return shrink(sets[0], side), shrink(sets[1], side)


def plan(setup: Setup) -> list[Key]:
    """Every run of the experiment, seed by seed: the base batch, then for each factor the large
    batch at the unchanged and at the scaled rate, then LARS at the largest batch."""
    keys: list[Key] = []
    for seed in setup.seeds:
        keys.append(("unchanged", setup.base_batch, seed))
        for f in setup.factors:
            keys += [("unchanged", setup.batch(f), seed), ("scaled", setup.batch(f), seed)]
        if setup.lars:
            keys.append(("lars", setup.far, seed))
    return keys


@contextmanager
def one_thread() -> Iterator[None]:
    """Run the block with one CPU thread for torch, then restore the count. This network's steps
    are too small to share: two threads spend a step at a batch of 4 waiting for each other, and
    on a busy machine that made a run many times slower than one thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def run_one(train_set: TensorDataset, val_set: TensorDataset, setup: Setup, batch_size: int, seed: int,
            lr_schedule: Callable[[float], float] | None = None,
            optimizer_for: Callable[[nn.Module, float], torch.optim.Optimizer] | None = None,
            device: torch.device | str = "cpu") -> dict[str, Any]:
    """Train a fresh model (seed ``seed``) for ``setup.epochs`` at ``batch_size``: a summary row
    (:func:`multigpu.labs.lab1.batching.summary`). Without ``lr_schedule`` the rate is ``setup.base_lr``
    throughout; ``optimizer_for(model, lr)`` defaults to the course's SGD with momentum."""
    model = build_model(setup, seed, len(getattr(train_set, "classes", range(10)))).to(device)
    optimizer = (optimizer_for or (lambda m, lr: make_optimizer(m, lr=lr)))(model, setup.base_lr)
    loader = data.make_loader(train_set, batch_size, shuffle=True, seed=seed)
    val_loader = data.make_loader(val_set, 500)
    with one_thread():
        history = train(model, loader, val_loader, epochs=setup.epochs, optimizer=optimizer, device=device,
                        lr_schedule=lr_schedule, progress=False, verbose=False)
    return batching.summary(history, batch_size, model=model)


def layer_ratios(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> list[tuple[str, float]]:
    """``(name, |g| / |w|)`` of each adapted layer (:func:`multigpu.labs.lab1.large_batch.adapted`) of
    ``model`` for one batch; the model's gradients are cleared afterwards."""
    model.zero_grad(set_to_none=True)
    nn.functional.cross_entropy(model(images), labels).backward()
    ratios = [(name, float(cast(torch.Tensor, p.grad).norm() / p.detach().norm())) for name, p in model.named_parameters()
              if large_batch.adapted(p)]
    model.zero_grad(set_to_none=True)
    return ratios


def measured_eta(train_set: TensorDataset, setup: Setup, seed: int = 0, batches: int = 16) -> float:
    """LARS's trust coefficient, measured, not tuned on accuracy: the median over the adapted layers
    of ``|g| / |w|`` of a fresh model (seed ``seed``) at the BASE batch, averaged over ``batches``
    batches. LARS at the scaled rate ``k x base_lr`` then moves every layer by ``k x base_lr x eta``
    of its norm per step: ``k`` times what the baseline's first SGD step moves its median layer,
    the distance the linear scaling rule means one large step to cover."""
    model = build_model(setup, seed, len(getattr(train_set, "classes", range(10))))
    per_batch = [[r for _, r in layer_ratios(model, images, labels)]
                 for images, labels in batching.batches(train_set, setup.base_batch, batches, seed=seed)]
    return float(np.median(np.mean(per_batch, axis=0)))


@dataclass
class Results:
    """Every run's summary by :data:`Key`, with the setup and the trust coefficient used."""

    setup: Setup
    runs: dict[Key, dict[str, Any]] = field(default_factory=dict)
    eta: float | None = None

    def values(self, kind: str, batch: int, key: str = "val_acc") -> list[float]:
        """``key`` of the run ``(kind, batch)`` for each seed, in the setup's seed order."""
        return [float(self.runs[kind, batch, s][key]) for s in self.setup.seeds]

    def spread(self, kind: str, batch: int, key: str = "val_acc") -> tuple[float, float, float]:
        """(mean, min, max) of ``key`` over the seeds."""
        v = self.values(kind, batch, key)
        return float(np.mean(v)), min(v), max(v)


def run_all(train_set: TensorDataset, val_set: TensorDataset, setup: Setup, *, lr_at: LrAt,
            trust_ratio: large_batch.TrustRatio | None = None, eta: float | None = None,
            kinds: Sequence[str] = KINDS, device: torch.device | str = "cpu", show_progress: bool = True,
            results: Results | None = None) -> Results:
    """Train every run of :func:`plan` of the given ``kinds`` that ``results`` does not hold yet.

    ``lr_at`` is the warm-up rule (the lab passes the learner's): the scaled runs follow
    ``lr_at(epoch, base_lr, batch, base_batch, warmup_epochs)``. LARS runs the same schedule with
    ``trust_ratio`` (the learner's; :func:`multigpu.labs.lab1.large_batch.trust_ratio` by default) and
    trust coefficient ``eta`` (``setup.eta``, else :func:`measured_eta`).
    """
    results = results or Results(setup)
    todo = [k for k in plan(setup) if k[0] in kinds and k not in results.runs]
    if any(kind == "lars" for kind, _, _ in todo) and results.eta is None:
        results.eta = eta or setup.eta or measured_eta(train_set, setup, setup.seeds[0])

    def schedule(batch: int) -> Callable[[float], float]:
        return lambda epoch: lr_at(epoch, setup.base_lr, batch, setup.base_batch, setup.warmup_epochs)

    def lars(model: nn.Module, lr: float) -> torch.optim.Optimizer:
        return large_batch.make_lars(model, lr, eta=cast(float, results.eta), trust_ratio_fn=trust_ratio)

    steps = _progress(todo, desc="runs", unit="run") if show_progress else todo
    for kind, batch, seed in steps:
        results.runs[kind, batch, seed] = run_one(
            train_set, val_set, setup, batch, seed,
            lr_schedule=None if kind == "unchanged" else schedule(batch),
            optimizer_for=lars if kind == "lars" else None, device=device)
    return results


def _pct(values: Sequence[float]) -> str:
    return f"{100 * np.mean(values):.1f}% ({100 * min(values):.1f}-{100 * max(values):.1f})"


def beyond_spread(low: Sequence[float], high: Sequence[float]) -> bool:
    """True when every seed's value in ``high`` is above every seed's value in ``low``: the two
    ranges over the seeds do not overlap."""
    return min(high) > max(low)


def compare(results: Results) -> dict[str, Any]:
    """The experiment's verdict: per factor, what the unchanged rate lost and the scaled rate won
    back (means over the seeds, the ranges, and whether the ranges are apart); for LARS the same
    at the largest batch. ``lines`` holds the sentences the lab prints."""
    s = results.setup
    base = results.values("unchanged", s.base_batch)
    out: dict[str, Any] = {"base": base, "factors": {}, "lines": []}
    lines = out["lines"]
    lines.append(f"baseline, batch {s.base_batch} at lr {s.base_lr:g}: {_pct(base)} validation accuracy")
    for f in s.factors:
        b = s.batch(f)
        naive, scaled = results.values("unchanged", b), results.values("scaled", b)
        lost = float(np.mean(base) - np.mean(naive))
        won = float(np.mean(scaled) - np.mean(naive))
        row: dict[str, Any] = {"batch": b, "unchanged": naive, "scaled": scaled, "lost": lost, "won": won,
               "won_fraction": won / lost if lost > 0 else float("nan"),
               "scaled_beyond_spread": beyond_spread(naive, scaled),
               "short_of_base": float(np.mean(base) - np.mean(scaled)),
               "short_beyond_spread": beyond_spread(scaled, base)}
        out["factors"][f] = row
        line = (f"{f}x (batch {b}): the unchanged rate reached {_pct(naive)}, the scaled rate with warm-up "
                f"{_pct(scaled)}: ")
        if lost > 0:
            line += f"{row['won_fraction']:.0%} of the {100 * lost:.1f} points lost came back"
        else:
            line += "the unchanged rate lost nothing to win back"
        line += ("; every seed's scaled run beat every seed's unchanged one" if row["scaled_beyond_spread"]
                 else "; the ranges over the seeds overlap: no clear win")
        line += ("; the scaled runs all stayed below the baseline's range" if row["short_beyond_spread"]
                 else "; the scaled runs' range overlaps the baseline's")
        lines.append(line)
    if s.lars and all(("lars", s.far, seed) in results.runs for seed in s.seeds):
        naive, scaled, lars = (results.values(k, s.far) for k in ("unchanged", "scaled", "lars"))
        lost = float(np.mean(base) - np.mean(naive))
        row = {"lars": lars, "won": float(np.mean(lars) - np.mean(naive)),
               "over_scaled": float(np.mean(lars) - np.mean(scaled)),
               "beyond_spread": beyond_spread(scaled, lars)}
        row["won_fraction"] = row["won"] / lost if lost > 0 else float("nan")
        out["lars"] = row
        lines.append(
            f"LARS at batch {s.far} (eta {results.eta:.3g}): {_pct(lars)} against {_pct(scaled)} for the scaled rate: "
            + (f"{row['won_fraction']:.0%} of the loss back, " if lost > 0 else "")
            + ("above the scaled rate on every seed" if row["beyond_spread"] else "the ranges overlap")
            + ("" if beyond_spread(lars, base) else "; it reached the baseline's range")
        )
    return out


def noise_scale(model: nn.Module, dataset: TensorDataset, batch: int = 8, count: int = 64, seed: int = 0,
                device: torch.device | str = "cpu") -> dict[str, Any]:
    """:func:`multigpu.labs.lab1.gradient_noise.model_noise_scale` of ``model`` from ``count`` disjoint
    batches of ``batch`` images of ``dataset`` (fewer when the data set is smaller)."""
    count = min(count, len(dataset) // batch)
    return gradient_noise.model_noise_scale(model, batching.batches(dataset, batch, count, seed=seed), device=device)


def histories(results: Results, seed: int, batch: int | None = None) -> Mapping[str, Mapping[str, Any]]:
    """Per-epoch histories of one seed's runs for :func:`multigpu.figures.plots.plot_histories`: the
    baseline and, at ``batch`` (default: the largest), the unchanged, scaled and LARS runs."""
    s = results.setup
    batch = batch or s.far
    out = {f"batch {s.base_batch} (the baseline)": results.runs["unchanged", s.base_batch, seed]["history"]}
    names = {"unchanged": "unchanged lr", "scaled": "scaled lr + warm-up", "lars": "LARS"}
    for kind, name in names.items():
        if (kind, batch, seed) in results.runs:
            out[f"batch {batch}, {name}"] = results.runs[kind, batch, seed]["history"]
    return out


def table(results: Results, batches: Sequence[int] | None = None) -> str:
    """One row per run kind and batch (those in ``batches``, default all): validation accuracy and
    last-epoch training loss, mean (min-max) over the seeds."""
    s = results.setup
    rows = [("unchanged", s.base_batch, f"batch {s.base_batch}, lr {s.base_lr:g} (the baseline)")]
    for f in s.factors:
        b = s.batch(f)
        rows += [("unchanged", b, f"batch {b} ({f}x), unchanged lr"),
                 ("scaled", b, f"batch {b} ({f}x), lr {f * s.base_lr:g} + warm-up"),
                 ("lars", b, f"batch {b} ({f}x), LARS, same schedule")]
    rows = [r for r in rows if all((r[0], r[1], seed) in results.runs for seed in s.seeds)
            and (batches is None or r[1] in batches)]
    lines = [f"{len(s.seeds)} seed(s); mean (min-max) over them",
             f"{'run':<42}{'validation accuracy':>24}{'training loss':>22}"]
    for kind, b, label in rows:
        m, lo, hi = results.spread(kind, b)
        lm, llo, lhi = results.spread(kind, b, "train_loss")
        lines.append(f"{label:<42}{f'{100 * m:.1f} ({100 * lo:.1f}-{100 * hi:.1f}) %':>24}"
                     f"{f'{lm:.2f} ({llo:.2f}-{lhi:.2f})':>22}")
    return "\n".join(lines)


def figures(verdict: Mapping[str, Any]) -> dict[str, float]:
    """The figures the lab prints beside the reference run's: the baseline's accuracy, the share of
    the loss the scaled rate won back at the smallest and at the largest factor, and LARS's share."""
    factors = sorted(verdict["factors"])
    out = {"baseline_accuracy": float(np.mean(verdict["base"])),
           "won_back_small": verdict["factors"][factors[0]]["won_fraction"],
           "won_back_far": verdict["factors"][factors[-1]]["won_fraction"]}
    if "lars" in verdict:
        out["lars_won_back_far"] = verdict["lars"]["won_fraction"]
    return out
