"""The criteria of the assessment, judged in the order of :data:`CRITERIA`.

A criterion is a module with ``NAME``, ``POINTS``, ``REQUIRES`` (the evidence it cannot be judged
without: when :attr:`Evidence.unavailable` names one, the criterion fails with the reason given
there), ``AFTER`` (the earlier criteria whose verdicts it reads, in :attr:`Evidence.verdicts`)
and ``judge(evidence, settings) -> Criterion``, its messages beside it. A submission passes with
every criterion. Adding one: a new module here and a line in :data:`CRITERIA`.
"""

from __future__ import annotations

import dataclasses
from types import MappingProxyType
from typing import Protocol

from multigpu.grading.criteria import accuracy, identical, sharded, throughput, workers
from multigpu.grading.evidence import Evidence
from multigpu.grading.result import Criterion
from multigpu.grading.rules import Settings


class Judge(Protocol):
    """What a criterion module provides."""

    NAME: str
    POINTS: int
    REQUIRES: tuple[str, ...]
    AFTER: tuple[str, ...]

    def judge(self, evidence: Evidence, settings: Settings) -> Criterion: ...


#: The criteria in the order they are judged (and reported).
CRITERIA: tuple[Judge, ...] = (workers, identical, sharded, accuracy, throughput)
#: Criterion -> points. A submission passes with all of them.
POINTS: dict[str, int] = {c.NAME: c.POINTS for c in CRITERIA}


def check_order(criteria: tuple[Judge, ...]) -> None:
    """Raise ValueError unless every criterion's ``AFTER`` names criteria judged before it."""
    before: set[str] = set()
    for c in criteria:
        if not set(c.AFTER) <= before:
            raise ValueError(f"criterion {c.NAME} reads {sorted(set(c.AFTER) - before)}, not judged before it")
        before.add(c.NAME)


check_order(CRITERIA)


def judge_all(evidence: Evidence, settings: Settings, criteria: tuple[Judge, ...] = CRITERIA) -> dict[str, Criterion]:
    """The verdict of each criterion on ``evidence``, in order: a criterion whose required
    evidence is unavailable fails with the reason; the others judge, given the earlier verdicts
    they name in ``AFTER``."""
    verdicts: dict[str, Criterion] = {}
    for c in criteria:
        missing = [evidence.unavailable[need] for need in c.REQUIRES if need in evidence.unavailable]
        if missing:
            verdicts[c.NAME] = Criterion(c.NAME, c.POINTS, False, missing[0])
            continue
        earlier = MappingProxyType({name: verdicts[name] for name in c.AFTER})
        verdicts[c.NAME] = c.judge(dataclasses.replace(evidence, verdicts=earlier), settings)
    return verdicts
