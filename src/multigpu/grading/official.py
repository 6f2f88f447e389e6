"""The official grading of a workshop's assessments: the only source of a certificate's facts.

    multigpu grade-submissions          (make autograde runs it after nbgrader autograde)

For every ``grading/submitted/<student>/assessments/train.py`` it runs the grader itself,
inside the sandbox (:func:`grader.grade` with ``sandbox="required"``), outside any notebook a
learner could add cells to, and:

1. writes the result to ``grading/results/<student>.json``: a folder no sandboxed run can see
   or write (the sandbox hides every ``grading/`` folder), the one file ``make certificates``
   reads;
2. sets the assessment's graded cells in the gradebook (nbgrader's manual score, which wins over
   the auto score) to the points of the matching criterion, so the gradebook's assessment score
   is this result whatever the learner's notebook printed or did in its kernel.

The assessment notebook's own grading cell is the learner's check, not the grade: under
``make autograde`` it does not run the grader (``MULTIGPU_OFFICIAL_GRADING=1``), since its
verdict is replaced here anyway.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from multigpu.grading import grader, rules

ASSIGNMENT = "assessments"
NOTEBOOK = "assessment"
#: Set for ``nbgrader autograde``: the notebook's grading cell leaves the grading to this module.
OFFICIAL_VAR = "MULTIGPU_OFFICIAL_GRADING"


def grade_id(criterion: str) -> str:
    """The assessment notebook's graded cell of a criterion."""
    return f"test_{criterion}"


def official_run() -> bool:
    """True inside ``nbgrader autograde`` of the official grading (the notebook skips its own grading)."""
    return os.environ.get(OFFICIAL_VAR, "") not in ("", "0")


def result_path(grading: Path, student: str) -> Path:
    return grading / "results" / f"{student}.json"


@dataclass
class Graded:
    student: str
    result: grader.GradeResult
    path: Path
    gradebook: str  # what happened to the gradebook


def record_in_gradebook(db_url: str, student: str, result: grader.GradeResult) -> str:
    """Set the assessment's graded cells of ``student`` to ``result``'s points (manual scores)."""
    from nbgrader.api import Gradebook, MissingEntry

    with Gradebook(db_url) as gb:
        try:
            gb.find_submission_notebook(NOTEBOOK, ASSIGNMENT, student)
        except MissingEntry:
            return "no autograded assessment in the gradebook (run nbgrader autograde first): not recorded"
        for name, criterion in result.criteria.items():
            try:
                grade = gb.find_grade(grade_id(name), NOTEBOOK, ASSIGNMENT, student)
            except MissingEntry:
                continue
            grade.manual_score = float(criterion.earned)
        gb.db.commit()
    return f"recorded {result.score}/{result.max_score} in the gradebook"


def grade_submissions(
    grading: str | os.PathLike,
    settings: rules.Settings | None = None,
    *,
    students: list[str] | None = None,
    log: Callable[[str], None] = print,
) -> list[Graded]:
    """Grade every collected assessment under ``grading/submitted`` (see the module doc)."""
    grading = Path(grading).resolve()
    settings = settings or rules.settings()
    submitted = grading / "submitted"
    db_url = f"sqlite:///{grading / 'gradebook.db'}"
    found = sorted(p.name for p in submitted.iterdir() if (p / ASSIGNMENT).is_dir()) if submitted.is_dir() else []
    out: list[Graded] = []
    for i, student in enumerate(s for s in found if students is None or s in students):
        script = submitted / student / ASSIGNMENT / "train.py"
        log(f"[{i + 1}/{len(found)}] grading {student} (sandboxed, profile '{settings.profile}')")
        result = grader.grade(script, settings, sandbox="required", hidden=[grading],
                              log=lambda m: log(f"    {m}"))
        result.script = f"{student}/{ASSIGNMENT}/train.py"
        path = result_path(grading, student)
        path.parent.mkdir(parents=True, exist_ok=True)
        grader.save_result(result, path)
        note = record_in_gradebook(db_url, student, result) if (grading / "gradebook.db").exists() else "no gradebook"
        log(f"    {student}: {result.score}/{result.max_score} {'PASSED' if result.passed else 'not passed'}; {note}")
        out.append(Graded(student, result, path, note))
    return out


def load_result(grading: str | os.PathLike, student: str) -> dict | None:
    try:
        return json.loads(result_path(Path(grading), student).read_text())
    except (OSError, ValueError):
        return None
