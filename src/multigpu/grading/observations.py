"""What the grader saw of a run from outside the learner's processes, and the review flags it raises.

Two observers watch every submission's run (:func:`multigpu.grading.runs.run_submission`):

- :mod:`~multigpu.grading.reads`: the training files opened, set here against the samples the
  ranks claimed, epoch by epoch (:class:`reads.EpochReads`). A sample claimed but never opened
  fails ``sharded`` (:mod:`multigpu.grading.criteria.sharded`); images/s count only samples whose
  files were opened (:func:`seen_images`). A sample claimed in an epoch whose file was opened
  only in an earlier one was served from memory: a cache of the decoded data set is honest, and
  so the grader neither fails it nor confirms the work: the pass is HELD for review with the
  figures (:func:`flags`, kind ``reads``), as it is when the reads could not be watched.
- :mod:`~multigpu.grading.connections`: the TCP connections between the job's processes. Ranks
  that talk over connections Horovod's controller did not open (:func:`connections.extra_links`)
  moved something outside Horovod: the pass is HELD for review with the connections (kind
  ``network``).
- :mod:`~multigpu.grading.workprobe`: the batches the run's data loaders yielded and which of them
  reached a backward pass, counted in its processes before its own code ran. More images claimed
  as trained than reached a backward pass (beyond :data:`workprobe.TOLERANCE`), or no count at
  all: the pass is HELD for review with the figures, per round of gradient all-reduces too (kind
  ``work``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from multigpu.grading import connections, reads, workprobe
from multigpu.grading.connections import Link, Talk
from multigpu.grading.reads import EpochReads, ReadLog
from multigpu.grading.review import Flag
from multigpu.grading.workprobe import WorkLog


@dataclass(frozen=True)
class Observed:
    """The outside facts of one run."""

    #: claimed against read, per complete epoch (None: the reads were not watched)
    reads: tuple[EpochReads, ...] | None
    #: why the reads log is incomplete ("" when it is not)
    reads_lost: str
    #: connections between ranks that Horovod's controller did not open (None: not watched)
    foreign: tuple[Link, ...] | None
    #: the controller the grader launched the run with ("mpi" or "gloo")
    controller: str
    #: the probe's counts of batches and backward passes (None: not counted)
    work: WorkLog | None = None
    #: images the ranks claimed over the complete epochs (distinct per epoch, summed)
    claimed: int = 0
    #: complete rounds of gradient all-reduces in Horovod's timeline while the run trained
    rounds: int = 0
    workers: int = 1

    def never_read(self) -> list[EpochReads]:
        """The epochs with claimed samples whose files were never opened (nothing when the log
        is incomplete: a lost event is no evidence against anyone)."""
        return [] if self.reads is None or self.reads_lost else [r for r in self.reads if r.never]

    def from_memory(self) -> list[EpochReads]:
        return [] if self.reads is None else [r for r in self.reads if r.earlier]

    def figures(self) -> dict[str, Any]:
        """The measurements a result records."""
        out: dict[str, Any] = {"controller": self.controller}
        if self.reads is not None:
            out["reads_per_epoch"] = [r.to_dict() for r in self.reads]
            out["reads_lost"] = self.reads_lost or None
        if self.foreign is not None:
            out["foreign_connections"] = [x.describe() for x in self.foreign]
        if self.work is not None:
            out["work"] = {"claimed": self.claimed, "trained": self.work.trained, "processes": len(self.work.records),
                           "loader_batches": {str(k): v for k, v in self.work.batch_sizes().most_common(5)},
                           **self.per_round()}
        return out

    def per_round(self) -> dict[str, float]:
        """Images per worker and round of gradient all-reduces: claimed, and that reached a backward pass."""
        if not self.rounds or self.work is None:
            return {}
        per = self.rounds * self.workers
        return {"claimed_per_round": round(self.claimed / per, 1), "trained_per_round": round(self.work.trained / per, 1)}


def observe(observed: Mapping[str, Any], claimed: Mapping[int, set[int]], controller: str, rounds: int = 0,
            workers: int = 1) -> Observed:
    """:class:`Observed` from a run record's ``observed`` (the runner's observers: ``"reads"``, a
    :class:`reads.ReadLog`, ``"talk"``, a :class:`connections.Talk`, and ``"work"``, a
    :class:`workprobe.WorkLog`), the samples the ranks claimed per complete epoch (``claimed``:
    epoch -> the union of their indices) and the run's ``rounds`` of gradient all-reduces."""
    log, talk, work = observed.get("reads"), observed.get("talk"), observed.get("work")
    per_epoch = None
    lost = ""
    if isinstance(log, ReadLog):
        per_epoch = tuple(reads.epoch_reads(log, claimed))
        unseen = sorted(set(claimed) - {r.epoch for r in per_epoch})
        lost = log.lost or (f"the arrival of the checkpoints of epoch(s) {unseen} was not seen" if unseen else "")
    foreign = tuple(connections.extra_links(talk, controller)) if isinstance(talk, Talk) else None
    return Observed(per_epoch, lost, foreign, controller, work if isinstance(work, WorkLog) else None,
                    sum(len(s) for s in claimed.values()), rounds, workers)


def seen_images(observed: Observed | None, claimed: Mapping[int, int]) -> dict[int, int]:
    """Images per epoch that count for images/s: the claimed samples whose files the grader saw
    opened (in the epoch, or before it for a cache); ``claimed`` (epoch -> distinct claimed
    samples) where the reads were not watched or the log is incomplete (held for review then)."""
    if observed is None or observed.reads is None or observed.reads_lost:
        return dict(claimed)
    return {r.epoch: r.claimed - r.never for r in observed.reads}


def _epochs(items: Sequence[EpochReads]) -> str:
    es = [r.epoch for r in items]
    return f"epoch {es[0]}" if len(es) == 1 else f"epochs {', '.join(map(str, es))}"


def flags(observed: Observed | None) -> list[Flag]:
    """The review flags of what the grader saw (line 0: they are about the run, not a line)."""
    if observed is None:
        return []
    found = []
    if observed.reads is not None and observed.reads_lost:
        found.append(Flag("reads", 0, "", f"the grader could not watch every read of the training set "
                                          f"({observed.reads_lost}): the samples claimed are unconfirmed"))
    cached = observed.from_memory()
    if cached and not observed.never_read():
        figures = "; ".join(f"epoch {r.epoch}: {r.confirmed} of {r.claimed} claimed samples read in the epoch, "
                            f"{r.earlier} only earlier" for r in cached)
        found.append(Flag("reads", 0, figures,
                          f"{_epochs(cached)} trained on samples whose files were not opened in the epoch, only "
                          "before it: a cache of the decoded data set (honest), or less work than claimed; the "
                          "grader cannot tell, and counted them in images/s"))
    if observed.foreign:
        shown = "; ".join(x.describe() for x in observed.foreign[:6])
        more = f" and {len(observed.foreign) - 6} more" if len(observed.foreign) > 6 else ""
        opened = ("none between ranks (shared memory)" if observed.controller == "mpi" else
                  f"{connections.GLOO_LINKS_PER_PAIR} per pair of ranks, in processes that loaded Horovod")
        found.append(Flag("network", 0, shown + more,
                          f"the ranks held {len(observed.foreign)} TCP connection(s) Horovod did not open (over "
                          f"{observed.controller.upper()} Horovod opens {opened}): they moved something outside "
                          "Horovod"))
    return found + work_flags(observed)


def work_flags(observed: Observed) -> list[Flag]:
    """The ``work`` flag: images claimed as trained beyond those the probe saw reach a backward pass."""
    work = observed.work
    if work is None or not observed.claimed:
        return []
    sizes = ", ".join(f"{n} x {k}" for k, n in work.batch_sizes().most_common(3)) or "none"
    per = observed.per_round()
    rounds = (f"; per worker and round of gradient all-reduces: {per['claimed_per_round']} claimed, "
              f"{per['trained_per_round']} trained") if per else ""
    figures = (f"claimed {observed.claimed} images as trained, {work.trained} reached a backward pass "
               f"({len(work.records)} process record(s); loader batches {sizes}{rounds})")
    if work.lost:
        return [Flag("work", 0, figures, f"{work.lost}: the work per step cannot be confirmed")]
    if observed.claimed > work.trained * (1 + workprobe.TOLERANCE):
        why = ("no batch drawn from a torch DataLoader reached a backward pass, so the grader cannot confirm the "
               "images trained per step" if not work.trained else
               f"{observed.claimed - work.trained} of the images the ranks claimed as trained got no backward pass "
               "(run forward only, or never drawn from a DataLoader): counted as trained on the run's word")
        return [Flag("work", 0, figures, why)]
    return []
