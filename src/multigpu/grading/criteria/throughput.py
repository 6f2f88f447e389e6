"""``throughput``: the run's images/s (checkpoint arrival times by the grader's clock, the
DISTINCT indices of each epoch whose files the grader saw opened: :func:`observations.seen_images`)
against the ideal measured in the same grading (min(workers,
cores or GPUs) x the single-worker baseline), at least ``settings.efficiency``. Counted only for a
run that passed every other criterion; above :data:`rules.MAX_TRUSTED_EFFICIENCY` x ideal it is a
measurement the grader does not trust, never a pass."""

from __future__ import annotations

import statistics
from typing import Any

from multigpu.core import devices
from multigpu.grading import observations, rules
from multigpu.grading.baselines import agreeing_baselines
from multigpu.grading.checkpoints import images_per_epoch
from multigpu.grading.evidence import Evidence
from multigpu.grading.result import Criterion
from multigpu.grading.rules import Settings
from multigpu.grading.runs import run_throughput

NAME = "throughput"
POINTS = 1
REQUIRES: tuple[str, ...] = ()
#: speed only counts for a run that trains correctly
AFTER: tuple[str, ...] = ("workers", "identical", "sharded", "accuracy")

NO_EPOCHS = "not measured: the run needs at least 2 complete epochs (the first is warm-up)"
TOO_SLOW = ("too slow. Give each worker cores // workers threads, use a larger per-worker batch, and "
            "print/evaluate less often")


def judge(evidence: Evidence, settings: Settings) -> Criterion:
    """The efficiency against the ideal, or why it is not measured or not counted."""
    n = settings.workers
    throughput = run_throughput(evidence.run, observations.seen_images(evidence.observed,
                                                                       images_per_epoch(evidence.loaded)))
    baselines = list(evidence.baselines)
    agreeing = agreeing_baselines(baselines, settings.baseline_tolerance) if len(baselines) >= 2 else baselines
    measured: dict[str, Any] = {"throughput": round(throughput, 2) if throughput else None}
    if not baselines:
        return Criterion(NAME, POINTS, False, "not measured: no single-worker baseline in this grading "
                         f"(baseline_repeats={settings.baseline_repeats}, or the starter failed)", measured=measured)
    if throughput is None:
        return Criterion(NAME, POINTS, False, NO_EPOCHS, measured=measured)
    if agreeing is None:
        return Criterion(NAME, POINTS, False,
                         f"machine too noisy to grade throughput: the single-worker baselines measured "
                         f"{', '.join(f'{b:.1f}' for b in baselines)} images/s, more than "
                         f"{settings.baseline_tolerance:.0%} apart (something else ran on this machine). Not a "
                         "verdict on your script: grade again on a quiet machine", measured={**measured, "noisy": True})
    baseline = statistics.median(agreeing)
    factor = evidence.ideal_factor or devices.ideal_factor(n)  # min(workers, cores or GPUs) of this grading
    ideal = factor * baseline
    eff = throughput / ideal
    measured.update(baseline=round(baseline, 2), ideal=round(ideal, 2), efficiency=round(eff, 4))
    figures = (f"{throughput:.1f} images/s on {n} workers = {eff:.2f} x ideal ({ideal:.1f} = {factor} x "
               f"{baseline:.1f} images/s of one worker with one thread, median of {len(agreeing)}); "
               f"E = {settings.efficiency:.2f}")
    failed = [name for name in AFTER if not evidence.verdicts[name].passed]
    if failed:
        return Criterion(NAME, POINTS, False, f"{figures}; not counted: the run failed {', '.join(failed)} "
                         "(speed only counts for a run that trains correctly)", measured=measured)
    if eff > rules.MAX_TRUSTED_EFFICIENCY:
        return Criterion(NAME, POINTS, False,
                         f"{figures}: faster than the ideal, which {n} workers cannot beat, beyond the "
                         f"{rules.MAX_TRUSTED_EFFICIENCY - 1:.0%} a baseline may be off: the grader does not trust "
                         "this measurement, so it is no pass. Images count once per epoch however many ranks "
                         "list them; if your script is honest, ask for a grading on a quiet machine",
                         measured={**measured, "untrusted_efficiency": True})
    if eff >= settings.efficiency:
        return Criterion(NAME, POINTS, True, figures, measured=measured)
    return Criterion(NAME, POINTS, False, f"{figures}: {TOO_SLOW}", measured=measured)
