"""The run stage of a grading: the submission on ``settings.workers`` workers under the time
budget (:func:`run_submission`, stopped early by :func:`lone_rank0` when it cannot earn a point),
why a run did not end cleanly (:func:`run_failure`) and a run's images/s by the grader's clock
(:func:`run_throughput`)."""

from __future__ import annotations

import os
from collections.abc import Sequence

from multigpu.core import data, layout
from multigpu.grading import connections, reads, runner, workprobe
from multigpu.grading.preparation import Prepared, mode_env
from multigpu.grading.rules import Settings
from multigpu.running.launch import worker_errors


def run_submission(prepared: Prepared, settings: Settings, args: Sequence[str] = (),
                   echo: bool = False) -> runner.RunRecord:
    """Run the submission's scratch copy with ``horovodrun -np settings.workers`` in the sandbox,
    told where to write its checkpoints and Horovod's timeline (Horovod's own account of the run:
    rank 0 records every collective), watched from outside: the training files it opens
    (:class:`reads.ReadWatch`, observed as ``"reads"``) and the connections between its processes
    (:class:`connections.TalkWatch`, ``"talk"``); its batches and backward passes counted by the
    grader's probe in its processes (:mod:`workprobe`, ``"work"``)."""
    ckpt = prepared.checkpoints
    samples = [path for path, _ in data.JPEGFolder(prepared.train_root, None, split="train").samples]
    observers: dict[str, runner.Observer] = {"reads": reads.ReadWatch(prepared.train_root / "train", samples, ckpt),
                                             "talk": connections.TalkWatch(),
                                             "work": workprobe.WorkWatch(prepared.work_records)}
    # the probe first on the path (its sitecustomize), then the package, as sandbox.environment has it
    python_path = f"{prepared.work_probe}{os.pathsep}{layout.IMPORT_ROOT}"
    return runner.run_untrusted(prepared.submission / "train.py", prepared.submission, workers=settings.workers,
                                timeout=settings.time_budget_s, max_output_bytes=settings.max_output_bytes,
                                max_memory_bytes=settings.max_memory_bytes, args=args, echo=echo, checkpoint_dir=ckpt,
                                env={"MULTIGPU_ASSESSMENT_DATA": str(prepared.train_root),
                                     "MULTIGPU_CHECKPOINT_DIR": str(ckpt), "HOROVOD_TIMELINE": str(prepared.timeline),
                                     workprobe.RECORDS_VAR: str(prepared.work_records), "PYTHONPATH": python_path,
                                     **mode_env(settings)},
                                sandbox=prepared.sandbox, stop_if=lone_rank0(settings.workers), observers=observers)


#: The least time a run goes on after rank 0's first checkpoint while no other rank has saved one
#: (see :func:`lone_rank0`); the grace is also at least a quarter of the time rank 0 took to get
#: there. The ranks of a data-parallel run finish an epoch within a step of each other, and a
#: script that saves every rank's checkpoints in one burst at the end does so within a second.
LONE_RANK0_GRACE_S = 20.0


def lone_rank0(workers: int, grace_s: float = LONE_RANK0_GRACE_S) -> runner.StopRule:
    """A stop rule for :func:`runner.run_untrusted`: stop a run in which only rank 0 ever saved,
    once the grace after its first checkpoint has passed. Such a run cannot earn a point (every
    criterion needs every rank's checkpoints of an epoch), and an unconverted script (4 copies of
    one worker, each on all the data, all saving as rank 0) would otherwise run for most of the
    time budget."""
    def rule(seen: dict[tuple[int, int], float], elapsed: float) -> str:
        first = seen.get((0, 1))
        if workers < 2 or first is None or any(r != 0 for r, _ in seen):
            return ""
        grace = max(grace_s, 0.25 * first)
        if elapsed - first < grace:
            return ""
        return (f"stopped early, {elapsed:.0f} s into the run: rank 0 saved epoch 1 and {grace:.0f} s later no other "
                "rank had saved a checkpoint, so the run could not earn a point")
    return rule


def run_failure(rec: runner.RunRecord, settings: Settings) -> str | None:
    """Why a run did not end cleanly, in words a learner can act on (None: it did)."""
    if rec.stopped_early:
        return rec.stopped_early
    if rec.timed_out:
        return (f"the run did not finish within the time budget T = {settings.time_budget_s:.0f} s and was stopped "
                "(a rank waiting in a collective another never joined, an endless loop, or too many epochs). "
                f"Last output:\n{rec.tail[-1500:]}")
    if rec.output_exceeded:
        return (f"the run printed more than {settings.max_output_bytes:,} bytes and was stopped: print once per "
                f"epoch on rank 0 only. Last output:\n{rec.tail[-800:]}")
    if rec.memory_exceeded:
        return (f"the run's processes held more than {settings.max_memory_bytes / 2**30:.0f} GiB of memory together "
                "and were stopped: keep one model and a few batches per worker in memory")
    if rec.returncode != 0:
        lines = rec.tail.splitlines()
        return f"the run ended with exit code {rec.returncode}. " + worker_errors(lines, limit=20)
    return None


def run_throughput(record: runner.RunRecord, images: dict[int, int]) -> float | None:
    """Aggregate images/s of a run from the moments its checkpoints appeared (the grader's clock).

    Epoch 1 is warm-up (start-up, data loading, first steps) and not counted. The time of
    epochs 2..n is at least half their share of the run up to the last checkpoint, so a script
    that saves every checkpoint in one burst at the end gains at most a factor of two.
    None when fewer than two epochs completed.
    """
    epochs = sorted(e for e in record.epoch_times if e in images)
    if len(epochs) < 2 or epochs[0] != 1:
        return None
    last = epochs[-1]
    counted = sum(images[e] for e in epochs[1:])
    t_last = record.epoch_times[last]
    elapsed = max(t_last - record.epoch_times[1], 0.5 * t_last * (len(epochs) - 1) / len(epochs))
    return counted / elapsed if elapsed > 0 else None
