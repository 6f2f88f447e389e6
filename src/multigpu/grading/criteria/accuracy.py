"""``accuracy``: rank 0's weights, evaluated by the grader on its own held-out set after every
epoch, reach ``settings.accuracy`` and hold it for ``settings.epochs_held`` epochs (what the
script prints or writes is not used). Beside it, the time to accuracy (:func:`time_to_accuracy`)."""

from __future__ import annotations

from collections.abc import Mapping

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
    tta = time_to_accuracy(dict(zip(evidence.complete, accs)), evidence.run.epoch_times, settings.accuracy)
    measured = {"accuracy_per_epoch": [round(a, 4) for a in accs], "accuracy": round(accs[-1], 4),
                "accuracy_held": round(held, 4) if held is not None else None,
                "time_to_accuracy_s": round(tta[1], 1) if tta else None, "time_to_accuracy_epoch": tta[0] if tta else None}
    per_epoch = ", ".join(f"{a:.1%}" for a in accs)
    if tta:
        per_epoch += f" (A reached to stay at {tta[1]:.0f} s by the grader's clock, the end of epoch {tta[0]})"
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


def time_to_accuracy(accuracy: Mapping[int, float], epoch_times: Mapping[int, float],
                     target: float) -> tuple[int, float] | None:
    """MLPerf Training's time to train: the end of the first epoch after which the held-out
    accuracy stays at or above ``target`` in every later epoch measured, as ``(epoch, seconds
    after the run's start)`` on the grader's clock (``epoch_times``: when the epoch's last
    checkpoint appeared); None when the last epoch measured is below it."""
    first = None
    for e in sorted(accuracy):
        if accuracy[e] < target:
            first = None
        elif first is None:
            first = e
    if first is None or first not in epoch_times:
        return None
    return first, epoch_times[first]
