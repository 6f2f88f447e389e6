"""What a grading gives back: a :class:`GradeResult` of :class:`Criterion` verdicts (saved as
JSON by :func:`save_result`), or a :class:`GradingUnavailable` error for the operator when the
machine cannot give a verdict."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from multigpu.grading import review
from multigpu.grading.rules import RESULT_FILE, Settings


@dataclass
class Criterion:
    name: str
    points: int
    passed: bool
    message: str
    #: the figures this criterion measured, merged into :attr:`GradeResult.measurements`
    measured: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def earned(self) -> int:
        return self.points if self.passed else 0


@dataclass
class GradeResult:
    """A grading: per-criterion verdicts, the measurements behind them and the settings used."""

    script: str
    settings: Settings
    criteria: dict[str, Criterion]
    measurements: dict[str, Any] = field(default_factory=dict)
    #: ran inside the sandbox (a certificate needs it)
    sandboxed: bool = False
    #: SHA-256 of the graded source's bytes ("" when there was none)
    source_sha256: str = ""
    #: the grader that gave the verdict: :func:`audit.grader_version`
    grader_version: str = ""
    #: what a person must look at before a pass is certified: :func:`review.record`
    review: dict[str, Any] = field(default_factory=lambda: review.record([], False))
    #: the kept copy of the graded source, next to the saved result (official results: :func:`audit.keep_source`)
    source_file: str = ""
    #: SHA-256 of the held-out set's secret seed (:func:`audit.seed_digest`): the result commits to
    #: the seed without telling it
    holdout_seed_sha256: str = ""
    #: the secret seed itself: never saved with the result (:meth:`to_dict`); an official grading
    #: keeps it in the grader's private folder for a regrade (:func:`audit.keep_holdout_seed`)
    holdout_seed: int | None = field(default=None, repr=False, compare=False)

    @property
    def score(self) -> int:
        return sum(c.earned for c in self.criteria.values())

    @property
    def max_score(self) -> int:
        return sum(c.points for c in self.criteria.values())

    @property
    def passed(self) -> bool:
        """Every criterion passed (a pass held for review is still a pass, not yet certified)."""
        return self.score == self.max_score

    @property
    def held(self) -> bool:
        """A pass held for review until a person approves it: see :mod:`multigpu.grading.review`."""
        return review.awaits_decision(self.review)

    def ok(self, name: str) -> bool:
        return self.criteria[name].passed

    def message(self, name: str) -> str:
        c = self.criteria[name]
        return f"{'PASS' if c.passed else 'FAIL'} {name} ({c.earned}/{c.points}): {c.message}"

    def report(self) -> str:
        m = self.measurements
        lines = [f"Grading of {self.script} (profile '{self.settings.profile}'): "
                 f"{self.score}/{self.max_score} points, {'PASSED' if self.passed else 'NOT PASSED'}"]
        if not self.sandboxed:
            lines.append(f"  NOT SANDBOXED: {self.measurements.get('sandbox', 'the run was not sandboxed')} "
                         "(the verdict is yours to see; a certificate needs a sandboxed grading)")
        lines += ["  " + self.message(name) for name in self.criteria]
        if self.review["flags"]:
            lines.append(("  HELD FOR REVIEW (no certificate until the instructor approves it): " if self.review["held"]
                          else "  review flags (a pass would be held for review): ")
                         + review.summary(self.review["flags"]))
        facts = [f"{k} {m[k]:.3f}" if isinstance(m.get(k), float) else f"{k} {m[k]}"
                 for k in ("accuracy_held", "time_to_accuracy_s", "throughput", "ideal", "efficiency", "run_s")
                 if m.get(k) is not None]
        if facts:
            lines.append("  measured: " + ", ".join(facts))
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "script": self.script,
            "passed": self.passed,
            "sandboxed": self.sandboxed,
            "score": self.score,
            "max_score": self.max_score,
            "settings": self.settings.to_dict(),
            "criteria": {n: {"points": c.points, "passed": c.passed, "message": c.message}
                         for n, c in self.criteria.items()},
            "measurements": self.measurements,
            "source_sha256": self.source_sha256,
            "grader_version": self.grader_version,
            "review": self.review,
            "source_file": self.source_file,
            "holdout_seed_sha256": self.holdout_seed_sha256,
        }


def result_from_dict(saved: dict[str, Any]) -> GradeResult:
    """The :class:`GradeResult` that :meth:`GradeResult.to_dict` saved."""
    criteria = {n: Criterion(n, c["points"], c["passed"], c["message"]) for n, c in saved["criteria"].items()}
    return GradeResult(saved["script"], Settings(**saved["settings"]), criteria, saved["measurements"],
                       sandboxed=saved["sandboxed"], source_sha256=saved["source_sha256"],
                       grader_version=saved["grader_version"], review=saved["review"],
                       source_file=saved.get("source_file", ""))


def save_result(result: GradeResult, path: str | os.PathLike = RESULT_FILE) -> Path:
    """Write ``result`` as JSON (``grading-result.json`` next to the notebook by default)."""
    path = Path(path)
    path.write_text(json.dumps(result.to_dict(), indent=2, sort_keys=True) + "\n")
    return path


class GradingUnavailable(RuntimeError):
    """This machine cannot give the verdict asked for: an error for the operator, no grade."""


class SandboxUnavailable(GradingUnavailable):
    """Grading for a certificate was asked for where the sandbox cannot start."""


class HorovodUnavailable(GradingUnavailable):
    """The grading environment cannot run Horovod where submissions run: no verdict is given
    (every submission would fail its workers criterion through no fault of its own)."""
