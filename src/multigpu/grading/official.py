"""The official grading of a workshop's assessments: the only source of a certificate's facts.

    multigpu grade-submissions          (make autograde runs it after nbgrader autograde)

For every ``grading/submitted/<student>/assessments/train.py`` it runs the grader itself,
inside the sandbox (:func:`grader.grade` with ``sandbox="required"``), outside any notebook a
learner could add cells to, and:

1. writes the result to ``grading/results/<student>.json``: a folder no sandboxed run can see
   or write (the sandbox hides every ``grading/`` folder), the one file ``make certificates``
   reads. It is the audit trail (:mod:`multigpu.grading.audit`): the exact graded source is kept
   beside it (``<student>.train.py``, its SHA-256 in ``source_sha256``), with the grader's
   version, the profile and every measurement, and the held-out set's secret seed
   (``<student>.holdout-seed``, mode 600; the result holds only its SHA-256); ``multigpu regrade``
   grades the copy again on the same held-out set;
2. sets the assessment's graded cells in the gradebook (nbgrader's manual score, which wins over
   the auto score) to the points of the matching criterion, so the gradebook's assessment score
   is this result whatever the learner's notebook printed or did in its kernel.

A pass whose source raises review flags (:mod:`multigpu.grading.review`) is HELD: its result says
``review.held`` and :func:`load_result` reports it as not passed until a person approves it with
``multigpu review`` (:func:`decide`, recorded in the result and in ``results/review-log.jsonl``).

The assessment notebook's own grading cell is the learner's check, not the grade: under
``make autograde`` it does not run the grader (``MULTIGPU_OFFICIAL_GRADING=1``), since its
verdict is replaced here anyway.
"""

from __future__ import annotations

import datetime as _dt
import getpass
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from multigpu.grading import audit, grader, review, rules

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


def record_in_gradebook(db_url: str, student: str, result: grader.GradeResult, assignment: str = ASSIGNMENT) -> str:
    """Set the assessment's graded cells of ``student`` to ``result``'s points (manual scores)."""
    from nbgrader.api import Gradebook, MissingEntry

    with Gradebook(db_url) as gb:
        try:
            gb.find_submission_notebook(NOTEBOOK, assignment, student)
        except MissingEntry:
            return "no autograded assessment in the gradebook (run nbgrader autograde first): not recorded"
        for name, criterion in result.criteria.items():
            try:
                grade = gb.find_grade(grade_id(name), NOTEBOOK, assignment, student)
            except MissingEntry:
                continue
            grade.manual_score = float(criterion.earned)
        gb.db.commit()
    return f"recorded {result.score}/{result.max_score} in the gradebook"


def grade_and_keep(script: Path, name: str, settings: rules.Settings, result_file: Path, *,
                   hidden: list[Path], log: Callable[[str], None], workdir: Path | None = None) -> grader.GradeResult:
    """One official grading: ``script`` graded in the sandbox (``name`` is how the result names it;
    its run in a new folder of ``workdir``, default the temporary folder), the graded bytes kept
    beside ``result_file`` (the audit trail :mod:`regrade` reads), the result saved."""
    result = grader.grade(script, settings, sandbox="required", hidden=hidden, log=log, workdir=workdir)
    result.script = name
    result_file.parent.mkdir(parents=True, exist_ok=True)
    if result.source_sha256:
        result.source_file = audit.keep_source(script, result_file, result.source_sha256)
    if result.holdout_seed is not None:  # for a regrade; the result itself records only its hash
        audit.keep_holdout_seed(result_file, result.holdout_seed)
    grader.save_result(result, result_file)
    return result


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
        path = result_path(grading, student)
        result = grade_and_keep(script, f"{student}/{ASSIGNMENT}/train.py", settings, path, hidden=[grading],
                                log=lambda m: log(f"    {m}"))
        note = record_in_gradebook(db_url, student, result) if (grading / "gradebook.db").exists() else "no gradebook"
        verdict = ("PASSED, HELD FOR REVIEW (multigpu review)" if result.held
                   else "PASSED" if result.passed else "not passed")
        log(f"    {student}: {result.score}/{result.max_score} {verdict}; {note}")
        out.append(Graded(student, result, path, note))
    return out


def load_result(grading: str | os.PathLike, student: str) -> dict | None:
    """The official result of ``student`` (None when there is none). A pass held for review and
    not approved reads as not passed (``passed`` False, ``withheld`` says why): whoever certifies
    from it sees no pass until a person approved it."""
    try:
        result = json.loads(result_path(Path(grading), student).read_text())
    except (OSError, ValueError):
        return None
    why = withheld(result)
    return {**result, "passed": False, "withheld": why} if why else result


def withheld(result: dict[str, Any]) -> str:
    """Why a passing result may not be certified yet ("" when nothing holds it back)."""
    rv = result.get("review") or {}
    if not result.get("passed") or review.released(rv):
        return ""
    decision = rv.get("decision") or {}
    if decision:
        return f"rejected on review by {decision.get('by')}: {decision.get('reason')}"
    return f"held for review ({review.summary(rv.get('flags') or [])}): run multigpu review"


def held(grading: str | os.PathLike) -> list[tuple[str, dict[str, Any]]]:
    """``(student, result)`` of every official result held for review, decided or not."""
    folder = Path(grading) / "results"
    out = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            result = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if (result.get("review") or {}).get("held"):
            out.append((path.stem, result))
    return out


def decide(grading: str | os.PathLike, student: str, *, approve: bool, reason: str, by: str | None = None) -> dict:
    """Record a person's decision on a held pass: in the result (``review.decision``) and, one line
    each, in ``results/review-log.jsonl``. Returns the decision."""
    if not reason.strip():
        raise ValueError("a review decision needs a reason")
    path = result_path(Path(grading), student)
    try:
        result = json.loads(path.read_text())
    except (OSError, ValueError):
        raise ValueError(f"no official result for {student} ({path})") from None
    if not (result.get("review") or {}).get("held"):
        raise ValueError(f"{student}'s result is not held for review")
    decision = {"approved": approve, "reason": reason.strip(), "by": by or getpass.getuser(),
                "at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
                "source_sha256": result.get("source_sha256")}
    result["review"]["decision"] = decision
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)
    with open(path.parent / "review-log.jsonl", "a") as log:
        log.write(json.dumps({"student": student, **decision}, sort_keys=True) + "\n")
    return decision
