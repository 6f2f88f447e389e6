"""Step 2 of a grading job: nbgrader's autograde and feedback of one submission, as the grading
account, in a sandbox, with no solution within reach of the learner's notebook.

A job's scratch folder (``scratch/job-N``, :func:`run_name`: root's, group the grading account,
710, set before anything is put in it; a file system of its own size for the job's life,
``disks.grading_space``) holds two courses of one assignment, and then the official run's folder:

1. ``gen/`` (root's, 700): the hub course's source of the assignment (solutions and hidden tests)
   and ``nbgrader generate_assignment`` run as root, which registers the assignment in a fresh
   gradebook and writes the learner's version. No learner code runs while it exists, and the
   grading account never can read it; it is removed before step 2.
2. ``course/``: the gradebook ``gen`` made, the learner's version of the assignment as its source
   (what autograde copies besides the notebooks: the starter files) and the submission; made
   root's and filled, then handed to the grading account by descriptor (``safefiles.chown_tree``).

``nbgrader autograde`` and ``generate_feedback`` then run as the grading account inside the
grading sandbox (:func:`multigpu.grading.sandbox.command`: read-only system; the hub's folders,
the signing key's, the checkout's ``solutions/``, root's HOME, ``/tmp`` and ``/run`` hidden; the
course folder the only writable one; loopback only; a PID namespace of its own, so every process
of the step, a learner's ``setsid`` daemon included, dies when the step ends) and in a control
group of their own (``limits``: memory and processes capped, whatever is left killed).

The notebook could edit anything in ``course/`` while it ran (the gradebook there included), so
the scores are recomputed from the autograded notebooks by nbgrader's own rule
(``nbgrader.utils.determine_grade``), each capped at the max score the instructor's gradebook
gives its cell; only the assignment's notebooks and their feedback pages come back to the
instructor's course, each read by descriptor and bounded (:func:`take_back`). The autograded notebooks arrive there defanged (:func:`defang`): the
formgrader shows them to the instructor as HTML on the instructor's own server, where a
learner's script would act as the instructor. The hidden tests themselves run in the learner's kernel (nbgrader's
design) and nbgrader shows them in the feedback: they are a check, not a secret.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from multigpu.workshop import accounts, layout, limits, safefiles
from multigpu.workshop.jobs import Job
from multigpu.workshop.layout import Hub

#: The longest one notebook of an assignment may take to autograde (``MULTIGPU_GRADING_NOTEBOOK_S``):
#: every solution notebook runs in about 5 minutes or less at default parameters on the 2-core reference
#: machine (``make bench``, section ``course``) and a grading has one core (``make hub``'s layout),
#: so 4x the 5 minutes. A notebook that sleeps or loops gives the queue back after this, not an hour.
NOTEBOOK_BUDGET_S = 20 * 60
#: The limit of nbgrader's steps that run no learner code (generate_assignment, generate_feedback,
#: release_feedback).
STEP_TIMEOUT_S = 600
#: The most a notebook may weigh when its scores are read back (outputs included).
MAX_NOTEBOOK_BYTES = safefiles.SUBMISSION.file_bytes
#: The files of a submission, made by nbgrader's submit, that its feedback folder needs too (a date
#: and time, a random hex string), and the most each may weigh.
FEEDBACK_FILES, FEEDBACK_FILE_BYTES = (layout.STAMP_FILE, "submission_secret.txt"), 200
#: The outputs an autograded notebook keeps in the instructor's course: text and raster images.
SAFE_OUTPUTS = ("text/plain", "image/png", "image/jpeg")


class JobFailed(RuntimeError):
    """The job cannot finish; the message is for the learner (and the instructor's view)."""


def env(home: Path) -> dict[str, str]:
    """The environment of an nbgrader step whose HOME is ``home``."""
    bindir = str(Path(sys.executable).parent)
    keep = {k: v for k, v in os.environ.items() if k in ("MULTIGPU_QUICK", "LANG", "LC_ALL")}
    return {**keep, "HOME": str(home), "PATH": os.pathsep.join([bindir, "/usr/local/bin", "/usr/bin", "/bin"]),
            "MULTIGPU_OFFICIAL_GRADING": "1", "JUPYTER_CONFIG_DIR": str(home / ".jupyter"),
            "JUPYTER_RUNTIME_DIR": str(home / ".runtime")}


def hidden_from_learners(hub: Hub) -> list[Path]:
    """What no learner code the hub runs may see, besides what the sandbox always hides: the hub's
    root (course, exchange, state, other gradings), the signing key's folder wherever the
    operator keeps it, and other copies of the course learners could read (``copies.to_hide``)."""
    from multigpu.grading import rules
    from multigpu.workshop import copies

    keys = [rules.course_key_path()] + [Path(p) for p in [os.environ.get("MULTIGPU_CERTIFICATE_KEY")] if p]
    return [hub.root, *(k.expanduser().resolve().parent for k in keys), *copies.to_hide()]


def autograde_budget(assignment: Path) -> float:
    """Seconds ``nbgrader autograde`` may take for the assignment whose notebooks are in ``assignment``:
    :data:`NOTEBOOK_BUDGET_S` (or ``MULTIGPU_GRADING_NOTEBOOK_S``) per notebook."""
    per_notebook = float(os.environ.get("MULTIGPU_GRADING_NOTEBOOK_S") or NOTEBOOK_BUDGET_S)
    return per_notebook * max(1, len(list(assignment.glob("*.ipynb"))))


def run_nbgrader(args: list[str], cwd: Path, *, what: str, user: str | None = None, home: Path | None = None,
                 sandbox_hidden: list[Path] | None = None, group: str | None = None,
                 timeout: float = STEP_TIMEOUT_S) -> str:
    """``nbgrader ARGS`` in ``cwd`` (HOME ``home``, else ``cwd``) through ``multigpu.running.launch``:
    as root, as ``user``, or, with ``sandbox_hidden``, as ``user`` inside the grading sandbox with
    ``cwd`` its one writable folder; in the control group ``group`` (killed and removed when the
    step ends). A step still running after ``timeout`` seconds is killed, every process of it, and
    fails the job with that limit in its message."""
    from multigpu.grading import sandbox
    from multigpu.running import launch

    argv = [str(Path(sys.executable).parent / "nbgrader"), *args]
    if sandbox_hidden is not None:
        argv = sandbox.command(argv, workdir=cwd, hidden=sandbox_hidden, user=user)
    elif user:
        pw = pwd.getpwnam(user)
        argv = ["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--clear-groups", "--", *argv]
    confine = None
    if group is not None:
        pids, memory = limits.grading_limits()

        def confine() -> None:  # in the child, before nbgrader (or bubblewrap) starts
            limits.confine(group, os.getpid(), cores=sorted(os.sched_getaffinity(0)), mem_limit=memory,
                           pids_limit=pids)

    with sandbox.fresh_keyrings(user) if sandbox_hidden is not None else contextlib.nullcontext():
        proc = launch.start(argv, env=env(home or cwd), cwd=cwd, before_exec=confine)
        try:
            result = launch.supervise([proc], ["nbgrader"], timeout, echo=False, what=what, raise_on_timeout=False)
        finally:
            if group is not None:
                limits.release(group)
    if result.timed_out:
        limit = f"{timeout / 60:.0f} min" if timeout >= 120 else f"{timeout:.0f} s"
        raise JobFailed(f"{what} was stopped after {limit}, its limit (a solution notebook runs "
                        "in about 5 min or less): this submission scores nothing. A cell that waits or loops without end "
                        "is the usual cause.")
    if result.returncodes[0] != 0:
        tail = "\n".join(result.output[-15:])
        raise JobFailed(f"{what} failed (exit {result.returncodes[0]}):\n{tail}")
    return "\n".join(result.output)


def run_suffix() -> str:
    """``-slurmM`` in Slurm job M, else "": the same job may be graded again in another Slurm job
    while the first, on a node given up for failed, still runs."""
    slurm = os.environ.get("SLURM_JOB_ID")
    return f"-slurm{slurm}" if slurm and slurm.isdigit() else ""


def run_name(job: Job) -> str:
    """The name of this grading of ``job``, unique among the gradings that may run at once on one
    machine: ``job-N``, and ``job-N-slurmM`` in Slurm job M (:func:`run_suffix`)."""
    return f"job-{job.id}{run_suffix()}"


def scratch_course(hub: Hub, job: Job, submitted: Path) -> Path:
    """``scratch/<run_name>/course`` (module doc), ready for the grading account; ``gen/`` is gone."""
    from multigpu.workshop import course

    grader = pwd.getpwnam(layout.GRADER_USER)
    folder = hub.scratch / run_name(job)  # the job's own file system (``disks.grading_space``)
    st = folder.lstat()
    if not stat.S_ISDIR(st.st_mode) or (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) != (0, grader.pw_gid, 0o710):
        raise JobFailed(f"{folder} is not the grading's folder (root's, group {layout.GRADER_USER}, 710)")
    for leftover in ("gen", "course"):
        shutil.rmtree(folder / leftover, ignore_errors=True)

    def config(root: Path) -> None:
        (root / "nbgrader_config.py").write_text(course.COURSE_CONFIG.format(
            course=str(root), course_id=layout.COURSE_ID, db_url=f"sqlite:///{root / 'gradebook.db'}",
            exchange=str(root / "no-exchange"), assessment=layout.ASSESSMENT))

    gen = safefiles.private_dir(folder / "gen", 0, 0, 0o700)
    config(gen)
    shutil.copytree(hub.course / "source" / job.assignment, gen / "source" / job.assignment)
    run_nbgrader(["generate_assignment", job.assignment, "--force"], gen, what="nbgrader generate_assignment")
    scratch = safefiles.private_dir(folder / "course", 0, 0, 0o700)
    config(scratch)
    shutil.copyfile(gen / "gradebook.db", scratch / "gradebook.db")
    shutil.copytree(gen / "release" / job.assignment, scratch / "source" / job.assignment)
    shutil.rmtree(gen)
    (scratch / "submitted" / job.student).mkdir(parents=True)
    safefiles.copy_tree(submitted, scratch / "submitted" / job.student / job.assignment, owner=None,
                        caps=safefiles.SUBMISSION)
    safefiles.chown_tree(scratch, grader.pw_uid, grader.pw_gid)
    return scratch


def autograde(hub: Hub, job: Job, submitted: Path, log: Callable[[str], None]) -> dict[str, Any]:
    """Step 2 (module doc); the scores go to the instructor's gradebook and the feedback to the
    learner. Returns ``{"score", "max_score", "notebooks": {nb: [score, max]}}``."""
    log("registering the assignment")
    scratch = scratch_course(hub, job, submitted)
    hidden = hidden_from_learners(hub)

    def sandboxed(verb: str, timeout: float) -> None:
        run_nbgrader([verb, job.assignment, "--student", job.student, "--force"], scratch, what=f"nbgrader {verb}",
                     user=layout.GRADER_USER, sandbox_hidden=hidden, group=f"autograde-{hub.tag}-{run_name(job)}",
                     timeout=timeout)

    try:
        log("autograding the notebooks (nbgrader runs them as the grading account, sandboxed)")
        sandboxed("autograde", autograde_budget(scratch / "source" / job.assignment))
        sandboxed("generate_feedback", STEP_TIMEOUT_S)
        take_back(hub, job, scratch, submitted)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    out = record_scores(hub, job, notebook_scores(hub.course / "autograded" / job.student / job.assignment))
    release_feedback(hub, job)
    return out


def take_back(hub: Hub, job: Job, scratch: Path, submitted: Path) -> None:
    """Into the instructor's course: the autograded notebooks of the assignment and their feedback
    pages, from the scratch course (the grading account's, written while learner code ran) by
    descriptor, each at most :data:`MAX_NOTEBOOK_BYTES`, the notebooks defanged. Beside them the
    submission's other files as the hub took them (``submitted``: the formgrader shows a notebook's
    images from there), and beside the pages the submission's :data:`FEEDBACK_FILES` (nbgrader's
    ``release_feedback`` reads them). Nothing else the notebook wrote while it ran comes back."""
    notebooks = sorted(p.name for p in (hub.course / "source" / job.assignment).glob("*.ipynb"))
    for part, names in (("autograded", notebooks), ("feedback", [f"{Path(nb).stem}.html" for nb in notebooks])):
        dest = hub.course / part / job.student / job.assignment
        dest.parent.mkdir(parents=True, exist_ok=True)
        if dest.exists():
            shutil.rmtree(dest)
        taken = {}
        try:
            os.close(safefiles.open_dir(scratch, part, job.student, job.assignment))
            for name in names:
                with contextlib.suppress(FileNotFoundError):  # a notebook the learner did not submit
                    taken[name] = safefiles.read_file(scratch, part, job.student, job.assignment, name,
                                                      max_bytes=MAX_NOTEBOOK_BYTES)
            if part == "feedback":
                for name in FEEDBACK_FILES:
                    with contextlib.suppress(FileNotFoundError):
                        taken[name] = safefiles.read_file(submitted, name, max_bytes=FEEDBACK_FILE_BYTES)
        except (OSError, ValueError) as e:
            raise JobFailed(f"the {part} notebooks could not be taken back from the grading ({e}): "
                            "your notebook may have changed the grading's own files; ask the instructor") from None
        if part == "autograded":
            safefiles.copy_tree(submitted, dest, owner=None, caps=safefiles.SUBMISSION, skip=notebooks)
        else:
            dest.mkdir(mode=0o700)
        for name, data in taken.items():
            (dest / name).write_bytes(defang(data).encode() if part == "autograded" else data)


def defang(raw: bytes) -> str:
    """A learner's notebook as the instructor's tools may render it (nbgrader's formgrader turns it
    into HTML on the instructor's server): outputs keep only text and raster images (no HTML,
    JavaScript, SVG, widgets), markdown and raw cells show their HTML as text, no widget state.
    What grading reads is kept: stream and error outputs, a result's text. A notebook that does
    not read becomes an empty one."""
    import html

    import nbformat

    try:
        nb = nbformat.reads(raw.decode(), as_version=4)
    except (ValueError, UnicodeDecodeError, AttributeError, KeyError, TypeError):
        return nbformat.writes(nbformat.v4.new_notebook())
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        if cell.cell_type in ("markdown", "raw"):
            cell.source = html.escape(cell.source, quote=False)
            cell.pop("attachments", None)
        for out in cell.get("outputs", []):
            if "data" in out:
                out["data"] = {k: v for k, v in out["data"].items() if k in SAFE_OUTPUTS}
    return nbformat.writes(nb)


def notebook_scores(folder: Path) -> dict[str, dict[str, float]]:
    """``{notebook: {grade_id: points}}`` of the autograded notebooks in ``folder``, by nbgrader's
    rule (an error in a test cell's output: 0; else its points; a number it returns: partial
    points); the first cell of each grade id counts, a notebook that does not read scores nothing."""
    import nbformat
    from nbgrader import utils

    out: dict[str, dict[str, float]] = {}
    for path in sorted(folder.glob("*.ipynb")):
        grades: dict[str, float] = {}
        try:
            nb = nbformat.reads(safefiles.read_file(folder, path.name, max_bytes=MAX_NOTEBOOK_BYTES).decode(),
                                as_version=4)
            for cell in nb.cells:
                if utils.is_grade(cell) and cell.metadata.nbgrader.get("grade_id") not in grades:
                    try:
                        score = utils.determine_grade(cell)[0]
                    except (ValueError, TypeError, KeyError, AttributeError):
                        score = 0.0
                    grades[cell.metadata.nbgrader["grade_id"]] = float(score or 0.0)
        except (ValueError, UnicodeDecodeError, AttributeError, KeyError, TypeError, OSError):
            grades = {}
        out[path.stem] = grades
    return out


def record_scores(hub: Hub, job: Job, scores: dict[str, dict[str, float]]) -> dict[str, Any]:
    """The scores into the instructor's gradebook, each within 0 and its cell's max score there,
    replacing an earlier submission's. The assessment's are 0: its tests ran in the learner's
    kernel, and its points are the official grading's alone (``grading.official`` sets them; a
    submission whose official grading did not finish keeps none)."""
    from nbgrader.api import Gradebook, MissingEntry

    if job.assignment == layout.ASSESSMENT:
        scores = {}

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
                g.auto_score = min(max(scores.get(nb.name, {}).get(g.name, 0.0), 0.0), float(g.max_score))
        gb.db.commit()
        sub = gb.find_submission(job.assignment, job.student)
        return {"score": float(sub.score), "max_score": float(sub.max_score),
                "notebooks": {nb.name: [float(nb.score), float(nb.max_score)] for nb in sub.notebooks}}


def release_feedback(hub: Hub, job: Job) -> None:
    """Hand the learner's new parts of the course to the instructor and release the feedback to
    the learner (nbgrader's exchange, or ngshare on Kubernetes)."""
    from multigpu.workshop import ngshare

    instructor = pwd.getpwuid(hub.course.stat().st_uid)
    for part in ("autograded", "feedback", "submitted"):
        os.chown(hub.course / part, instructor.pw_uid, instructor.pw_gid, follow_symlinks=False)
        safefiles.chown_tree(hub.course / part / job.student, instructor.pw_uid, instructor.pw_gid)
    for f in hub.course.glob("gradebook.db*"):
        os.chown(f, instructor.pw_uid, instructor.pw_gid, follow_symlinks=False)
    source = ngshare.Ngshare.from_env()
    if source is not None:
        try:
            source.upload_feedback(ngshare.Submission(job.student, job.assignment, job.submitted),
                                   hub.course / "feedback" / job.student / job.assignment)
        except ngshare.NgshareError as e:
            raise JobFailed(f"graded, but the feedback could not be returned through the exchange ({e}): "
                            "ask the instructor") from None
        return
    # as the instructor: nbgrader's exchange wants its feedback folder owned by whoever releases
    # into it, and the formgrader's Release Feedback button runs as the instructor too
    run_nbgrader(["release_feedback", job.assignment, "--student", job.student], hub.course,
                 user=instructor.pw_name, home=Path(instructor.pw_dir), what="nbgrader release_feedback")
