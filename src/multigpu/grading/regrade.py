"""Grade a stored official result's kept source again and say whether its verdict holds::

    multigpu regrade grading/results/alice.json

The result keeps the exact bytes it graded, checked against their SHA-256
(:func:`multigpu.grading.audit.stored_source`); the settings stored with it are the profile; the
held-out set is made again from the seed kept beside it (:func:`multigpu.grading.audit.stored_holdout_seed`,
checked against the result's ``holdout_seed_sha256``; a fresh one where none was kept).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from multigpu.grading import audit, grader, rules
from multigpu.grading.grader import GradeResult


@dataclass
class Regrade:
    """A stored result graded again: ``holds`` when the verdict is the same; ``noisy`` when it
    differs only in throughput and the machine was too noisy to measure it this time (no
    verdict either way: grade again on a quiet machine)."""

    stored: dict[str, Any]
    result: GradeResult
    differences: list[str] = field(default_factory=list)

    @property
    def holds(self) -> bool:
        return not self.differences

    @property
    def noisy(self) -> bool:
        return bool(self.differences and self.result.measurements.get("noisy")
                    and all(d.startswith(("passed:", "criterion throughput:")) for d in self.differences))

    def report(self) -> str:
        old, new = self.stored.get("grader_version") or "unknown", self.result.grader_version
        m, n = self.stored.get("measurements") or {}, self.result.measurements
        figures = ", ".join(f"{k} {m.get(k)} -> {n.get(k)}" for k in ("accuracy_held", "efficiency", "throughput"))
        lines = [f"regrade of {self.stored.get('script')} (source {self.result.source_sha256[:16]}..., "
                 f"grader {old} then {new}): " + ("the verdict HOLDS" if self.holds else
                                                  "NOT REPRODUCED: the machine was too noisy to measure throughput "
                                                  "this time; grade again on a quiet machine" if self.noisy else
                                                  "the verdict DOES NOT HOLD"),
                 f"  measured: {figures}"]
        return "\n".join(lines + [f"  differs: {d}" for d in self.differences])


def verdict(result: dict[str, Any]) -> dict[str, Any]:
    """The parts of a result that make its verdict: passed, each criterion's pass, the hold."""
    return {"passed": bool(result.get("passed")),
            "criteria": {n: bool(c.get("passed")) for n, c in (result.get("criteria") or {}).items()},
            "held": bool((result.get("review") or {}).get("held"))}


def regrade(result_file: str | os.PathLike, *, log: Callable[[str], None] | None = None,
            hidden: tuple[Path, ...] = ()) -> Regrade:
    """Grade the source kept with ``result_file`` again, under the settings stored there (in the
    sandbox when the stored grading was sandboxed) and compare the verdicts."""
    result_file = Path(result_file).resolve()
    stored = json.loads(result_file.read_text())
    copy = audit.stored_source(result_file, stored)
    seed = audit.stored_holdout_seed(result_file, stored)
    settings = rules.Settings(**stored["settings"])
    result = grader.grade(copy, settings, sandbox="required" if stored.get("sandboxed") else "auto",
                          hidden=(result_file.parent, *hidden), log=log, reuse_earlier=False, holdout_seed=seed)
    result.script = stored.get("script", result.script)
    before, after = verdict(stored), verdict(result.to_dict())
    differences = [f"{key}: {before[key]} then {after[key]}" for key in ("passed", "held") if before[key] != after[key]]
    differences += [f"criterion {n}: {'pass' if before['criteria'].get(n) else 'fail'} then "
                    f"{'pass' if after['criteria'].get(n) else 'fail'}"
                    for n in sorted(set(before["criteria"]) | set(after["criteria"]))
                    if before["criteria"].get(n) != after["criteria"].get(n)]
    return Regrade(stored, result, differences)
