"""``accuracy``: rank 0's weights, evaluated by the grader on its own held-out set after every
epoch, reach ``settings.accuracy`` and hold it for ``settings.epochs_held`` epochs (what the
script prints or writes is not used)."""

from __future__ import annotations

from multigpu.grading.checkpoints import holdout_accuracy
from multigpu.grading.evidence import CHECKPOINTS, Evidence
from multigpu.grading.hints import learning_rate_hints
from multigpu.grading.result import Criterion
from multigpu.grading.rules import Settings

NAME = "accuracy"
POINTS = 3
REQUIRES: tuple[str, ...] = (CHECKPOINTS,)
AFTER: tuple[str, ...] = ()

TUNE = ("Tune the learning rate (scaled by hvd.size() after a warm-up), the per-worker batch size or the epochs; "
        "what the script prints is not used")


def judge(evidence: Evidence, settings: Settings) -> Criterion:
    """The held-out accuracy of every complete epoch; the best ``epochs_held`` in a row."""
    accs: list[float] = []
    try:
        for e in evidence.complete:
            accs.append(holdout_accuracy(evidence.loaded[(0, e)]["model"], evidence.holdout))
            evidence.log(f"epoch {e}: the grader measured {accs[-1]:.1%} on its held-out set")
    except ValueError as err:
        return Criterion(NAME, POINTS, False, str(err))
    k = settings.epochs_held
    held = max((min(accs[i:i + k]) for i in range(len(accs) - k + 1)), default=None)
    measured = {"accuracy_per_epoch": [round(a, 4) for a in accs], "accuracy": round(accs[-1], 4),
                "accuracy_held": round(held, 4) if held is not None else None}
    per_epoch = ", ".join(f"{a:.1%}" for a in accs)
    if held is None:
        return Criterion(NAME, POINTS, False, f"the grader measured {per_epoch} on its held-out set: it needs at "
                         f"least {k} epochs to see the accuracy held", measured=measured)
    if held >= settings.accuracy:
        return Criterion(NAME, POINTS, True, f"the grader measured {per_epoch} on its held-out set: {held:.1%} held "
                         f"for {k} epochs (A = {settings.accuracy:.0%})", measured=measured)
    hints = learning_rate_hints(evidence.source)
    return Criterion(NAME, POINTS, False,
                     f"the grader measured {per_epoch} on its held-out set; best held for {k} epochs: {held:.1%}, "
                     f"below A = {settings.accuracy:.0%}. {TUNE}"
                     + "".join(f". Hint from reading your script (not a verdict): {h}" for h in hints),
                     measured=measured)
