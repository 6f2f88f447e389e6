"""``workers``: the run ended cleanly and every rank saved a checkpoint at the end of every epoch."""

from __future__ import annotations

from multigpu.grading.evidence import Evidence
from multigpu.grading.result import Criterion
from multigpu.grading.rules import Settings

NAME = "workers"
POINTS = 2
#: evidence this criterion cannot be judged without (none: it says why there is none)
REQUIRES: tuple[str, ...] = ()
#: earlier criteria whose verdicts it reads
AFTER: tuple[str, ...] = ()

LAB3_HABIT = ("only rank 0 saved. Lab 3 saves on rank 0 only (one copy of the model is enough there); "
              "the assessment's contract is different: EVERY rank calls save_checkpoint(..., hvd.rank(), "
              "indices) at the end of every epoch, so the grader can check each rank's weights and shard")
OWN_RANK = ("every worker must save with its own hvd.rank() (did the script call hvd.init()? an "
            "unconverted script runs 4 independent copies that all save as rank 0)")
NO_CHECKPOINT = ("the run left no checkpoint: call save_checkpoint(..., rank, indices) on every "
                 "rank at the end of every epoch")


def judge(evidence: Evidence, settings: Settings) -> Criterion:
    """A clean run, and a checkpoint from every rank for every epoch (the root cause first: an
    unconverted script saves as rank 0 only)."""
    n, found, failure, complete = settings.workers, evidence.found, evidence.failure, evidence.complete
    ranks = {r for r, _ in found}
    epochs = sorted({e for _, e in found})
    missing_ranks = sorted(set(range(n)) - ranks)
    extra_ranks = sorted(ranks - set(range(n)))
    passed, message = False, ""
    if found and missing_ranks:
        also = f" The run also failed: {failure.splitlines()[0]}" if failure else ""
        why = LAB3_HABIT if evidence.uses_horovod and ranks == {0} else OWN_RANK
        message = f"no checkpoint from rank {', '.join(map(str, missing_ranks))} of {n}: {why}." + also
    elif failure:
        message = failure
    elif not found:
        message = NO_CHECKPOINT
    elif extra_ranks:
        message = f"checkpoints from rank(s) {extra_ranks} that do not exist in a {n}-worker run"
    elif len(complete) != len(epochs) or epochs != list(range(1, len(epochs) + 1)):
        gaps = [e for e in range(1, max(epochs) + 1) if e not in complete]
        message = f"epoch(s) {gaps} lack a checkpoint from some rank: every rank saves every epoch"
    else:
        passed, message = True, (f"{n} workers ran {len(complete)} epochs in {evidence.run.wall_s:.0f} s "
                                 f"(budget {settings.time_budget_s:.0f} s), every rank saved every epoch")
    return Criterion(NAME, POINTS, passed, message, measured={"epochs": len(complete)})
