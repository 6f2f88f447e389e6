"""The evidence of a grading: one record of everything the criteria judge, collected after the run.

:func:`collect` gathers it from the run's record, the checkpoints it left, Horovod's timeline,
what the grader saw from outside the run (:mod:`multigpu.grading.observations`) and the baselines
of the same grading; the criteria (:mod:`multigpu.grading.criteria`) read it
and never change it. What could not be collected is named in :attr:`Evidence.unavailable` with
the reason, which a criterion that ``REQUIRES`` it gets as its failing message.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import torch

from multigpu.grading import averaging, hints, observations, runs
from multigpu.grading.averaging import RunClock
from multigpu.grading.checkpoints import IDENTICAL_TOL, load_checkpoint, state_difference, weights_only
from multigpu.grading.preparation import Log
from multigpu.grading.result import Criterion
from multigpu.grading.rules import Settings
from multigpu.grading.runner import RunRecord

#: The evidence "checkpoints": every rank's checkpoint of every complete epoch, loaded.
CHECKPOINTS = "checkpoints"
Checkpoint = dict[str, Any]  # {"model": {name: tensor}, "indices": [int, ...]}: checkpoints.load_checkpoint


@dataclass(frozen=True)
class WeightSpread:
    """The largest difference between rank 0's trainable weights and another rank's, over the
    complete epochs: where it is (tensor, rank, epoch); ``inf`` when names or shapes differ."""

    largest: float
    tensor: str
    rank: int
    epoch: int

    @property
    def identical(self) -> bool:
        return self.largest <= IDENTICAL_TOL


@dataclass(frozen=True)
class Averaging:
    """Horovod's account of the gradient averaging: :func:`averaging.horovod_averaging`."""

    ok: bool
    message: str
    measurements: Mapping[str, Any]


@dataclass(frozen=True)
class Evidence:
    """What a grading measured of one run; read by every criterion, changed by none."""

    run: RunRecord
    #: why the run did not end cleanly (None: it did): :func:`runs.run_failure`
    failure: str | None
    source: str
    #: the checkpoints the run left, ``(rank, epoch) -> path``
    found: Mapping[tuple[int, int], Path]
    #: the epochs with a checkpoint from every rank
    complete: tuple[int, ...]
    #: those epochs' checkpoints, loaded (empty when "checkpoints" is unavailable)
    loaded: Mapping[tuple[int, int], Checkpoint]
    train_root: Path
    holdout: Path
    #: single-worker baselines of this grading (images/s), as the measurements record them
    baselines: tuple[float, ...]
    #: min(workers, cores or GPUs) of this grading (None: ask :func:`devices.ideal_factor`)
    ideal_factor: float | None
    log: Log
    #: the grader's clock of the run (None: the run has no complete epoch or no start time)
    clock: RunClock | None = None
    #: rank 0's weights against the other ranks' (None without checkpoints)
    spread: WeightSpread | None = None
    #: Horovod's timeline read (None without checkpoints)
    averaging: Averaging | None = None
    #: what the grader saw from outside the run: reads, connections (None: not watched)
    observed: observations.Observed | None = None
    #: evidence that could not be collected -> why (a criterion that requires it fails with that)
    unavailable: Mapping[str, str] = field(default_factory=dict)
    #: the verdicts of the earlier criteria a criterion reads (its ``AFTER``); set by the pipeline
    verdicts: Mapping[str, Criterion] = field(default_factory=dict)

    @property
    def uses_horovod(self) -> bool:
        return hints.uses_horovod(self.source)

    @property
    def unaveraged(self) -> bool:
        """The ranks hold identical weights, yet Horovod's timeline does not show the gradients
        averaged (a broadcast before saving, one rank training alone, torch DDP)."""
        return self.spread is not None and self.spread.identical and self.averaging is not None \
            and not self.averaging.ok


def load_complete(found: Mapping[tuple[int, int], Path], complete: Sequence[int], n: int,
                  failure: str | None) -> tuple[dict[tuple[int, int], Checkpoint], str]:
    """The checkpoints of the complete epochs (ranks of one epoch are compared with each other),
    and why there is nothing to judge ("" when there is)."""
    loaded: dict[tuple[int, int], Checkpoint] = {}
    load_error = ""
    try:
        for e in complete:
            for r in range(n):
                loaded[(r, e)] = load_checkpoint(found[(r, e)])
    except ValueError as err:
        load_error = str(err)
    nothing = load_error or ("no epoch has a checkpoint from all "
                             f"{n} ranks, so there is nothing to compare" + (f" ({failure.splitlines()[0]})" if failure else ""))
    return loaded, ("" if not load_error and complete else nothing)


def weight_spread(loaded: Mapping[tuple[int, int], Checkpoint], complete: Sequence[int], n: int) -> WeightSpread:
    """:class:`WeightSpread` of the loaded checkpoints."""
    worst = (0.0, "", 0, 0)
    for e in complete:
        for r in range(1, n):
            d, where = state_difference(weights_only(loaded[(0, e)]["model"]), weights_only(loaded[(r, e)]["model"]))
            if d > worst[0]:
                worst = (d, where, r, e)
    return WeightSpread(*worst)


def collect(rec: RunRecord, found: Mapping[tuple[int, int], Path], settings: Settings, train_root: Path,
            holdout: Path, measurements: Mapping[str, Any], log: Log, source: str = "",
            timeline_path: Path | None = None) -> Evidence:
    """The evidence of the run ``rec`` that left the checkpoints ``found``. ``measurements``: the
    grading's so far (its ``baselines`` and ``ideal_factor``); ``timeline_path``: the Horovod
    timeline the run was told to write (None: none was recorded, and the gradients do not count
    as averaged by Horovod)."""
    n = settings.workers
    failure = runs.run_failure(rec, settings)
    complete = tuple(e for e in sorted({e for _, e in found}) if all((r, e) in found for r in range(n)))
    loaded, nothing = load_complete(found, complete, n, failure)
    seen = [rec.epoch_times[e] for e in complete if e in rec.epoch_times]
    clock = RunClock(rec.started_at, rec.wall_s, max(seen)) if rec.started_at and seen else None
    spread = by_horovod = None
    if not nothing:
        spread = weight_spread(loaded, complete, n)
        weights: dict[str, torch.Tensor] = weights_only(loaded[(0, complete[0])]["model"])
        per_worker = sum(len(set(c["indices"])) for c in loaded.values()) / len(loaded)
        told = averaging.horovod_averaging(timeline_path, weights, per_worker, len(complete), settings, source,
                                           clock=clock)
        by_horovod = Averaging(told["ok"], told["message"], MappingProxyType(told["measurements"]))
    outside = None
    if rec.observed:
        claimed: dict[int, set[int]] = {}
        for (_, e), c in ({} if nothing else loaded).items():
            claimed.setdefault(e, set()).update(c["indices"])
        controller = "gloo" if "--gloo" in rec.command else "mpi"  # what horovodrun was told (mpi: its default)
        per_epoch = by_horovod.measurements.get("horovod_gradient_rounds_per_epoch") if by_horovod else None
        rounds = round(per_epoch * len(complete)) if isinstance(per_epoch, (int, float)) else 0
        outside = observations.observe(rec.observed, claimed, controller, rounds, n)
    return Evidence(
        run=rec, failure=failure, source=source, found=MappingProxyType(dict(found)), complete=complete,
        loaded=MappingProxyType({} if nothing else loaded), train_root=train_root, holdout=holdout,
        baselines=tuple(measurements.get("baselines") or ()), ideal_factor=measurements.get("ideal_factor"),
        log=log, clock=clock, spread=spread, averaging=by_horovod, observed=outside,
        unavailable=MappingProxyType({CHECKPOINTS: nothing} if nothing else {}))

