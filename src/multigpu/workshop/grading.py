"""One grading job of the hub's queue (``multigpu workshop grade-job ID``, started by the service
on the cores kept for grading, in a control group of its own; it runs as root and never runs
learner code as root):

1. the submission is collected into the course's ``submitted/``, replacing an earlier one: from the
   copy the service took when it arrived (:mod:`submissions`: checked, root's, never the
   exchange's folder again); on Kubernetes downloaded from ngshare (:mod:`ngshare`), which names
   the submitter by their hub token and keeps submissions as they were sent;
2. nbgrader autogrades it and writes its feedback as the unprivileged :data:`layout.GRADER_USER`
   in the grading sandbox, no solution within reach (:mod:`autograde`); the scores, recomputed
   from the notebooks, go into the instructor's gradebook and the feedback is released to that
   learner (their Assignments tab: Fetch Feedback);
3. for the assessment, the official grading of its ``train.py`` (the sandboxed grader,
   ``multigpu.grading.grader.grade`` with the sandbox required, the script run as an
   unprivileged account) sets the assessment's points in the gradebook, writes the result to
   ``state/results/<learner>.json`` and, where it passed and the released labs are done, issues
   a signed certificate (``multigpu verify`` checks it).
"""

from __future__ import annotations

import os
import pwd
import shutil
import time
from pathlib import Path
from typing import Any, Callable

from multigpu.workshop import disks, layout, ngshare, safefiles, submissions
from multigpu.workshop.autograde import JobFailed, autograde, hidden_from_learners, run_suffix
from multigpu.workshop.jobs import Job
from multigpu.workshop.layout import Hub


def submission(job: Job) -> ngshare.Submission:
    return ngshare.Submission(job.student, job.assignment, job.submitted)


def collect(hub: Hub, job: Job) -> Path:
    """Step 1: the submission in ``course/submitted/<student>/<assignment>/``."""
    from multigpu.grading.rules import RESULT_FILE

    if not submissions.valid_parts(job.student, job.assignment):
        raise JobFailed(f"{job.student!r} and {job.assignment!r} are not a login and an assignment: not graded")
    dest = hub.course / "submitted" / job.student / job.assignment
    left_out = (RESULT_FILE, ".ipynb_checkpoints")  # a grading result comes from the grader's own run
    if dest.exists():
        shutil.rmtree(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    source = ngshare.Ngshare.from_env()
    if source is None:
        taken = submissions.copy_path(hub, job.submission)
        if not taken.is_dir():
            raise JobFailed(f"the copy of the submission {job.submission} taken when it arrived is gone: submit again")
        safefiles.copy_tree(taken, dest, owner=0, caps=safefiles.SUBMISSION, skip=left_out)
        return dest
    try:
        source.download(submission(job), dest, skip=left_out)
    except ngshare.NgshareError as e:
        raise JobFailed(f"the submission could not be read from the exchange ({e}): submit again, "
                        "or ask the instructor") from None
    return dest


def released_labs(hub: Hub) -> list[str]:
    source = ngshare.Ngshare.from_env()
    if source is not None:
        return [a for a in source.assignments() if a.startswith("lab-")]
    outbound = hub.exchange / layout.COURSE_ID / "outbound"
    return sorted(p.name for p in outbound.iterdir() if p.name.startswith("lab-")) if outbound.is_dir() else []


def labs_score(hub: Hub, student: str) -> dict[str, Any]:
    """The learner's points over the labs released so far (unsubmitted ones count 0)."""
    from nbgrader.api import Gradebook, MissingEntry

    score = total = 0.0
    with Gradebook(hub.db_url) as gb:
        for lab in released_labs(hub):
            try:
                total += float(gb.find_assignment(lab).max_score)
            except MissingEntry:
                continue
            try:
                score += float(gb.find_submission(lab, student).score)
            except MissingEntry:
                pass
    return {"score": score, "max_score": total, "labs": released_labs(hub)}


def official(hub: Hub, job: Job, submitted: Path, space: Path, log: Callable[[str], None]) -> dict[str, Any]:
    """Step 3: the sandboxed official grading of the assessment's train.py (its run in a folder of
    the job's ``space``), its points in the gradebook, the result file and, where earned, the certificate."""
    from multigpu.grading import grader, rules
    from multigpu.grading import official as official_grading

    settings = rules.settings()
    script = submitted / "train.py"
    if not script.is_file():
        raise JobFailed("the submission has no train.py: submit the assessment folder with your converted train.py")
    log(f"official grading of train.py (sandboxed, profile '{settings.profile}')")
    try:
        result = official_grading.grade_and_keep(script, f"{job.student}/{layout.ASSESSMENT}/train.py", settings,
                                                 hub.results / f"{job.student}.json",
                                                 hidden=hidden_from_learners(hub), log=log, workdir=space)
    except grader.GradingUnavailable as e:
        raise JobFailed(f"the grading machine cannot grade right now ({e}); the instructor has been told, "
                        "your submission is kept") from None
    official_grading.record_in_gradebook(hub.db_url, job.student, result, layout.ASSESSMENT)
    out: dict[str, Any] = {"official": result.to_dict(), "report": result.report()}
    out.update(certify(hub, job.student))
    return out


def certify(hub: Hub, student: str) -> dict[str, Any]:
    """Issue the learner's certificate when their official result (``state/results``) passed on a
    real profile, sandboxed, not held for review, and the released labs have enough points; once
    per result. Runs after every job, so labs graded after the assessment count too.
    ``{"certificate": {"pdf", "json"} or None, "certificate_note": words}``."""
    import hashlib
    import json

    from multigpu.credential import certificates

    path = hub.results / f"{student}.json"
    if not path.is_file():
        return {"certificate": None, "certificate_note": "no official grading of the assessment yet"}
    raw = path.read_bytes()
    result = json.loads(raw)
    folder = hub.certificates / student
    marker = folder / "issued-for.json"
    digest = hashlib.sha256(raw).hexdigest()
    if marker.is_file():
        issued = json.loads(marker.read_text())
        if issued["result_sha256"] == digest:
            return {"certificate": issued["files"], "certificate_note": "certificate issued"}
    profile = (result.get("settings") or {}).get("profile")
    labs = labs_score(hub, student)
    held = certificates.held_for_review(result)
    if not result.get("passed"):
        note = "no certificate: the assessment did not pass (see the grader's report)"
    elif not result.get("sandboxed") or profile not in ("cpu", "gpu"):
        note = f"no certificate: graded with the '{profile}' profile" + ("" if result.get("sandboxed") else ", unsandboxed") + " (tests only)"
    elif held:
        note = f"passed, held for review: the instructor looks at it before a certificate is issued ({held})"
    elif labs["max_score"] and labs["score"] < certificates.LABS_REQUIRED * labs["max_score"]:
        note = (f"no certificate yet: the released labs need {certificates.LABS_REQUIRED:.0%} of their points "
                f"({labs['score']:g}/{labs['max_score']:g} so far); it is issued when your labs reach it")
    else:
        key = certificates.load_private_key(os.environ.get("MULTIGPU_CERTIFICATE_KEY") or None)
        record = certificates.make_record(student, student, result, labs={
            "score": labs["score"], "max_score": labs["max_score"], "required_fraction": certificates.LABS_REQUIRED})
        pdf, js = certificates.issue(record, key, folder, issuer_dir=hub.certificates)  # one status list for the hub
        files = {"pdf": str(pdf), "json": str(js)}
        marker.write_text(json.dumps({"result_sha256": digest, "files": files}))
        return {"certificate": files, "certificate_note": "certificate issued"}
    return {"certificate": None, "certificate_note": note}


def run(hub: Hub, job: Job, log: Callable[[str], None] = print) -> tuple[str, str, dict[str, Any]]:
    """Grade ``job``; ``(state, message for the learner, result)``."""
    start = time.monotonic()
    try:
        with disks.grading_space(hub, job.id, pwd.getpwnam(layout.GRADER_USER).pw_gid, log, run_suffix()) as space:
            try:
                state, message, result = steps(hub, job, space, log)
            except JobFailed as e:
                raise JobFailed(disks.when_full(space) + str(e)) from None
    except JobFailed as e:
        return "failed", str(e), {"seconds": round(time.monotonic() - start, 1)}
    result["seconds"] = round(time.monotonic() - start, 1)
    return state, message, result


def steps(hub: Hub, job: Job, space: Path, log: Callable[[str], None]) -> tuple[str, str, dict[str, Any]]:
    """The steps of :func:`run`; the official run works in the job's folder ``space``."""
    submitted = collect(hub, job)
    result: dict[str, Any] = {"autograde": autograde(hub, job, submitted, log)}
    auto = result["autograde"]
    message = f"notebooks {auto['score']:g}/{auto['max_score']:g} points; feedback released (Assignments tab: Fetch Feedback)"
    if job.assignment != layout.ASSESSMENT and (hub.results / f"{job.student}.json").is_file():
        result.update(certify(hub, job.student))  # these lab points may complete a passed assessment's certificate
        if result["certificate"]:
            message += "; " + result["certificate_note"]
    if job.assignment == layout.ASSESSMENT:
        result.update(official(hub, job, submitted, space, log))
        r = result["official"]
        message = (f"assessment {'PASSED' if r['passed'] else 'not passed'}: {r['score']}/{r['max_score']} points "
                   f"from the official grading; {result['certificate_note']}")
    return "done", message, result
