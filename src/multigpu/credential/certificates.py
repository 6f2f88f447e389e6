"""Signed, verifiable certificates of the final assessment, as Open Badges 3.0 credentials.

A certificate is two files: ``<id>.pdf`` for people, and ``<id>.json`` for machines: an Open
Badges 3.0 credential (:mod:`multigpu.credential.openbadges`) signed with the course's Ed25519 key,
which states the record (name, course, date, the grader's measurements and thresholds, the
graded source's SHA-256 and the grader's version, the PDF's SHA-256) and points to the course's
revocation list (:mod:`multigpu.credential.status_list`). ``multigpu verify CERT.json --public-key
course-key.pub`` checks all of it: any changed byte of the credential or of the PDF, or a signature
by another key, is reported, and so is a revoked certificate, with the reason. Other tools read
the same file: any Open Badges 3.0 verifier that fetches the course's published key, and the
course's static page ``verify.html`` (``multigpu publish-issuer``).

The course key lives OUTSIDE the repository (default ``~/.config/multigpu/course-key``, or
``$MULTIGPU_COURSE_KEY``), readable by its owner only; only ``course-key.pub`` is shared. The
certificates folder keeps the issuer's book (``issuer-state.json``: which certificate has which
index of the status list, the revocations) and the signed list itself (``status-list.jwt``).

:func:`certify` is what ``make certificates`` runs after ``make autograde``: a certificate for
each student whose assessment has full marks in the gradebook, whose labs reach
:data:`LABS_REQUIRED` of their points, and whose official result (``grading/results/<id>.json``,
written by :mod:`multigpu.grading.official` from the grader's own sandboxed run, outside any
notebook) says passed, sandboxed, on a real profile, and not held for review unless a person
approved it. Nothing a submission wrote is read.

The jobs live apart: :mod:`~multigpu.credential.course_key` (the key pair),
:mod:`~multigpu.credential.credentials` (a certificate's files: issue, verify, revoke, publish) and
this module (who gets one: :func:`certify`); the names callers use are importable from here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from multigpu.credential.course_key import default_key_path, keygen, load_private_key, load_public_key, public_key_path
from multigpu.credential.credentials import (
    COURSE,
    LOCAL_ISSUER_URL,
    CertificateError,
    Revoked,
    Verified,
    issue,
    make_record,
    publish_issuer,
    resolve_issuer_url,
    revoke,
    verify,
)

#: Fraction of the lab points (assignment ``notebooks``) a certificate also requires.
LABS_REQUIRED = 0.6

__all__ = ["COURSE", "LABS_REQUIRED", "LOCAL_ISSUER_URL", "CertificateError", "Decision", "Revoked", "Verified",
           "certify", "default_key_path", "held_for_review", "issue", "keygen", "load_private_key", "load_public_key",
           "make_record", "public_key_path", "publish_issuer", "resolve_issuer_url", "revoke", "verify"]


# ----------------------------------------------------------------------------- certify a workshop


@dataclass
class Decision:
    student: str
    certified: bool
    reason: str
    files: list[Path] = field(default_factory=list)


def _score(gb: Any, assignment: str, student: str) -> tuple[float, float] | None:
    from nbgrader.api import MissingEntry

    try:
        sub = gb.find_submission(assignment, student)
    except MissingEntry:
        return None
    return float(sub.score), float(sub.max_score)


def held_for_review(result: dict[str, Any]) -> str:
    """Why a passing result is held back for review ("" when nothing holds it)."""
    from multigpu.grading import official

    return official.withheld(result)


def certify(db_url: str, grading: str | os.PathLike, outdir: str | os.PathLike, *,
            key: Ed25519PrivateKey, labs_required: float = LABS_REQUIRED,
            issuer_url: str | None = None) -> list[Decision]:
    """Decide, for every student in the gradebook, and issue certificates to those who qualify.
    ``grading`` is the course's grading folder, whose ``results/`` hold the official results."""
    from nbgrader.api import Gradebook

    from multigpu.grading import official

    decisions: list[Decision] = []
    with Gradebook(db_url) as gb:
        for student in sorted(gb.students, key=lambda s: s.id):
            sid = student.id
            name = " ".join(p for p in (student.first_name, student.last_name) if p) or sid
            assessment = _score(gb, "assessments", sid)
            labs = _score(gb, "notebooks", sid)
            result_file = official.result_path(Path(grading), sid)
            if assessment is None:
                decisions.append(Decision(sid, False, "no autograded assessment submission"))
                continue
            if assessment[1] == 0 or assessment[0] < assessment[1]:
                decisions.append(Decision(sid, False, f"assessment not passed ({assessment[0]:g}/{assessment[1]:g} "
                                                      "points; a pass needs all of them)"))
                continue
            if labs is None or labs[1] == 0 or labs[0] < labs_required * labs[1]:
                got = f"{labs[0]:g}/{labs[1]:g}" if labs else "no submission"
                decisions.append(Decision(sid, False, f"labs below {labs_required:.0%} of their points ({got})"))
                continue
            result = official.load_result(grading, sid)
            if result is None:
                decisions.append(Decision(sid, False, f"no official result {result_file}: run make autograde "
                                                      "(it grades every train.py in the sandbox)"))
                continue
            profile = (result.get("settings") or {}).get("profile")
            if result.get("withheld"):  # a pass held for review that no person approved
                decisions.append(Decision(sid, False, result["withheld"]))
                continue
            if not result.get("passed"):
                decisions.append(Decision(sid, False, "the official result does not say passed (gradebook and "
                                                      f"{result_file.name} disagree: re-run make autograde)"))
                continue
            if not result.get("sandboxed"):
                decisions.append(Decision(sid, False, "the official result was not graded in the sandbox: "
                                                      "install bubblewrap and re-run make autograde"))
                continue
            if profile not in ("cpu", "gpu"):
                decisions.append(Decision(sid, False, f"the grader ran with the '{profile}' profile (tests only): "
                                                      "grade again with the cpu or gpu profile"))
                continue
            record = make_record(name, sid, result, labs={"score": labs[0], "max_score": labs[1],
                                                          "required_fraction": labs_required})
            pdf, js = issue(record, key, outdir, issuer_url=issuer_url)
            decisions.append(Decision(sid, True, "assessment passed, labs done", [pdf, js]))
    return decisions
