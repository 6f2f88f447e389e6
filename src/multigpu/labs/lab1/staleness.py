"""Lab 1, part 6: synchronous or asynchronous SGD, stale gradients and stragglers.

Asynchronous SGD (a parameter server that applies each worker's gradient as soon as it arrives,
as DistBelief's Downpour SGD did, Dean et al. 2012) never makes a worker wait, but the gradient
it applies was computed on weights several updates old: with ``N`` workers taking turns, about
``N - 1``. :func:`train_stale` simulates that exactly in one process: a queue holds the last
``tau + 1`` versions of the weights, and the gradient of step ``t`` is taken at ``w_{t - tau}``
(at ``w_0`` for the first ``tau`` steps, where every worker starts) and applied to ``w_t``.

The simulation is exact for a fixed round-robin delay (every gradient exactly ``tau`` steps old,
the ``N`` workers taking strict turns), not for the random delays of a real parameter server, where
a slow worker's gradient can arrive many steps late.

On a quadratic with curvature ``h`` this is the delayed recurrence ``x_{t+1} = x_t - lr h x_{t-tau}``,
stable exactly when ``lr h < 2 sin(pi / (2 (2 tau + 1)))`` (:func:`stable_rate`): against fresh
gradients the largest stable rate falls to ``sin(pi / (4 tau + 2))`` (0.5, 0.17 and 0.048 at
``tau`` = 1, 4, 16; about ``pi / (4 tau)`` for large ``tau``). :func:`run_all` measures what that
does to a network: each staleness at the rate fresh gradients train well with, at the rate the
bound allows, and against it the synchronous alternative with the same ``tau + 1`` workers, one
step of a ``(tau + 1)``-times larger batch (that many fewer steps in the same epochs).

Synchronous SGD (all-reduce, Horovod) has no stale gradients, but each step waits for the
slowest of its ``N`` workers. :func:`step_times` measures one worker's step times on this machine
and :func:`expected_max` the mean of the slowest of ``N`` draws from them (:func:`stragglers`).
"""

from __future__ import annotations

import copy
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import TensorDataset

from multigpu.core.notebook import progress as show_progress
from multigpu.labs.lab1.scaling_rule import SmallConvNet

#: A loss: (outputs, targets) -> a scalar tensor, the mean over the batch.
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
#: One run's key: (staleness tau, learning rate, batch size, seed). The synchronous run of ``N``
#: workers is ``tau = 0`` at ``N`` times the batch.
Key = tuple[int, float, int, int]


def stable_rate(tau: int, curvature: float = 1.0) -> float:
    """The largest learning rate at which SGD with gradients ``tau`` steps stale converges on a
    quadratic of this curvature: ``2 sin(pi / (2 (2 tau + 1))) / curvature`` (2 / h without staleness)."""
    if tau < 0 or curvature <= 0:
        raise ValueError(f"tau must be >= 0 and the curvature positive, got {tau}, {curvature}")
    return 2 * math.sin(math.pi / (2 * (2 * tau + 1))) / curvature


def train_stale(model: nn.Module, train_set: TensorDataset, *, lr: float, tau: int, batch_size: int, epochs: int,
                seed: int = 0, loss_fn: LossFn = nn.functional.cross_entropy) -> dict[str, Any]:
    """Plain SGD (no momentum) on ``model`` whose step ``t`` applies the gradient taken at the
    weights of step ``t - tau`` (``w_0`` while ``t < tau``); ``tau = 0`` is ordinary SGD.

    Returns ``{"train_loss": [per epoch], "steps": n, "diverged": bool}``: the training loss is the
    mean of the batches' losses at the weights each gradient was taken at (what the workers saw).
    A non-finite loss stops the run (diverged)."""
    if tau < 0 or batch_size < 1 or epochs < 1:
        raise ValueError(f"tau >= 0, batch_size >= 1 and epochs >= 1, got {tau}, {batch_size}, {epochs}")
    images, labels = train_set.tensors
    reader = copy.deepcopy(model)  # holds the stale weights the gradient is taken at
    weights, stale = list(model.parameters()), list(reader.parameters())
    past: deque[list[torch.Tensor]] = deque(maxlen=tau + 1)
    order_rng = torch.Generator().manual_seed(seed)
    history: dict[str, Any] = {"train_loss": [], "steps": 0, "diverged": False}
    for _ in range(epochs):
        order = torch.randperm(len(labels), generator=order_rng)
        total, steps = 0.0, 0
        for start in range(0, len(order), batch_size):
            batch = order[start:start + batch_size]
            past.append([w.detach().clone() for w in weights])  # w_t joins; w_{t - tau - 1} leaves
            with torch.no_grad():
                for s, w in zip(stale, past[0]):
                    s.copy_(w)
            loss = loss_fn(reader(images[batch]), labels[batch])
            grads = torch.autograd.grad(loss, stale)
            with torch.no_grad():
                for w, g in zip(weights, grads):
                    w.sub_(lr * g)
            value = loss.item()
            total, steps = total + value, steps + 1
            if not math.isfinite(value):
                history["diverged"] = True
                break
        history["train_loss"].append(total / steps)
        history["steps"] += steps
        if history["diverged"]:
            break
    return history


@torch.no_grad()
def accuracy(model: nn.Module, dataset: TensorDataset, chunk: int = 500) -> float:
    """The share of ``dataset``'s images ``model`` classifies right (0 for a model whose outputs are not finite)."""
    images, labels = dataset.tensors
    right = 0
    for start in range(0, len(labels), chunk):
        out = model(images[start:start + chunk])
        if not bool(torch.isfinite(out).all()):
            return 0.0
        right += int((out.argmax(1) == labels[start:start + chunk]).sum())
    return right / len(labels)


def bound_rate(lr: float, tau: int) -> float:
    """The rate the quadratic's bound allows at staleness ``tau``, given that ``lr`` suits fresh
    gradients: ``lr x stable_rate(tau) / stable_rate(0)``."""
    return lr * stable_rate(tau) / stable_rate(0)


@dataclass(frozen=True)
class Setup:
    """Part 6's knobs: the batch and the rate that trains best without staleness, the stalenesses
    tried, the same epochs for every run, the seeds, the network's width."""

    batch: int = 16
    lr: float = 0.2
    taus: tuple[int, ...] = (0, 1, 4, 16)
    epochs: int = 2
    seeds: tuple[int, ...] = (0, 1, 2)
    side: int = 16
    width: int = 16

    def plan(self) -> list[Key]:
        """Every run, seed by seed: tau = 0; each tau > 0 at ``lr`` and at :func:`bound_rate`; and
        for each tau > 0 the synchronous run of ``tau + 1`` workers (batch ``(tau + 1) x batch``, ``lr``)."""
        keys: list[Key] = []
        for seed in self.seeds:
            keys.append((0, self.lr, self.batch, seed))
            keys += [(tau, self.lr, self.batch, seed) for tau in self.taus if tau > 0]
            keys += [(tau, bound_rate(self.lr, tau), self.batch, seed) for tau in self.taus if tau > 0]
            keys += [(0, self.lr, (tau + 1) * self.batch, seed) for tau in self.taus if tau > 0]
        return keys


def run_all(train_set: TensorDataset, val_set: TensorDataset, setup: Setup,
            progress: bool = True) -> dict[Key, dict[str, Any]]:
    """Train a fresh :class:`SmallConvNet` (weights from the seed, the same for every run of a seed)
    for every run of ``setup.plan()``; each result is :func:`train_stale`'s history plus ``val_acc``."""
    results: dict[Key, dict[str, Any]] = {}
    keys = setup.plan()
    for tau, lr, batch, seed in show_progress(keys, desc="stale and synchronous runs") if progress else keys:
        torch.manual_seed(seed)
        model = SmallConvNet(setup.side, setup.width, num_classes=int(train_set.tensors[1].max()) + 1)
        history = train_stale(model, train_set, lr=lr, tau=tau, batch_size=batch, epochs=setup.epochs, seed=seed)
        history["val_acc"] = 0.0 if history["diverged"] else accuracy(model, val_set)
        results[tau, lr, batch, seed] = history
    return results


def summary(results: dict[Key, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (tau, lr, batch) over the seeds: accuracy mean/min/max, the last epoch's training
    loss (mean), how many seeds diverged, the steps of one run."""
    rows = []
    for tau, lr, batch in sorted({k[:3] for k in results}, key=lambda k: (k[2], -k[1], k[0])):
        runs = [h for k, h in results.items() if k[:3] == (tau, lr, batch)]
        accs = [h["val_acc"] for h in runs]
        losses = [h["train_loss"][-1] for h in runs if not h["diverged"]]
        rows.append({"tau": tau, "lr": lr, "batch": batch, "acc_mean": float(np.mean(accs)), "acc_min": min(accs),
                     "acc_max": max(accs), "loss": float(np.mean(losses)) if losses else float("nan"),
                     "diverged": sum(h["diverged"] for h in runs), "seeds": len(runs), "steps": runs[0]["steps"],
                     "accs": accs})
    return rows


def describe(row: dict[str, Any], batch: int) -> str:
    """What a row of :func:`summary` is: one worker, asynchronous workers, or synchronous workers."""
    if row["tau"]:
        return f"async, {row['tau'] + 1} workers"
    return "1 worker" if row["batch"] == batch else f"sync, {row['batch'] // batch} workers"


def table(results: dict[Key, dict[str, Any]], batch: int) -> str:
    """The summary as text: one line per run kind (``batch``: one worker's batch)."""
    lines = [f"{'run':<17}{'tau':>4}{'batch':>6}{'lr':>9}{'steps':>7} {'validation accuracy, mean (min-max)':>36}"
             f"{'train loss':>11}  diverged"]
    for r in summary(results):
        loss = "-" if math.isnan(r["loss"]) else f"{r['loss']:.3f}"
        lines.append(f"{describe(r, batch):<17}{r['tau']:>4}{r['batch']:>6}{r['lr']:>9.3g}{r['steps']:>7} "
                     f"{100 * r['acc_mean']:>19.1f}% ({100 * r['acc_min']:.1f}-{100 * r['acc_max']:.1f}%)    "
                     f"{loss:>11}  {r['diverged']} of {r['seeds']}")
    return "\n".join(lines)


def _trained(row: dict[str, Any], chance: float) -> bool:
    return row["diverged"] < row["seeds"] and row["acc_max"] >= 1.5 * chance


def _status(row: dict[str, Any], base: dict[str, Any], chance: float) -> str:
    if row["diverged"] == row["seeds"]:
        return "diverged on every seed"
    if not _trained(row, chance):
        diverged = f", diverged on {row['diverged']} of {row['seeds']} seeds" if row["diverged"] else ""
        return f"did not train (at most {100 * row['acc_max']:.0f}%, chance is {100 * chance:.0f}%{diverged})"
    if row["diverged"]:
        return f"diverged on {row['diverged']} of {row['seeds']} seeds"
    if row["acc_max"] < base["acc_min"]:
        return f"trained, but below tau = 0's range on every seed ({100 * row['acc_mean']:.1f}% against {100 * base['acc_mean']:.1f}%)"
    return f"within tau = 0's range ({100 * row['acc_mean']:.1f}% against {100 * base['acc_mean']:.1f}%)"


def _against(sync: dict[str, Any], stale: dict[str, Any], chance: float) -> str:
    """Synchronous against asynchronous with the same workers: ranges over the seeds, or both at chance."""
    if not (_trained(sync, chance) or _trained(stale, chance)):
        return "neither left chance in these epochs"
    if sync["acc_min"] > stale["acc_max"]:
        return "synchronous above asynchronous on every seed"
    if stale["acc_min"] > sync["acc_max"]:
        return "asynchronous above synchronous on every seed"
    return "the ranges over the seeds overlap"


def verdict(results: dict[Key, dict[str, Any]], setup: Setup, classes: int = 10) -> list[str]:
    """Sentences computed from the runs: each staleness at the rate that works without it, then at
    the bound's rate, against tau = 0; then, for the same workers, synchronous against asynchronous."""
    rows = {(r["tau"], r["lr"], r["batch"]): r for r in summary(results)}
    base = rows[0, setup.lr, setup.batch]
    chance = 1 / classes
    lines = [f"one worker, fresh gradients (tau = 0) at lr {setup.lr:g}: {100 * base['acc_mean']:.1f}% "
             f"({100 * base['acc_min']:.1f}-{100 * base['acc_max']:.1f}%) after {setup.epochs} epoch(s), {base['steps']} steps"]
    taus = [tau for tau in setup.taus if tau > 0]
    for tau in taus:
        lines.append(f"tau = {tau:>2} at lr {setup.lr:g} (fresh gradients' rate): " + _status(rows[tau, setup.lr, setup.batch], base, chance))
    for tau in taus:
        lr = bound_rate(setup.lr, tau)
        lines.append(f"tau = {tau:>2} at lr {lr:.3g} (the bound's, {lr / setup.lr:.2g} x): "
                     + _status(rows[tau, lr, setup.batch], base, chance))
    for tau in taus:
        stale, sync = rows[tau, bound_rate(setup.lr, tau), setup.batch], rows[0, setup.lr, (tau + 1) * setup.batch]
        lines.append(f"{tau + 1:>2} workers, the same epochs: synchronous (batch {sync['batch']}, {sync['steps']} steps) "
                     f"{100 * sync['acc_mean']:.1f}%, asynchronous (tau = {tau}, bound's rate, {stale['steps']} steps) "
                     f"{100 * stale['acc_mean']:.1f}%: " + _against(sync, stale, chance))
    return lines


def step_times(model: nn.Module, train_set: TensorDataset, batch_size: int, steps: int, *, lr: float = 0.01,
               warmup: int = 5, seed: int = 0, loss_fn: LossFn = nn.functional.cross_entropy) -> np.ndarray:
    """The seconds of each of ``steps`` SGD steps (forward, backward, update) of ``model`` on random
    batches of ``train_set``, each step timed on its own, after ``warmup`` untimed steps."""
    images, labels = train_set.tensors
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    rng = torch.Generator().manual_seed(seed)
    times = []
    for step in range(warmup + steps):
        batch = torch.randint(0, len(labels), (batch_size,), generator=rng)
        x, y = images[batch], labels[batch]
        started = time.perf_counter()
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()
        if step >= warmup:
            times.append(time.perf_counter() - started)
    return np.array(times)


def expected_max(times: Iterable[float], n: int) -> float:
    """The expected slowest of ``n`` independent draws from the measured ``times`` (each equally
    likely): the sorted i-th time is the slowest with probability ``(i/k)^n - ((i-1)/k)^n``."""
    t = np.sort(np.asarray(list(times), dtype=float))
    if n < 1 or not len(t):
        raise ValueError(f"need at least one time and one worker, got {len(t)} times, n = {n}")
    i = np.arange(1, len(t) + 1) / len(t)
    return float(t @ (i ** n - (i - 1 / len(t)) ** n))


def stragglers(times: Sequence[float], workers: Iterable[int]) -> list[dict[str, float]]:
    """For each number of workers: one worker's mean step time, the expected slowest of ``n`` (a
    synchronous step's time) and their ratio (the share of a synchronous step spent computing)."""
    mean = float(np.mean(times))
    rows = []
    for n in workers:
        slowest = expected_max(times, n)
        rows.append({"workers": n, "mean_s": mean, "sync_s": slowest, "efficiency": mean / slowest})
    return rows


def straggler_table(times: Sequence[float], workers: Iterable[int]) -> str:
    """:func:`stragglers` as text, after the spread of the measured times."""
    t = np.asarray(times) * 1e3
    lines = [f"{len(t)} steps measured: mean {t.mean():.2f} ms, median {np.median(t):.2f} ms, "
             f"99th percentile {np.percentile(t, 99):.2f} ms, slowest {t.max():.2f} ms",
             f"{'workers':>8} {'mean step':>10} {'synchronous step (slowest of N)':>32} {'computing':>10}"]
    for r in stragglers(times, workers):
        lines.append(f"{r['workers']:>8} {1e3 * r['mean_s']:>7.2f} ms {1e3 * r['sync_s']:>29.2f} ms {r['efficiency']:>10.0%}")
    return "\n".join(lines)
