"""The baselines of a grading: the unmodified starter on one worker with ONE thread (one core's
share, the ideal's unit everywhere in the course), run before and after the submission so that a
slow minute hits both (:func:`run_with_baselines`); the throughput criterion takes the largest
group that agrees (:func:`agreeing_baselines`) or calls the machine too noisy."""

from __future__ import annotations

import shutil
from collections.abc import Sequence

from multigpu.grading import runner
from multigpu.grading.checkpoints import find_checkpoints, images_per_epoch, load_checkpoint
from multigpu.grading.preparation import STARTER, Log, Prepared, mode_env
from multigpu.grading.rules import Settings
from multigpu.grading.runs import run_failure, run_submission, run_throughput

#: Threads of the baseline worker: one core's share, the ideal's unit everywhere in the course.
BASELINE_THREADS = 1


def baseline(settings: Settings, prepared: Prepared, index: int, log: Log) -> float | None:
    """One run of the unmodified starter on one worker with one thread: its images/s (None if it failed)."""
    work = prepared.work / f"baseline-{index}"
    work.mkdir()
    shutil.copy(STARTER, work / "train.py")
    ckpt = work / "checkpoints"
    rec = runner.run_untrusted(work / "train.py", work, workers=None, timeout=settings.time_budget_s,
                               max_output_bytes=settings.max_output_bytes, max_memory_bytes=settings.max_memory_bytes,
                               args=("--epochs", str(settings.baseline_epochs), "--threads", str(BASELINE_THREADS)),
                               env={"MULTIGPU_ASSESSMENT_DATA": str(prepared.baseline_root),
                                    "MULTIGPU_CHECKPOINT_DIR": str(ckpt), **mode_env(settings)},
                               checkpoint_dir=ckpt, sandbox=prepared.sandbox)
    if not rec.ok:
        log(f"baseline run {index + 1} failed: {run_failure(rec, settings)}")
        return None
    loaded = {k: load_checkpoint(p) for k, p in find_checkpoints(ckpt).items()}
    value = run_throughput(rec, images_per_epoch(loaded))
    shutil.rmtree(work, ignore_errors=True)
    log(f"baseline {index + 1}: the unmodified starter on one worker, {BASELINE_THREADS} thread: "
        + (f"{value:.1f} images/s" if value else "no throughput (fewer than 2 epochs)"))
    return value


def run_with_baselines(prepared: Prepared, settings: Settings, script_name: str, args: Sequence[str], echo: bool,
                       log: Log) -> tuple[runner.RunRecord, list[float | None]]:
    """The submission's run between the baselines (``settings.baseline_repeats``, the odd one
    before): its record and the baselines' images/s. A run stopped early leaves no complete
    epoch, so no baseline runs after it; baselines that disagree get one more."""
    repeats = settings.baseline_repeats
    before, after = (repeats + 1) // 2, repeats // 2
    baselines: list[float | None] = [baseline(settings, prepared, i, log) for i in range(before)]
    log(f"running {script_name} on {settings.workers} workers (time budget {settings.time_budget_s:.0f} s)")
    rec = run_submission(prepared, settings, args, echo)
    if rec.stopped_early:  # no complete epoch: no throughput to measure, no more baselines to run
        log(rec.stopped_early)
    else:
        baselines += [baseline(settings, prepared, before + i, log) for i in range(after)]
        if repeats >= 2 and agreeing_baselines(baselines, settings.baseline_tolerance) is None:
            log(f"the baselines disagree ({', '.join(f'{b:.1f}' for b in baselines if b)} images/s): "
                "the machine's speed changed; measuring once more")
            baselines.append(baseline(settings, prepared, len(baselines), log))
    return rec, baselines


def agreeing_baselines(values: Sequence[float | None], tolerance: float) -> list[float] | None:
    """The largest group of baseline measurements within ``tolerance`` (max/min - 1) of each
    other, at least two; None when no two agree (the machine's speed changed under the grading)."""
    vs = sorted(v for v in values if v)
    best: list[float] = []
    for i in range(len(vs)):
        group = [v for v in vs[i:] if v <= vs[i] * (1 + tolerance)]
        if len(group) > len(best):
            best = group
    return best if len(best) >= 2 else None
