"""``identical``: every rank holds the same trainable weights after every epoch, AND Horovod
averaged the gradients (its timeline shows the rounds of gradient all-reduces while the run
trained: :mod:`multigpu.grading.averaging`). The timeline is the run's own claim: where the grader
saw the ranks talk over connections Horovod did not open, the message says so (and the pass is
held: :mod:`multigpu.grading.observations`)."""

from __future__ import annotations

import math
from typing import Any

from multigpu.grading.evidence import CHECKPOINTS, Evidence
from multigpu.grading.result import Criterion
from multigpu.grading.rules import Settings

NAME = "identical"
POINTS = 2
REQUIRES: tuple[str, ...] = (CHECKPOINTS,)
AFTER: tuple[str, ...] = ()

BROADCAST = ("broadcast rank 0's parameters and optimizer state at the start (hvd.broadcast_parameters, "
             "hvd.broadcast_optimizer_state) and average gradients with hvd.DistributedOptimizer")
BUFFERS = ("BatchNorm's running statistics are buffers each rank computes from its own shard, so they are "
           "not compared")


def judge(evidence: Evidence, settings: Settings) -> Criterion:
    """Identical weights (rank 0 against every other rank), then Horovod's account of the averaging."""
    spread, by_horovod = evidence.spread, evidence.averaging
    assert spread is not None and by_horovod is not None  # collected with the checkpoints
    measured: dict[str, Any] = {"max_weight_difference": spread.largest if math.isfinite(spread.largest)
                                else "shape mismatch", **by_horovod.measurements}
    if not spread.identical:
        return Criterion(NAME, POINTS, False,
                         f"weights differ between rank 0 and rank {spread.rank} after epoch {spread.epoch} (largest "
                         f"difference {spread.largest:.3g} in '{spread.tensor}'): {BROADCAST}", measured=measured)
    if not by_horovod.ok:
        return Criterion(NAME, POINTS, False, by_horovod.message, measured=measured)
    foreign = evidence.observed.foreign if evidence.observed else None
    doubt = (f"; but the ranks also held {len(foreign)} TCP connection(s) that Horovod did not open, so the "
             "timeline is not taken at its word: the pass is held for review") if foreign else ""
    return Criterion(NAME, POINTS, True,
                     f"all {settings.workers} ranks hold the same trainable weights after each of "
                     f"{len(evidence.complete)} epochs ({BUFFERS}); " + by_horovod.message + doubt, measured=measured)
