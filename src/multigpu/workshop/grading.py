"""One grading job of the hub's queue (``multigpu workshop grade-job ID``, started by the service
on the cores kept for grading; it runs as root and never runs learner code as root):

1. the submission is checked (the folder in the exchange's inbound must belong to the account
   whose name it carries: nbgrader's exchange itself would take any name) and copied to the
   course's ``submitted/``, replacing an earlier one; on Kubernetes it is downloaded from ngshare
   (:mod:`ngshare`), which names the submitter by their hub token;
2. nbgrader autogrades it in a scratch course, as the unprivileged :data:`layout.GRADER_USER`
   (a learner's notebook is hostile code: it must reach neither the gradebook nor anyone's work),
   and generates the feedback there; the scores go into the instructor's gradebook and the
   feedback is released to that learner (their Assignments tab: Fetch Feedback);
3. for the assessment, the official grading of its ``train.py`` (the sandboxed grader,
   ``multigpu.grading.grader.grade`` with the sandbox required) sets the assessment's points in the
   gradebook, writes the result to ``state/results/<learner>.json`` and, where it passed and the
   released labs are done, issues a signed certificate (``multigpu verify`` checks it).
"""

from __future__ import annotations

import os
import pwd
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable

from multigpu.workshop import course, layout, ngshare
from multigpu.workshop.jobs import Job
from multigpu.workshop.layout import Hub

#: nbgrader's limit per grading step (the labs' cells bound themselves; this is the outer bound).
STEP_TIMEOUT_S = 3600


class JobFailed(RuntimeError):
    """The job cannot finish; the message is for the learner (and the instructor's view)."""


def parse_submission(name: str) -> tuple[str, str, str] | None:
    """``(student, assignment, timestamp)`` of an inbound folder ``student+assignment+timestamp+random``."""
    parts = name.split("+")
    if len(parts) < 3 or not all(parts[:3]):
        return None
    return parts[0], parts[1], parts[2]


def submitter_matches(folder: Path, student: str) -> bool:
    """Whether the inbound folder belongs to the Unix account ``student`` (it made the folder)."""
    try:
        return folder.stat().st_uid == pwd.getpwnam(student).pw_uid
    except KeyError:
        return False


def _chown_tree(path: Path, user: str) -> None:
    pw = pwd.getpwnam(user)
    os.chown(path, pw.pw_uid, pw.pw_gid)
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames + filenames:
            os.chown(os.path.join(dirpath, name), pw.pw_uid, pw.pw_gid, follow_symlinks=False)


def _nbgrader(args: list[str], cwd: Path, *, user: str | None, env: dict[str, str], what: str) -> str:
    """Run ``nbgrader ARGS`` in ``cwd`` (as ``user`` when given) through ``multigpu.running.launch``."""
    from multigpu.running import launch

    argv = [str(Path(sys.executable).parent / "nbgrader"), *args]
    if user:
        pw = pwd.getpwnam(user)
        argv = ["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--clear-groups", "--", *argv]
    proc = launch.start(argv, env=env, cwd=cwd)
    result = launch.supervise([proc], ["nbgrader"], STEP_TIMEOUT_S, echo=False, what=what, raise_on_timeout=False)
    if result.returncodes[0] != 0:
        tail = "\n".join(result.output[-15:])
        raise JobFailed(f"{what} failed (exit {result.returncodes[0]}):\n{tail}")
    return "\n".join(result.output)


def _env(home: Path) -> dict[str, str]:
    bindir = str(Path(sys.executable).parent)
    keep = {k: v for k, v in os.environ.items() if k in ("MULTIGPU_QUICK", "LANG", "LC_ALL")}
    return {**keep, "HOME": str(home), "PATH": os.pathsep.join([bindir, "/usr/local/bin", "/usr/bin", "/bin"]),
            "MULTIGPU_OFFICIAL_GRADING": "1", "JUPYTER_CONFIG_DIR": str(home / ".jupyter"),
            "JUPYTER_RUNTIME_DIR": str(home / ".runtime")}


def submission(job: Job) -> ngshare.Submission:
    return ngshare.Submission(job.student, job.assignment, job.submitted)


def collect(hub: Hub, job: Job) -> Path:
    """Step 1: the submission, checked, in ``course/submitted/<student>/<assignment>/``."""
    from multigpu.grading.rules import RESULT_FILE

    dest = hub.course / "submitted" / job.student / job.assignment
    src = hub.inbound / job.submission
    source = ngshare.Ngshare.from_env()
    if source is None and not src.is_dir():
        raise JobFailed(f"the submission {job.submission} is no longer in the exchange: submit again")
    if source is None and not submitter_matches(src, job.student):
        raise JobFailed(f"this submission carries the name {job.student!r} but was made by another account: not graded")
    if dest.exists():
        shutil.rmtree(dest)
    left_out = (RESULT_FILE, ".ipynb_checkpoints")  # a grading result comes from the grader's own run
    if source is None:
        shutil.copytree(src, dest, ignore=shutil.ignore_patterns(*left_out), symlinks=False)
        return dest
    try:
        source.download(submission(job), dest, skip=left_out)
    except ngshare.NgshareError as e:
        raise JobFailed(f"the submission could not be read from the exchange ({e}): submit again, "
                        "or ask the instructor") from None
    return dest


def autograde(hub: Hub, job: Job, submitted: Path, log: Callable[[str], None]) -> dict[str, Any]:
    """Step 2: autograde and feedback in a scratch course as the grading account; the scores go to
    the instructor's gradebook. Returns ``{"score", "max_score", "notebooks": {nb: [score, max]}}``."""
    scratch = scratch_course(hub, job, submitted)
    env = _env(scratch)
    user = layout.GRADER_USER
    log("registering the assignment")
    _nbgrader(["generate_assignment", job.assignment, "--force"], scratch, user=user, env=env,
              what="nbgrader generate_assignment")
    log("autograding the notebooks (nbgrader runs them as the grading account)")
    _nbgrader(["autograde", job.assignment, "--student", job.student, "--force"], scratch, user=user, env=env,
              what="nbgrader autograde")
    _nbgrader(["generate_feedback", job.assignment, "--student", job.student, "--force"], scratch, user=user, env=env,
              what="nbgrader generate_feedback")
    out = record_scores(hub, job, scratch_scores(scratch, job))
    release_feedback(hub, job, scratch)
    shutil.rmtree(scratch, ignore_errors=True)
    return out


def scratch_course(hub: Hub, job: Job, submitted: Path) -> Path:
    """A course of one assignment and one submission, owned by the grading account alone."""
    scratch = hub.scratch / f"job-{job.id}"
    if scratch.exists():
        shutil.rmtree(scratch)
    (scratch / "source").mkdir(parents=True)
    shutil.copytree(hub.course / "source" / job.assignment, scratch / "source" / job.assignment)
    shutil.copytree(submitted, scratch / "submitted" / job.student / job.assignment)
    (scratch / "nbgrader_config.py").write_text(course.COURSE_CONFIG.format(
        course=str(scratch), course_id=layout.COURSE_ID, db_url=f"sqlite:///{scratch / 'gradebook.db'}",
        exchange=str(scratch / "no-exchange"), assessment=layout.ASSESSMENT))
    _chown_tree(scratch, layout.GRADER_USER)
    os.chmod(scratch, 0o700)
    return scratch


def scratch_scores(scratch: Path, job: Job) -> dict[str, dict[str, float]]:
    """Each notebook's grade cells and the points autograde gave them in the scratch course."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{scratch / 'gradebook.db'}") as gb:
        sub = gb.find_submission(job.assignment, job.student)
        return {nb.name: {g.name: float(g.auto_score or 0) for g in nb.grades} for nb in sub.notebooks}


def record_scores(hub: Hub, job: Job, scores: dict[str, dict[str, float]]) -> dict[str, Any]:
    """The scores into the instructor's gradebook, replacing an earlier submission's."""
    from nbgrader.api import Gradebook, MissingEntry

    from multigpu.workshop import accounts

    with Gradebook(hub.db_url) as gb:
        gb.update_or_create_student(job.student, **accounts.gradebook_names(job.student))
        try:
            gb.find_assignment(job.assignment)
        except MissingEntry:
            raise JobFailed(f"{job.assignment} is not in the instructor's gradebook: it was never released "
                            "from the formgrader") from None
        try:
            gb.remove_submission(job.assignment, job.student)  # a resubmission replaces the earlier one
        except MissingEntry:
            pass
        sub = gb.add_submission(job.assignment, job.student)
        for nb in sub.notebooks:
            for g in nb.grades:
                g.auto_score = scores.get(nb.name, {}).get(g.name, 0.0)
        gb.db.commit()
        sub = gb.find_submission(job.assignment, job.student)
        return {"score": float(sub.score), "max_score": float(sub.max_score),
                "notebooks": {nb.name: [float(nb.score), float(nb.max_score)] for nb in sub.notebooks}}


def release_feedback(hub: Hub, job: Job, scratch: Path) -> None:
    """The autograded copy and its feedback into the instructor's course, released to the learner."""
    instructor = pwd.getpwuid(hub.course.stat().st_uid).pw_name
    for part in ("autograded", "feedback"):
        dest = hub.course / part / job.student / job.assignment
        if dest.exists():
            shutil.rmtree(dest)
        shutil.copytree(scratch / part / job.student / job.assignment, dest)
        _chown_tree(hub.course / part, instructor)
    _chown_tree(hub.course / "submitted" / job.student, instructor)
    for f in hub.course.glob("gradebook.db*"):
        _chown_tree(f, instructor)
    source = ngshare.Ngshare.from_env()
    if source is not None:
        try:
            source.upload_feedback(submission(job), hub.course / "feedback" / job.student / job.assignment)
        except ngshare.NgshareError as e:
            raise JobFailed(f"graded, but the feedback could not be returned through the exchange ({e}): "
                            "ask the instructor") from None
        return
    # as the instructor: nbgrader's exchange wants its feedback folder owned by whoever releases
    # into it, and the formgrader's Release Feedback button runs as the instructor too
    _nbgrader(["release_feedback", job.assignment, "--student", job.student], hub.course, user=instructor,
              env=_env(Path(pwd.getpwnam(instructor).pw_dir)), what="nbgrader release_feedback")


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


def official(hub: Hub, job: Job, submitted: Path, log: Callable[[str], None]) -> dict[str, Any]:
    """Step 3: the sandboxed official grading of the assessment's train.py, its points in the
    gradebook, the result file and, where earned, the certificate."""
    from multigpu.grading import grader, rules
    from multigpu.grading import official as official_grading

    settings = rules.settings()
    script = submitted / "train.py"
    if not script.is_file():
        raise JobFailed("the submission has no train.py: submit the assessment folder with your converted train.py")
    log(f"official grading of train.py (sandboxed, profile '{settings.profile}')")
    try:
        result = official_grading.grade_and_keep(script, f"{job.student}/{layout.ASSESSMENT}/train.py", settings,
                                                 hub.results / f"{job.student}.json", hidden=[hub.root], log=log)
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

    from multigpu.grading import certificates

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
        submitted = collect(hub, job)
        result: dict[str, Any] = {"autograde": autograde(hub, job, submitted, log)}
        auto = result["autograde"]
        message = f"notebooks {auto['score']:g}/{auto['max_score']:g} points; feedback released (Assignments tab: Fetch Feedback)"
        if job.assignment != layout.ASSESSMENT and (hub.results / f"{job.student}.json").is_file():
            result.update(certify(hub, job.student))  # these lab points may complete a passed assessment's certificate
            if result["certificate"]:
                message += "; " + result["certificate_note"]
        if job.assignment == layout.ASSESSMENT:
            result.update(official(hub, job, submitted, log))
            r = result["official"]
            message = (f"assessment {'PASSED' if r['passed'] else 'not passed'}: {r['score']}/{r['max_score']} points "
                       f"from the official grading; {result['certificate_note']}")
    except JobFailed as e:
        return "failed", str(e), {"seconds": round(time.monotonic() - start, 1)}
    result["seconds"] = round(time.monotonic() - start, 1)
    return "done", message, result
